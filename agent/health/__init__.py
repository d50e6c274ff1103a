"""Device health: the pure rules (which watched devices are bad and what
that does to the tree) and the watch thread that reads the signals from
the driver. Imports tree, claims and the base."""
