"""Heal's errors."""
from __future__ import annotations

from compute_agent.exception import AgentError


class HealRefused(AgentError):
    """Heal cannot move a consumer's allocations; nothing was changed."""

    def __init__(self, consumer_uuid: str, reason: str):
        super().__init__(consumer_uuid, reason)
        self.consumer_uuid = consumer_uuid
        self.reason = reason

    def __str__(self) -> str:
        return f"consumer {self.consumer_uuid}: {self.reason}"
