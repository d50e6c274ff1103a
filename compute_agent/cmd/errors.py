"""The commands' errors."""
from __future__ import annotations

from compute_agent.exception import AgentError


class SpecFileError(AgentError):
    """The --spec file cannot be read or lacks a field; nothing was sent."""


# Also a ValueError: a rule's verdict is a bad value, as oslo.config's own
# type checks say it, to whoever calls a rule directly.
class BadValue(AgentError, ValueError):
    """A rule's verdict on one value: the reason, without the value."""
