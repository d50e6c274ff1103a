"""The reconciliation's one-consumer operations on Placement (Consumers):
only allocations wholly on our providers are changed, and the providers
freed are read again, with a fake Placement client that keeps consumers'
allocations in memory."""
from __future__ import annotations

import pytest

from compute_agent.exception import AgentError, PlacementUnavailable
from compute_agent.placement.allocations import AllocationView
from compute_agent.placement.consumers import Consumers

OURS = frozenset({"root", "cell"})
INSTANCE, MIGRATION = "instance", "migration"


class FakeClient:
    """Consumers' allocations (consumer -> provider -> class -> amount)."""

    def __init__(self, held: dict[str, dict[str, dict[str, int]]]):
        self.held = held
        self.generations = {consumer: 1 for consumer in held}
        self.down = False

    def get_consumer_allocations(self, consumer: str) -> dict:
        if self.down:
            raise PlacementUnavailable("http://placement", "did not answer (down)")
        return {"allocations": {rp: {"resources": dict(resources)} for rp, resources
                                in self.held.get(consumer, {}).items()},
                "project_id": "p", "user_id": "u",
                "consumer_generation": self.generations.get(consumer)}

    def delete_consumer_allocations(self, consumer: str) -> None:
        del self.held[consumer]

    def post_allocations(self, body: dict) -> None:
        for consumer, doc in body.items():
            self.held[consumer] = {rp: a["resources"] for rp, a in doc["allocations"].items()}
            if not self.held[consumer]:
                del self.held[consumer]


class TouchedView(AllocationView):
    def __init__(self, client: FakeClient):
        super().__init__(client, refresh_interval=60)
        self.touched: set[str] = set()

    def touch(self, providers: set[str]) -> None:
        self.touched |= providers


def consumers_of(held: dict) -> tuple[Consumers, FakeClient, TouchedView]:
    client = FakeClient(held)
    view = TouchedView(client)
    return Consumers(client, view), client, view


def test_providers_elsewhere_are_those_not_ours_for_each_consumer():
    consumers, _, _ = consumers_of({INSTANCE: {"other-root": {"VCPU": 2}, "cell": {"VCPU": 1}},
                                    "gone": {}})
    assert consumers.providers_elsewhere({INSTANCE, "gone"}, OURS) == {
        INSTANCE: {"other-root"}, "gone": set()}


def test_providers_elsewhere_raise_when_placement_does_not_answer():
    consumers, client, _ = consumers_of({})
    client.down = True
    with pytest.raises(PlacementUnavailable):
        consumers.providers_elsewhere({INSTANCE}, OURS)


def test_a_hold_wholly_on_our_providers_is_dropped_and_they_are_read_again():
    consumers, client, view = consumers_of({MIGRATION: {"root": {"VCPU": 2}}})
    assert consumers.drop_if_ours(MIGRATION, OURS)
    assert client.held == {}
    assert view.touched == {"root"}


@pytest.mark.parametrize("held", [{}, {MIGRATION: {"root": {"VCPU": 2},
                                                   "other-root": {"VCPU": 2}}}])
def test_a_hold_not_wholly_ours_or_none_is_left(held):
    consumers, client, view = consumers_of(dict(held))
    assert not consumers.drop_if_ours(MIGRATION, OURS)
    assert client.held == held
    assert view.touched == set()


def test_a_migrations_allocations_on_our_providers_go_back_to_its_instance():
    consumers, client, view = consumers_of({MIGRATION: {"cell": {"VCPU": 2}}})
    consumers.give_back(MIGRATION, INSTANCE, OURS)
    assert client.held == {INSTANCE: {"cell": {"VCPU": 2}}}
    assert view.touched == {"cell"}


def test_a_migration_holding_nothing_gives_nothing_back():
    consumers, client, view = consumers_of({})
    consumers.give_back(MIGRATION, INSTANCE, OURS)
    assert client.held == {}
    assert view.touched == set()


def test_a_migrations_allocations_on_another_host_are_left_to_the_conductor():
    held = {MIGRATION: {"cell": {"VCPU": 2}, "other-root": {"VCPU": 2}}}
    consumers, client, view = consumers_of(dict(held))
    with pytest.raises(AgentError, match="left to the conductor"):
        consumers.give_back(MIGRATION, INSTANCE, OURS)
    assert client.held == held
    assert view.touched == set()
