"""Helpers shared by the agent and the drivers: host syntaxes (CPU lists,
PCI addresses) that both read, here so that the drivers never import the
agent for them."""
