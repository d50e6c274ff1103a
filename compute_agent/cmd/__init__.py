"""The console entry points (compute-agent, compute-agent-manage,
compute-agent-ctl) and what they share: loading and checking the config,
help and exit codes."""
