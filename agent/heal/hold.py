"""Reserved until healed, as the update loop applies it: the usages the
rule needs (agent/heal/rules.py), read from Placement only when the model takes a
class off one of our providers, and then only again once that provider's
generation moves or ``refresh_seconds`` pass.

Placement moves a provider's generation whenever allocations are written
on it, not when they are deleted: so a usage read earlier can only be too
high, never too low, and a provider too high is held a little longer,
never offered twice.
"""
from __future__ import annotations

import logging
import time

from agent.heal import rules as heal
from agent.placement.client import PlacementClient
from agent.tree.provider_tree import ProviderTree

LOG = logging.getLogger(__name__)


class UnhealedHold:
    def __init__(self, client: PlacementClient, refresh_seconds: float = 300):
        self.client = client
        self.refresh_seconds = refresh_seconds
        # provider uuid -> (generation, monotonic time read, usages)
        self._usages: dict[str, tuple[int, float, dict[str, int]]] = {}
        self._unhealed: frozenset[heal.Stranded] = frozenset()

    def _usages_of(self, uuid: str, generation: int | None) -> dict[str, int]:
        seen = self._usages.get(uuid)
        if (seen is not None and seen[0] == generation
                and time.monotonic() - seen[1] < self.refresh_seconds):
            return seen[2]
        read_generation, usages = self.client.get_usages(uuid)
        self._usages[uuid] = (read_generation, time.monotonic(), usages)
        return usages

    def hold(self, current: ProviderTree, model: ProviderTree,
             owned: heal.Owned) -> ProviderTree:
        """``model`` as the rule lets it be reported now."""
        usages = {uuid: self._usages_of(uuid, current.get(uuid).generation)
                  for uuid in heal.moving(current, model, owned)}
        held = heal.hold_unhealed(current, model, usages, owned)
        self._log_change(frozenset(held.stranded))
        return held.tree

    def _log_change(self, found: frozenset[heal.Stranded]) -> None:
        """Said once when it starts and once when it ends: an unhealed host
        does not repeat itself every cycle."""
        if found == self._unhealed:
            return
        if found:
            LOG.warning(
                "Host unhealed for %s: consumers still hold %s; the new "
                "providers of these classes stay fully reserved until "
                "'compute-agent-manage heal' moves the allocations",
                ", ".join(sorted({s.resource_class for s in found})),
                "; ".join(f"{s.used} {s.resource_class} on {s.provider_name}"
                          for s in sorted(found, key=lambda s: (s.provider_name,
                                                                s.resource_class))))
        else:
            LOG.info("Host healed: the provider tree is the model's")
        self._unhealed = found
