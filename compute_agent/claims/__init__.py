"""Claims, pure: the claim model (who holds a device, the moves that pass
devices between holders, their closed sets of values) and device choice
(what can be assigned behind each provider, and which device a claim gets)."""
