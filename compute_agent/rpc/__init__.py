"""RPC: the server conductors call, the client they use (and its calls
outstanding, for a watchdog), the payload schemas, the version ledger, the
broker as a dependency, the heartbeat, and the broker permissions of one
host's user."""
