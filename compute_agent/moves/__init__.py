"""Moves, pure: the rules both ends of a move share: the evacuation's
names, requests and retries, and which devices a live migration can
carry."""
