"""The daemon: the agent process (the update loop, reconciliation, heal
at start), its supervisor, systemd's notify protocol, the reload signal and
the cycle's record."""
