"""The drivers: what the host has and what its guests hold, read from the
hypervisor and sysfs (base: the dataclasses; driver: the interface; fake:
the one for tests; libvirt: the real one). They never import the agent."""
