"""For tests and tools, never for the agent: a real Placement served
locally, and a proxy that injects faults in front of it. It and the agent
never import each other."""
