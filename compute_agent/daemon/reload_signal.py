"""SIGHUP, which asks the agent to drop its Placement cache.

Standard library only: compute_agent/cmd/agent.py installs this handler before it
imports the daemon's modules, since a SIGHUP can come as soon as the process
exists and its default action ends the process."""
from __future__ import annotations

import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compute_agent.daemon.service import Agent


class ReloadSignal:
    """SIGHUP asks the agent to drop its Placement cache. One that comes
    before the agent exists is noted and handed to the agent once it does."""

    def __init__(self) -> None:
        self._agent: Agent | None = None
        self._early = False

    def install(self) -> None:
        signal.signal(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self, signum, frame) -> None:
        if self._agent is None:
            self._early = True
        else:
            self._agent.drop_cache()

    def deliver_to(self, agent: Agent) -> bool:
        """From now on SIGHUP drops ``agent``'s cache; one that came
        earlier drops it now, and the answer is True."""
        self._agent = agent
        if not self._early:
            return False
        self._early = False
        agent.drop_cache()
        return True
