"""Reserved until healed, as the update loop applies it: the usages the
rule needs (compute_agent/heal/rules.py), read from Placement only when the model
takes a class off one of our providers, through the agent's one view of
allocations (compute_agent/placement/allocations.py): read again only once that
provider's generation moves, a claim touches it, or the refresh interval
passes.

Placement moves a provider's generation whenever allocations are written
on it, not when they are deleted: so a usage read earlier can only be too
high, never too low, and a provider too high is held a little longer,
never offered twice.
"""
from __future__ import annotations

import logging

from compute_agent.heal import rules
from compute_agent.placement.allocations import AllocationView
from compute_agent.tree.provider_tree import ProviderTree

LOG = logging.getLogger(__name__)


class UnhealedHold:
    def __init__(self, allocations: AllocationView):
        self.allocations = allocations
        self._unhealed: frozenset[rules.Stranded] = frozenset()

    def hold(self, current: ProviderTree, model: ProviderTree,
             owned: rules.Owned) -> ProviderTree:
        """``model`` as the rule lets it be reported now."""
        usages = {uuid: self.allocations.usages(uuid, current[uuid].generation)
                  for uuid in rules.moving(current, model, owned)}
        held = rules.hold_unhealed(current, model, usages, owned)
        self._log_change(frozenset(held.stranded))
        return held.tree

    def _log_change(self, found: frozenset[rules.Stranded]) -> None:
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
