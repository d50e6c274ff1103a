"""TreeSync: Placement kept in step with the desired tree in the fewest
requests, a lost race retried after a fresh read, a refusal a warning, a
provider Placement keeps reserved whole; against an in-memory Placement
that holds generations as Placement does. (Against a real Placement:
tests/functional/test_update_provider_tree.py.)"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

from compute_agent.exception import GenerationConflict, PlacementError
from compute_agent.placement import sync as sync_module
from compute_agent.placement.sync import TreeSync
from compute_agent.tree import provider_tree as pt
from tests.unit.clocks import SleepingClock

ROOT, CELL, GPU = "root-uuid", "cell-uuid", "gpu-uuid"
IN_USE = "placement.resource_provider.inuse"


@dataclass
class Held:
    """One provider as Placement holds it."""

    name: str
    parent: str | None
    generation: int = 0
    inventories: dict[str, dict] = field(default_factory=dict)
    traits: frozenset[str] = frozenset()
    aggregates: frozenset[str] = frozenset()


class FakePlacement:
    """PlacementClient's surface that TreeSync uses, over providers in
    memory: each write checks and moves the generation as Placement does.
    ``races[(method, uuid)]``: the changes another writer makes just
    before each of the next such writes, which then loses the race ({}:
    it only moves the generation); ``refusals``: the error a write of that
    kind gets every time."""

    def __init__(self) -> None:
        self.providers: dict[str, Held] = {}
        self.resource_classes: set[str] = set()
        self.traits: set[str] = set()
        self.calls: list[tuple[str, ...]] = []
        self.races: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.refusals: dict[tuple[str, str], PlacementError] = {}
        # Another writer's move between a provider's two reads.
        self.moves_between_reads: dict[str, int] = {}
        # Another writer, just after a reshape.
        self.after_reshape: Callable[[], None] = lambda: None

    # --- another writer ---------------------------------------------------

    def moved(self, uuid: str, **changes: Any) -> None:
        """Another writer changes a provider (or only moves its generation,
        as an allocation written on it does)."""
        held = self.providers[uuid]
        self.providers[uuid] = replace(held, generation=held.generation + 1, **changes)

    # --- the client's surface ---------------------------------------------

    def _write(self, method: str, uuid: str, generation: int | None) -> Held:
        self.calls.append((method, uuid))
        if (method, uuid) in self.refusals:
            raise self.refusals[method, uuid]
        if self.races.get((method, uuid)):
            self.moved(uuid, **self.races[method, uuid].pop(0))
        held = self.providers[uuid]
        if generation != held.generation:
            raise GenerationConflict(f"{method} {uuid}: generation {generation} is not "
                                     f"{held.generation}", 409, "placement.concurrent_update")
        return held

    def get_tree(self, root_uuid: str) -> list[dict]:
        self.calls.append(("get_tree", root_uuid))
        return [{"uuid": uuid, "name": p.name, "generation": p.generation,
                 "parent_provider_uuid": p.parent, "root_provider_uuid": root_uuid}
                for uuid, p in self.providers.items()]

    def get_inventories(self, uuid: str) -> tuple[int, dict]:
        self.calls.append(("get_inventories", uuid))
        held = self.providers[uuid]
        if self.moves_between_reads.get(uuid):
            self.moves_between_reads[uuid] -= 1
            self.moved(uuid)
        return held.generation, dict(held.inventories)

    def get_traits(self, uuid: str) -> tuple[int, frozenset[str]]:
        self.calls.append(("get_traits", uuid))
        held = self.providers[uuid]
        return held.generation, held.traits

    def create_provider(self, uuid: str, name: str, parent_uuid: str | None) -> int:
        self.calls.append(("create_provider", uuid))
        self.providers[uuid] = Held(name, parent_uuid)
        return 0

    def update_provider(self, uuid: str, name: str, parent_uuid: str | None) -> int:
        self.calls.append(("update_provider", uuid))
        held = self.providers[uuid]
        self.providers[uuid] = replace(held, name=name, parent=parent_uuid)
        return held.generation

    def delete_provider(self, uuid: str) -> None:
        self.calls.append(("delete_provider", uuid))
        if ("delete_provider", uuid) in self.refusals:
            raise self.refusals["delete_provider", uuid]
        del self.providers[uuid]

    def set_inventories(self, uuid: str, generation: int | None,
                        inventories: Mapping[str, dict]) -> int:
        held = self._write("set_inventories", uuid, generation)
        self.moved(uuid, inventories=dict(inventories))
        return held.generation + 1

    def set_traits(self, uuid: str, generation: int | None, traits: Iterable[str]) -> int:
        held = self._write("set_traits", uuid, generation)
        self.moved(uuid, traits=frozenset(traits))
        return held.generation + 1

    def set_aggregates(self, uuid: str, generation: int | None,
                       aggregates: Iterable[str]) -> int:
        held = self._write("set_aggregates", uuid, generation)
        self.moved(uuid, aggregates=frozenset(aggregates))
        return held.generation + 1

    def reshape(self, inventories: Mapping[str, tuple[int | None, Mapping[str, dict]]],
                allocations: dict | None = None) -> None:
        self.calls.append(("reshape", *sorted(inventories)))
        if ("reshape", "") in self.refusals:
            raise self.refusals["reshape", ""]
        for uuid, (generation, _) in inventories.items():
            if generation != self.providers[uuid].generation:
                raise GenerationConflict(f"reshape: {uuid} moved", 409,
                                         "placement.concurrent_update")
        for uuid, (_, invs) in inventories.items():
            self.moved(uuid, inventories=dict(invs))
        self.after_reshape()

    def ensure_resource_class(self, name: str) -> None:
        self.calls.append(("ensure_resource_class", name))
        self.resource_classes.add(name)

    def ensure_trait(self, name: str) -> None:
        self.calls.append(("ensure_trait", name))
        self.traits.add(name)

    # --- what a test reads ------------------------------------------------

    def shown(self) -> dict[str, tuple]:
        """Each provider's name, parent, inventories' totals and reserved,
        and traits."""
        return {uuid: (p.name, p.parent,
                       {rc: (inv["total"], inv["reserved"])
                        for rc, inv in p.inventories.items()},
                       p.traits)
                for uuid, p in self.providers.items()}

    def writes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if not c[0].startswith("get_")]


def reserved_whole(uuid: str) -> Callable[..., pt.ProviderTree]:
    """A hold that keeps every inventory of provider ``uuid`` reserved
    whole while the host has it, as the heal rule holds a provider whose
    classes consumers still hold elsewhere."""
    def hold(current: pt.ProviderTree, desired: pt.ProviderTree,
             owned: Callable[[pt.Provider], bool]) -> pt.ProviderTree:
        if uuid not in desired:
            return desired
        held = desired.copy()
        held.replace(replace(held[uuid], inventories={
            rc: {**inv, "reserved": inv["total"]} for rc, inv in held[uuid].inventories.items()}))
        return held
    return hold


def as_it_is(current: pt.ProviderTree, desired: pt.ProviderTree,
             owned: Callable[[pt.Provider], bool]) -> pt.ProviderTree:
    """A hold that holds nothing back."""
    return desired


def host(cell_vcpus: int = 8, gpu: bool = True, gpu_total: int = 4,
         gpu_traits: frozenset[str] = frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_35"})
         ) -> pt.ProviderTree:
    """A root, its NUMA cell, and a GPU under the cell."""
    tree = pt.ProviderTree([
        pt.Provider(ROOT, "host", None, {"DISK_GB": pt.inventory(100)}),
        pt.Provider(CELL, "host_numa_0", ROOT, {"VCPU": pt.inventory(cell_vcpus)},
                    frozenset({"HW_NUMA_ROOT"}))])
    if gpu:
        tree.add(pt.Provider(GPU, "host_gpu", CELL, {"CUSTOM_VGPU": pt.inventory(gpu_total)},
                             gpu_traits))
    return tree


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SleepingClock:
    """The sync's clock: its back-off moves it instead of sleeping."""
    now = SleepingClock()
    monkeypatch.setattr(sync_module, "time", SimpleNamespace(monotonic=now, sleep=now.sleep))
    # The jitter at its top: each back-off is half as long again.
    monkeypatch.setattr(sync_module, "random", SimpleNamespace(uniform=lambda low, high: high))
    return now


@pytest.fixture
def placement() -> FakePlacement:
    return FakePlacement()


# TreeSync's class settings a test may set on its own sync.
SETTINGS = ("attempts", "backoff", "kept_retry_seconds")


def tree_sync(placement: FakePlacement, **kwargs: Any) -> TreeSync:
    settings = {name: kwargs.pop(name) for name in SETTINGS if name in kwargs}
    sync = TreeSync(placement, ROOT, kwargs.pop("hold", as_it_is), **kwargs)  # type: ignore[arg-type]
    for name, value in settings.items():
        setattr(sync, name, value)
    return sync


def synced(placement: FakePlacement, desired: pt.ProviderTree | None = None,
           **kwargs: Any) -> TreeSync:
    """A sync that has put ``desired`` (host()) in Placement, its requests
    forgotten."""
    sync = tree_sync(placement, **kwargs)
    sync.sync(desired or host())
    placement.calls.clear()
    return sync


# --- creating, and a cycle with nothing to do ----------------------------------

def test_a_new_tree_is_created_parents_first_with_its_custom_names(placement, clock, caplog):
    with caplog.at_level(logging.INFO, logger="compute_agent.placement.sync"):
        result = tree_sync(placement).sync(host())
    assert placement.shown() == {
        ROOT: ("host", None, {"DISK_GB": (100, 0)}, frozenset()),
        CELL: ("host_numa_0", ROOT, {"VCPU": (8, 0)}, frozenset({"HW_NUMA_ROOT"})),
        GPU: ("host_gpu", CELL, {"CUSTOM_VGPU": (4, 0)},
              frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_35"}))}
    assert placement.writes() == [
        ("ensure_resource_class", "CUSTOM_VGPU"), ("ensure_trait", "CUSTOM_MDEV_TYPE_NVIDIA_35"),
        ("create_provider", ROOT), ("create_provider", CELL), ("set_traits", CELL),
        ("create_provider", GPU), ("set_traits", GPU),
        # Three inventories at once: one reshape, and one read for the
        # generations it does not return.
        ("reshape", CELL, GPU, ROOT)]
    assert result.writes == 2 + 5 + 2 and result.warnings == []
    assert [p.uuid for p in result.tree] == [ROOT, CELL, GPU]
    assert "Placement: created provider host_numa_0 (cell-uuid) under root-uuid" in [
        r.getMessage() for r in caplog.records]


def test_a_cycle_with_nothing_changed_sends_one_request_and_logs_nothing(
        placement, clock, caplog):
    sync = synced(placement)
    with caplog.at_level(logging.INFO, logger="compute_agent.placement.sync"):
        result = sync.sync(host())
    assert placement.calls == [("get_tree", ROOT)]
    assert result.writes == 0 and caplog.records == []


def test_one_inventory_change_is_one_write_logged_in_one_line(placement, clock, caplog):
    sync = synced(placement)
    with caplog.at_level(logging.INFO, logger="compute_agent.placement.sync"):
        result = sync.sync(host(cell_vcpus=16))
    assert placement.writes() == [("set_inventories", CELL)]
    assert result.writes == 1
    assert placement.shown()[CELL][2] == {"VCPU": (16, 0)}
    assert [r.getMessage() for r in caplog.records] == [
        "Placement: provider host_numa_0 (cell-uuid): inventory VCPU total 8->16 "
        "max_unit 8->16"]


def ensured(placement: FakePlacement) -> list[tuple[str, ...]]:
    return [c for c in placement.calls if c[0].startswith("ensure_")]


def test_a_custom_name_is_made_once(placement, clock):
    sync = synced(placement)
    sync.sync(host(gpu=False))
    sync.sync(host())
    assert ensured(placement) == []


def test_names_are_made_again_after_an_invalidate_except_those_the_provider_holds(
        placement, clock):
    sync = synced(placement)
    sync.invalidate()
    sync.sync(host(gpu_total=8,
                   gpu_traits=frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_35", "CUSTOM_NEW"})))
    assert ensured(placement) == [("ensure_trait", "CUSTOM_NEW")]
    placement.calls.clear()
    sync.invalidate()
    sync.sync(host(gpu=False))
    sync.sync(host())
    assert ensured(placement) == [("ensure_resource_class", "CUSTOM_VGPU"),
                                  ("ensure_trait", "CUSTOM_MDEV_TYPE_NVIDIA_35")]


# --- reading only what moved ----------------------------------------------------------

def test_only_a_provider_whose_generation_moved_is_read_and_put_back(placement, clock):
    sync = synced(placement)
    placement.moved(CELL, traits=frozenset({"COMPUTE_STATUS_DISABLED"}))
    sync.sync(host())
    assert placement.calls == [("get_tree", ROOT), ("get_inventories", CELL),
                               ("get_traits", CELL), ("set_traits", CELL)]
    # Ours put back, another's kept.
    assert placement.shown()[CELL][3] == {"HW_NUMA_ROOT", "COMPUTE_STATUS_DISABLED"}


def test_a_provider_moved_under_another_parent_is_read_and_put_back(placement, clock):
    # Placement does not move a generation for a new name or parent.
    sync = synced(placement)
    placement.providers[GPU] = replace(placement.providers[GPU], parent=ROOT)
    sync.sync(host())
    assert placement.calls == [("get_tree", ROOT), ("get_inventories", GPU),
                               ("get_traits", GPU), ("update_provider", GPU)]
    assert placement.shown()[GPU][1] == CELL


def test_a_provider_that_moves_while_it_is_read_is_read_again(placement, clock):
    sync = synced(placement)
    placement.moved(CELL)
    placement.moves_between_reads[CELL] = 1
    sync.sync(host())
    assert placement.calls == [("get_tree", ROOT)] + [
        ("get_inventories", CELL), ("get_traits", CELL)] * 2


def test_a_provider_that_never_stops_moving_while_read_fails_the_cycle(placement, clock):
    sync = synced(placement, attempts=3)
    placement.moved(CELL)
    placement.moves_between_reads[CELL] = 3
    with pytest.raises(GenerationConflict, match="provider host_numa_0 kept changing"):
        sync.sync(host())
    assert placement.calls.count(("get_inventories", CELL)) == 3


def test_a_saved_view_is_trusted_until_invalidated(placement, clock):
    first = synced(placement)
    again = tree_sync(placement)
    again.restore(first.cache.copy())
    again.sync(host())
    assert placement.calls == [("get_tree", ROOT)]
    placement.calls.clear()
    again.invalidate()
    again.sync(host())
    assert sorted(c for c in placement.calls if c[0] == "get_inventories") == [
        ("get_inventories", CELL), ("get_inventories", GPU), ("get_inventories", ROOT)]


def test_a_restart_s_first_cycle_takes_the_tree_the_start_read_and_sends_nothing(
        placement, clock):
    first = synced(placement)
    again = tree_sync(placement)
    again.restore(first.cache.copy())
    again.prime(placement.get_tree(ROOT))
    placement.calls.clear()
    again.sync(host())
    assert placement.calls == []
    again.sync(host())  # the tree the start read serves one cycle only
    assert placement.calls == [("get_tree", ROOT)]


def test_a_restored_view_is_no_read_of_this_run_until_a_refresh(placement, clock):
    first = synced(placement)
    assert first.read_this_run
    again = tree_sync(placement)
    again.restore(first.cache.copy())
    assert not again.read_this_run
    again.refresh()
    assert again.read_this_run


def test_a_primed_tree_is_dropped_by_an_invalidate(placement, clock):
    """SIGHUP during start-up: the first cycle reads Placement afresh."""
    first = synced(placement)
    again = tree_sync(placement)
    again.restore(first.cache.copy())
    again.prime(placement.get_tree(ROOT))
    again.invalidate()
    placement.calls.clear()
    again.sync(host())
    assert placement.calls[0] == ("get_tree", ROOT)


# --- lost races ---------------------------------------------------------------------

def test_a_lost_race_is_written_again_after_a_fresh_read_of_that_provider(placement, clock):
    sync = synced(placement, backoff=0.1)
    placement.races["set_inventories", CELL] = [{}, {}]
    result = sync.sync(host(cell_vcpus=16))
    assert placement.calls[1:] == [
        ("set_inventories", CELL), ("get_inventories", CELL), ("get_traits", CELL),
        ("set_inventories", CELL), ("get_inventories", CELL), ("get_traits", CELL),
        ("set_inventories", CELL)]
    assert result.writes == 3 and placement.shown()[CELL][2] == {"VCPU": (16, 0)}
    # Backed off twice, the second time twice as long.
    assert clock.slept == [pytest.approx(0.15), pytest.approx(0.3)]


def test_a_race_lost_to_a_writer_that_did_the_same_writes_nothing_more(placement, clock):
    sync = synced(placement)
    placement.races["set_traits", CELL] = [{"traits": frozenset({"HW_NUMA_ROOT", "CUSTOM_MARK"})}]
    desired = host()
    desired.replace(replace(desired[CELL], traits=frozenset({"HW_NUMA_ROOT", "CUSTOM_MARK"})))
    sync.sync(desired)
    assert placement.writes() == [("ensure_trait", "CUSTOM_MARK"), ("set_traits", CELL)]
    assert placement.shown()[CELL][3] == {"HW_NUMA_ROOT", "CUSTOM_MARK"}


def test_a_race_lost_at_every_attempt_fails_the_cycle(placement, clock):
    sync = synced(placement, attempts=3)
    placement.races["set_traits", GPU] = [{}, {}, {}]
    with pytest.raises(GenerationConflict):
        sync.sync(host(gpu_traits=frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_36"})))
    assert placement.calls.count(("set_traits", GPU)) == 3


def test_aggregates_are_written_when_the_agent_manages_them(placement, clock):
    sync = synced(placement)
    desired = host()
    desired.replace(replace(desired[ROOT], aggregates=frozenset({"agg-1"})))
    sync.sync(desired)
    assert placement.writes() == [("set_aggregates", ROOT)]
    assert placement.providers[ROOT].aggregates == {"agg-1"}
    placement.calls.clear()
    sync.sync(desired)
    assert placement.calls == [("get_tree", ROOT)]


# --- inventories in one reshape, or one by one ---------------------------------------

def test_several_inventory_changes_are_one_reshape_and_one_read(placement, clock):
    sync = synced(placement)
    result = sync.sync(host(cell_vcpus=16, gpu_total=8))
    assert placement.calls == [("get_tree", ROOT), ("reshape", CELL, GPU), ("get_tree", ROOT)]
    assert result.writes == 2
    # The generations read after it are cached: the next cycle reads nothing.
    placement.calls.clear()
    sync.sync(host(cell_vcpus=16, gpu_total=8))
    assert placement.calls == [("get_tree", ROOT)]


def test_a_refused_reshape_is_written_one_by_one_and_a_refused_one_is_a_warning(
        placement, clock, caplog):
    sync = synced(placement)
    placement.refusals["reshape", ""] = PlacementError("refused", 409, "placement.inventory.inuse")
    placement.refusals["set_inventories", GPU] = PlacementError(
        "Placement answered 409 to PUT /resource_providers/gpu-uuid/inventories: in use",
        409, "placement.inventory.inuse")
    result = sync.sync(host(cell_vcpus=16, gpu_total=2))
    assert placement.writes() == [("reshape", CELL, GPU), ("set_inventories", CELL),
                                  ("set_inventories", GPU)]
    assert placement.shown()[CELL][2] == {"VCPU": (16, 0)}
    assert placement.shown()[GPU][2] == {"CUSTOM_VGPU": (4, 0)}
    assert result.writes == 2
    assert result.warnings == ["inventory of host_gpu not updated: Placement answered 409 to "
                               "PUT /resource_providers/gpu-uuid/inventories: in use"]
    assert result.warnings[0] in [r.getMessage() for r in caplog.records
                                  if r.levelno == logging.WARNING]


def test_a_provider_deleted_right_after_a_reshape_is_forgotten_and_made_again(
        placement, clock, caplog):
    sync = synced(placement)
    placement.after_reshape = lambda: placement.providers.pop(GPU)
    sync.sync(host(cell_vcpus=16, gpu_total=8))
    assert GPU not in sync.cache
    assert any("provider host_gpu (gpu-uuid) was deleted by another writer" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)
    placement.after_reshape = lambda: None
    sync.sync(host(cell_vcpus=16, gpu_total=8))
    assert placement.shown()[GPU][2] == {"CUSTOM_VGPU": (8, 0)}


# --- deleting ------------------------------------------------------------------------

def test_a_provider_gone_from_the_host_is_deleted_after_every_other_write(placement, clock):
    sync = synced(placement)
    result = sync.sync(host(cell_vcpus=16, gpu=False))
    assert placement.writes() == [("set_inventories", CELL), ("delete_provider", GPU)]
    assert GPU not in placement.providers and result.writes == 2


def test_a_provider_the_agent_does_not_own_is_never_deleted(placement, clock):
    sync = synced(placement, owned=lambda p: p.name != "host_gpu")
    sync.sync(host(gpu=False))
    assert placement.writes() == [] and GPU in placement.providers


def kept(placement: FakePlacement) -> None:
    placement.refusals["delete_provider", GPU] = PlacementError(
        "Placement answered 409", 409, IN_USE)


def test_a_provider_placement_keeps_is_reserved_whole_with_a_warning(placement, clock):
    sync = synced(placement)
    kept(placement)
    result = sync.sync(host(gpu=False))
    assert placement.writes() == [("delete_provider", GPU), ("set_inventories", GPU)]
    assert placement.shown()[GPU][2] == {"CUSTOM_VGPU": (4, 4)}
    assert result.writes == 2
    assert result.warnings == [
        f"provider host_gpu is gone from the host but Placement keeps it ({IN_USE}); it "
        "stays, fully reserved, until its allocations are removed"]


def test_a_kept_provider_is_asked_again_once_it_moves_or_time_passes(placement, clock):
    sync = synced(placement, kept_retry_seconds=300)
    kept(placement)
    sync.sync(host(gpu=False))
    placement.calls.clear()
    clock.advance(299)
    sync.sync(host(gpu=False))
    assert placement.writes() == []
    clock.advance(1)
    sync.sync(host(gpu=False))
    assert placement.writes() == [("delete_provider", GPU)]
    # Reserved already: asked again at once when its generation moves.
    placement.calls.clear()
    sync.sync(host(gpu=False))
    assert placement.writes() == []
    placement.moved(GPU)
    sync.sync(host(gpu=False))
    assert placement.writes() == [("delete_provider", GPU)]


def test_a_kept_provider_back_on_the_host_is_asked_again_when_it_goes(placement, clock):
    # Back, and still held reserved (its consumers not healed yet): nothing
    # is written to it, so its generation stays.
    sync = synced(placement, hold=reserved_whole(GPU))
    kept(placement)
    sync.sync(host(gpu=False))
    sync.sync(host())
    placement.calls.clear()
    sync.sync(host(gpu=False))
    assert placement.writes() == [("delete_provider", GPU)]


# --- what is reported -----------------------------------------------------------------

def test_what_is_written_is_what_the_hold_lets_be_reported(placement, clock):
    seen: list[tuple[list[str], list[str]]] = []

    def reserve_the_gpu(current: pt.ProviderTree, desired: pt.ProviderTree,
                        owned: Callable[[pt.Provider], bool]) -> pt.ProviderTree:
        seen.append(([p.uuid for p in current], [p.uuid for p in desired]))
        return reserved_whole(GPU)(current, desired, owned)

    result = tree_sync(placement, hold=reserve_the_gpu).sync(host())
    assert seen == [([], [ROOT, CELL, GPU])]
    assert placement.shown()[GPU][2] == {"CUSTOM_VGPU": (4, 4)}
    assert result.tree is not None and result.tree[GPU].inventories["CUSTOM_VGPU"]["reserved"] == 4


def test_a_provider_placement_has_under_the_same_name_keeps_its_uuid(placement, clock):
    placement.providers["novas-root"] = Held("host", None, 3, {"DISK_GB": pt.inventory(100)})
    result = tree_sync(placement).sync(host(gpu=False))
    assert ("create_provider", ROOT) not in placement.writes()
    assert result.tree is not None and result.tree.named("host").uuid == "novas-root"
    assert placement.shown()[CELL][1] == "novas-root"
