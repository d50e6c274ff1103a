"""Operator reports: what 'compute-agent-manage status' and 'tree' conclude
(pure rules) and their runner, which reads their facts beside a running
agent."""
