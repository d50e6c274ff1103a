"""Version 4: the host's own resources (DISK_GB; CPUs and memory of a host
without NUMA providers) get a kind of their own. Versions 1-3 recorded
them as kind 'numa' with device 'host'. Like 'numa', many live rows share
the device."""

STATEMENTS = [
    "DROP INDEX assignments_one_live_holder",
    "UPDATE assignments SET kind = 'host_resources' WHERE kind = 'numa' AND device_id = 'host'",
    # A device is one device whatever provider or class it was claimed
    # under (compute_agent/claims/choice.py device_identity): a PCI address
    # whole or as a VF.
    """CREATE UNIQUE INDEX assignments_one_live_holder
    ON assignments (CASE WHEN kind IN ('pci', 'vf') THEN 'pci' ELSE kind END, device_id)
    WHERE state != 'released' AND kind NOT IN ('numa', 'host_resources')""",
]
