"""Heal: the pure rules (reserved until healed, the heal plan), the hold
the update loop applies, the store's realignment after a reshape, and the
run ('compute-agent-manage heal', [heal] on_startup), which takes the agent
as a protocol: the daemon comes after heal."""
