"""Heal: the pure rules (reserved until healed, the heal plan), the hold
the update loop applies, the store's realignment after a reshape, and the
run ('compute-agent-manage heal', [heal] on_startup). Imports compute,
placement and everything before them; never the daemon (the run takes the
agent as a protocol)."""
