"""Helpers shared by the agent and the drivers: host syntaxes (CPU lists,
PCI addresses) that both read. Imports nothing else of compute_agent, so
the drivers and the agent never need to import each other for them."""
