"""The start-up check of the whole configuration (agent/cmd/config_check/).

values.py holds the check; it imports the agent's config, errors, RPC
versions, metrics and tree policy, and the libraries whose options it
reads, never the daemon.
"""
