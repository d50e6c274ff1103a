"""Operator reports: what 'compute-agent-manage status' and 'tree' conclude
(pure rules) and the probes that read their facts beside a running agent."""
