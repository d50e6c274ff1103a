"""The daemon's errors."""
from __future__ import annotations

from agent.exception import AgentError


class RecordUnreadable(AgentError):
    """The file is there but is not a cycle record; the message names it."""
