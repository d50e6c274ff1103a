"""The store's errors. None crosses RPC: the RPC server answers a failing
store as compute_agent.exception.StoreUnavailable."""
from __future__ import annotations

from compute_agent.exception import AgentError


class StoreError(AgentError):
    """The store could not be opened or written."""


class StateDirectoryInUse(AgentError):
    """Another process holds the state directory's lock."""


class StateDirectoryUnusable(AgentError):
    """The state directory or its lock file cannot be made or opened."""


class StoreRefused(AgentError):
    """The store cannot be served from; the message is the one line."""


class RebuildRefused(AgentError):
    """What cannot be rebuilt, one problem a line; nothing was written."""

    def __init__(self, problems: list[str]):
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join(self.problems)


class AdoptionRefused(RebuildRefused):
    """What cannot be adopted, one problem a line; nothing was written."""


class StoreMoved(StoreError):
    """The store is no longer the file at its path (removed or replaced
    under the running agent): nothing more is acknowledged."""
