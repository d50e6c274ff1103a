"""The provider tree: its pure model and diff, the tree built from a host
inventory, what of it we own, the PCI allowlist, the CPU traits, and the
operator's policy read from the config."""
