"""The daemon's errors."""
from __future__ import annotations

from compute_agent.exception import AgentError


class RecordUnreadable(AgentError):
    """The file is there but is not a cycle record; the message names it."""


class AnotherAgentServesHost(AgentError):
    """Another agent already serves this [DEFAULT] host
    (compute_agent/daemon/one_agent.py): the message is the one line; the daemon
    exits 2, an operator must act."""
