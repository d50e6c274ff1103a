"""The daemon: the agent process (its composition from the config, the
update loop, reconciliation, heal at start), its supervisor, systemd's
notify protocol, the reload signal and the cycle's record."""
