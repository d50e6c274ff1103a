"""Placement: the client (one method per call), its keystoneauth plugin,
the cycle's sync of our tree, and allocations (read with one generation
cache, read whole for a tree, moved by the swap). The sync takes the heal
rule's hold as a callable: heal comes after placement."""
