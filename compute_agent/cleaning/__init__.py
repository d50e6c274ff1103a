"""One-time-use devices: what a used device does to the tree (pure rules)
and the cleaner that runs each device's cleaning command after its
release."""
