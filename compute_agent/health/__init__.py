"""Device health: the pure rules (which watched devices are bad and what
that does to the tree) and the watch thread that reads the signals from
the driver; the VFs a reboot took, restored before the first cycle and
kept reserved while they are not back."""
