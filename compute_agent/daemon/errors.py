"""The daemon's errors."""
from __future__ import annotations

from compute_agent.exception import AgentError


class RecordUnreadable(AgentError):
    """The file is there but is not a cycle record; the message names it."""


class AnotherAgentServesHost(AgentError):
    """Another agent already serves this [DEFAULT] host
    (compute_agent/daemon/one_agent.py): the message is the one line; the daemon
    exits 2, an operator must act."""


class StateOfAnotherHost(AnotherAgentServesHost):
    """The state directory belongs to another host name than [DEFAULT] host
    (compute_agent/daemon/renamed_host.py): refused as another agent is, the
    message the one line; the daemon exits 2, an operator must act."""
