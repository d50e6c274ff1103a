"""The store: the SQLite store of instances, assignments and migrations,
its group-commit writer, the state directory's lock, the start-up check,
the rebuild of a lost store, the adoption of a nova-compute host, the node
identity."""
