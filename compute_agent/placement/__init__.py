"""Placement: the client (one method per call), its keystoneauth plugin,
the cycle's sync of our tree, and allocations (read with one generation
cache, read whole for a tree, moved by the swap). Imports store, tree,
claims, metrics and the base; never heal (the sync takes the heal rule's
hold as a callable)."""
