"""The conductor's errors, raised in its own process before or instead of
a call to an agent."""
from __future__ import annotations

from compute_agent.exception import AgentError


class NoSuchHost(AgentError):
    def __init__(self, host: str):
        super().__init__(host)

    def __str__(self) -> str:
        return f"SOURCE: no compute host named {self.args[0]!r} in Placement"


class LiveMigrationNotPossible(AgentError):
    """Found before anything was asked of an agent; nothing changed."""

    def __init__(self, field: str, value: str, reason: str):
        super().__init__(field, value, reason)

    def __str__(self) -> str:
        field, value, reason = self.args
        return f"{field}: {value} {reason}"
