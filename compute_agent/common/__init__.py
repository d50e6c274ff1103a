"""Helpers shared by the agent and the drivers: host syntaxes (CPU lists,
PCI addresses) that both read. Imports neither ``agent`` nor ``drivers``,
so those two never need to import each other for them."""
