"""One consumer's allocations at a time, as the update loop's
reconciliation acts on them (compute_agent/compute/reconcile.py): where an
instance of ours holds its allocations when none are on our providers (an
evacuation away from this host), an evacuation's hold on our providers
dropped once its guest here is gone, and a live migration's allocations
given back to its instance when its conductor left it announced.

Only allocations wholly on our providers (``ours``: their uuids, as the
last read of our tree has them) are changed: the others are another
host's to settle. Every change touches the AllocationView on the
providers it freed, since a deletion moves no generation there.
"""
from __future__ import annotations

from collections.abc import Iterable, Set

from compute_agent.exception import AgentError
from compute_agent.placement.allocations import AllocationView, move_allocations
from compute_agent.placement.client import PlacementClient


class Consumers:
    def __init__(self, client: PlacementClient, view: AllocationView):
        self.client = client
        self.view = view

    def providers_elsewhere(self, consumers: Iterable[str], ours: Set[str]
                            ) -> dict[str, set[str]]:
        """For each consumer, the providers (not ours) that hold its
        allocations: one read each. Raises PlacementUnavailable or
        PlacementError when one cannot be read."""
        return {uuid: set(self.client.get_consumer_allocations(uuid)["allocations"]) - ours
                for uuid in sorted(consumers)}

    def drop_if_ours(self, consumer: str, ours: Set[str]) -> bool:
        """Delete ``consumer``'s allocations when it holds some and all are
        on our providers; whether it did."""
        held = self.client.get_consumer_allocations(consumer)["allocations"]
        if not held or not set(held) <= ours:
            return False
        self.client.delete_consumer_allocations(consumer)
        self.view.touch(set(held))
        return True

    def give_back(self, migration: str, instance: str, ours: Set[str]) -> None:
        """The migration's allocations, when all on our providers, moved
        back to its instance (undoing the conductor's swap); nothing when
        it holds none. AgentError when some are on another host's."""
        held = self.client.get_consumer_allocations(migration)["allocations"]
        if held and not set(held) <= ours:
            raise AgentError(f"migration {migration} holds allocations on providers "
                             "of another host; left to the conductor")
        if held:
            move_allocations(self.client, migration, instance, "INSTANCE")
            self.view.touch(set(held))
