"""RPC: the server conductors call, the client they use (and its calls
outstanding, for a watchdog), the payload schemas, the version ledger, the
broker as a dependency and the heartbeat.
Imports store, tree, claims, placement and the base; never the conductor's
side or the daemon."""
