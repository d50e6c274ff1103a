"""AllocationView's rule for when a provider's allocations are read again,
for the consumers the update loop reconciles and the usages the heal rule
holds by, with a fake Placement client that counts the reads."""
from __future__ import annotations

import pytest

from compute_agent.exception import PlacementUnavailable
from compute_agent.placement.allocations import (
    AllocationView,
    ProviderRead,
    needs_reading,
    restored_read_times,
)

ROOT, CELL, GPU = "root", "cell", "gpu"


class FakeClient:
    def __init__(self):
        self.allocations: dict[str, dict[str, dict]] = {ROOT: {}, CELL: {}}
        self.reads: list[str] = []
        self.down = False

    def get_provider_allocations(self, uuid: str) -> dict[str, dict]:
        if self.down:
            raise PlacementUnavailable("http://placement", "did not answer (down)")
        self.reads.append(uuid)
        return self.allocations[uuid]


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup():
    client, clock = FakeClient(), Clock()
    view = AllocationView(client, refresh_interval=60, clock=clock)
    view.consumers({ROOT: 1, CELL: 1}, ROOT)
    client.reads.clear()
    return view, client, clock


@pytest.mark.parametrize("last, generation, touched, now, expected", [
    (None, 1, False, 0.0, True),
    (ProviderRead(1, {}, 0.0), 1, False, 59.9, False),
    (ProviderRead(1, {}, 0.0), 2, False, 1.0, True),
    (ProviderRead(1, {}, 0.0), 1, True, 1.0, True),
    (ProviderRead(1, {}, 0.0), 1, False, 60.0, False),
    (ProviderRead(1, {"c1": {"VGPU": 1}}, 0.0), 1, False, 59.9, False),
    (ProviderRead(1, {"c1": {"VGPU": 1}}, 0.0), 1, False, 60.0, True),
])
def test_needs_reading(last, generation, touched, now, expected):
    assert needs_reading(last, generation, touched, now, 60) is expected


def test_a_view_without_our_root_is_unknown_not_empty(setup):
    view, client, _ = setup
    assert view.consumers({CELL: 1}, ROOT) is None
    assert client.reads == []


def test_unchanged_providers_are_not_read_again(setup):
    view, client, _ = setup
    client.allocations[CELL] = {"c1": {"resources": {"VGPU": 1}}}
    assert view.consumers({ROOT: 1, CELL: 1}, ROOT) == {}
    assert client.reads == []


def test_a_touch_survives_a_failed_read(setup):
    view, client, _ = setup
    client.allocations[CELL] = {"c1": {"resources": {"VGPU": 1}}}
    view.touch({CELL})
    client.down = True
    with pytest.raises(PlacementUnavailable):
        view.consumers({ROOT: 1, CELL: 1}, ROOT)
    client.down = False
    assert view.consumers({ROOT: 1, CELL: 1}, ROOT) == {"c1": {CELL}}
    assert client.reads == [CELL]


def test_a_provider_gone_from_the_tree_takes_its_consumers_with_it(setup):
    view, client, _ = setup
    client.allocations[CELL] = {"c1": {"resources": {"VGPU": 1}}}
    view.touch({CELL})
    assert view.consumers({ROOT: 1, CELL: 1}, ROOT) == {"c1": {CELL}}
    assert view.consumers({ROOT: 1}, ROOT) == {}


def test_reads_older_than_the_refresh_interval_are_read_again(setup):
    view, client, clock = setup
    client.allocations[CELL] = {"c1": {"resources": {"VGPU": 1}}}
    view.touch({CELL})
    view.consumers({ROOT: 1, CELL: 1}, ROOT)
    client.reads.clear()
    clock.now += 59
    view.consumers({ROOT: 1, CELL: 1}, ROOT)
    assert client.reads == []
    clock.now += 1
    view.consumers({ROOT: 1, CELL: 1}, ROOT)
    assert client.reads == [CELL]


def test_providers_read_empty_are_not_read_again_by_age(setup):
    """Any allocation written on them moves their generation; nothing can
    be deleted from them: an idle empty host costs one request a cycle."""
    view, client, clock = setup
    clock.now += 3600
    assert view.consumers({ROOT: 1, CELL: 1}, ROOT) == {}
    assert client.reads == []
    client.allocations[CELL] = {"c1": {"resources": {"VGPU": 1}}}
    assert view.consumers({ROOT: 1, CELL: 2}, ROOT) == {"c1": {CELL}}
    assert client.reads == [CELL]


def test_a_refresh_interval_of_0_reads_every_provider_every_time():
    client = FakeClient()
    view = AllocationView(client, refresh_interval=0, clock=Clock())
    view.consumers({ROOT: 1, CELL: 1}, ROOT)
    view.consumers({ROOT: 1, CELL: 1}, ROOT)
    assert sorted(client.reads) == [CELL, CELL, ROOT, ROOT]


def test_clear_reads_every_provider_again(setup):
    view, client, _ = setup
    view.clear()
    view.consumers({ROOT: 1, CELL: 1}, ROOT)
    assert sorted(client.reads) == [CELL, ROOT]


def test_usages_sum_the_consumers_and_share_the_reads_of_consumers(setup):
    view, client, _ = setup
    client.allocations[CELL] = {"c1": {"resources": {"VGPU": 1, "CUSTOM_X": 2}},
                                "c2": {"resources": {"VGPU": 3}}}
    assert view.usages(CELL, 2) == {"VGPU": 4, "CUSTOM_X": 2}
    assert client.reads == [CELL]
    # The same generation: the hold and the loop share that one read.
    assert view.consumers({ROOT: 1, CELL: 2}, ROOT) == {"c1": {CELL}, "c2": {CELL}}
    assert view.usages(CELL, 2) == {"VGPU": 4, "CUSTOM_X": 2}
    assert client.reads == [CELL]


def test_usages_are_read_again_once_the_generation_moves(setup):
    view, client, _ = setup
    client.allocations[CELL] = {"c1": {"resources": {"VGPU": 1}}}
    assert view.usages(CELL, 1) == {}  # as read by the fixture: none yet
    assert view.usages(CELL, 2) == {"VGPU": 1}
    assert client.reads == [CELL]


def test_read_usages_gives_what_was_last_read_and_asks_nothing(setup):
    view, client, clock = setup
    client.allocations[CELL] = {"vm": {"resources": {"VCPU": 2}, "generation": 1}}
    assert view.read_usages() == {ROOT: {}, CELL: {}}  # as read, before the change
    clock.now += 120  # stale: a read would go to Placement; this one does not
    assert view.read_usages() == {ROOT: {}, CELL: {}} and client.reads == []
    view.consumers({ROOT: 1, CELL: 2}, ROOT)
    assert view.read_usages()[CELL] == {"VCPU": 2}


# --- a restart: the reads an earlier run saved ----------------------------------

def restarted(saved, refresh_interval: float = 60):
    """A view of a new process (its clock at 1000) restored from ``saved``."""
    client, clock = FakeClient(), Clock()
    client.allocations[GPU] = {}
    view = AllocationView(client, refresh_interval, clock=clock)
    view.restore(saved)
    return view, client, clock


HELD = {"c1": {"VGPU": 1}}


def test_the_reads_saved_are_what_a_restart_starts_from(setup):
    view, client, _ = setup
    client.allocations[CELL] = {"c1": {"resources": {"VCPU": 2}}}
    view.consumers({ROOT: 1, CELL: 2}, ROOT)
    saved = view.saved()
    assert saved == {ROOT: (1, {}), CELL: (2, {"c1": {"VCPU": 2}})}
    again, client, _ = restarted(saved)
    assert again.consumers({ROOT: 1, CELL: 2}, ROOT) == {"c1": {CELL}}
    assert client.reads == []  # nothing moved: nothing read


def test_a_restored_provider_whose_generation_moved_is_read_at_once():
    view, client, _ = restarted({ROOT: (1, {}), CELL: (2, HELD)})
    client.allocations[ROOT] = {"c2": {"resources": {"VCPU": 1}}}
    assert view.consumers({ROOT: 2, CELL: 2}, ROOT) == {"c1": {CELL}, "c2": {ROOT}}
    assert client.reads == [ROOT]


def test_a_provider_deleted_while_down_takes_its_restored_consumers_with_it():
    view, client, _ = restarted({ROOT: (1, {}), CELL: (2, HELD)})
    assert view.consumers({ROOT: 1}, ROOT) == {}
    assert client.reads == []


def test_a_deletion_made_while_down_is_read_within_the_refresh_interval_spread():
    """Deleting allocations moves no generation: the providers that held
    some are read again by age, one after another over the interval."""
    view, client, clock = restarted({ROOT: (1, {}), CELL: (2, HELD), GPU: (3, HELD)})
    generations = {ROOT: 1, CELL: 2, GPU: 3}
    assert view.consumers(generations, ROOT) == {"c1": {CELL, GPU}}
    clock.now += 29.9
    view.consumers(generations, ROOT)
    assert client.reads == []
    clock.now += 0.1
    assert view.consumers(generations, ROOT) == {"c1": {GPU}}
    assert client.reads == [CELL]
    clock.now += 30
    assert view.consumers(generations, ROOT) == {}
    assert client.reads == [CELL, GPU]  # the root, read empty, is never read by age


def test_restored_reads_fall_due_spread_over_one_refresh_interval():
    read_at = restored_read_times(["a", "b", "c", "d"], 1000.0, 60)
    assert {uuid: at + 60 for uuid, at in read_at.items()} == {
        "a": 1015.0, "b": 1030.0, "c": 1045.0, "d": 1060.0}
    assert restored_read_times([], 1000.0, 60) == {}
    assert restored_read_times(["a", "b"], 1000.0, 0) == {"a": 1000.0, "b": 1000.0}
