"""The store: the SQLite store of instances, assignments and migrations,
its schema and one migration step a version, its group-commit writer and
the guard of each commit, the state directory's lock, what is on disk and
the start-up check of it, accept-store, the rebuild of a lost store, the
adoption of a nova-compute host, the node identity."""
