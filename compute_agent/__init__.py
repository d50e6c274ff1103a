"""The compute agent. Its packages, from the pure core up to the entry
points (a module imports only from its own package or those before it).
This is the one place the order is written: tests/unit/test_layering.py
reads it from here and holds the code and docs/architecture.md to it.

    common -> drivers                            (they never import the agent)
    dependencies, exception, messaging, config   (modules: the base)
    claims -> tree -> store -> metrics -> placement -> moves -> compute
    -> heal -> health -> cleaning -> rpc -> conductor -> rpcapi -> daemon
    -> reports -> cmd

compute_agent.testing (a local Placement, a fault proxy) stands apart: for
tests and tools only. docs/architecture.md says what each package holds."""
