"""The update loop's reconciliation (compute_agent/daemon/reconciliation.py)
of an agent on a fake host, against a fake Placement: which of Placement's
allocations it reads and when, what it does when Placement does not
answer, and the consumers it acts on (an evacuation's hold, an announced
move's allocations)."""
from __future__ import annotations

import logging

import pytest

from compute_agent.claims.model import MigrationState, MoveKind, RequestDigest
from compute_agent.daemon import reconciliation
from compute_agent.daemon.service import Agent, AgentSettings
from compute_agent.dependencies import Dependency
from compute_agent.exception import PlacementError, PlacementUnavailable
from compute_agent.metrics import PREFIX
from compute_agent.moves.evacuation import evacuation_migration_uuid
from compute_agent.tree.provider_tree import Provider, ProviderTree
from tests.unit.daemon.agents import ROOT, FakePlacement, agent_on_fake_host

INSTANCE = "3c1f5a9e-7b2d-4e8f-a6c0-1d9b8e7f6a5c"
MIGRATION = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
OTHER_HOSTS_CELL = "other-hosts-cell"
SPEC = {"name": "vm", "vcpus": 1, "memory_mb": 512}
RESOURCES = {"VCPU": 1, "MEMORY_MB": 512}


@pytest.fixture
def placement() -> FakePlacement:
    return FakePlacement()


def agent_for(tmp_path, placement: FakePlacement,
              settings: AgentSettings = AgentSettings()) -> Agent:
    """An agent whose tree Placement has, at generation 1; its host's
    pools the tracker's."""
    agent = agent_on_fake_host(tmp_path, settings, client=placement)
    built = agent.build_model(agent.driver.get_host_inventory())
    agent.manager.tracker.set_pools(built.pools_by_uuid({}))
    placement.has_tree(built.tree)
    return agent


@pytest.fixture
def agent(tmp_path, placement):
    agent = agent_for(tmp_path, placement)
    yield agent
    agent.manager.tracker.store.close()


def cell(placement: FakePlacement) -> str:
    """The NUMA cell's provider, which holds VCPU and MEMORY_MB."""
    return next(row["uuid"] for row in placement.tree if row["uuid"] != ROOT)


def cycle(agent: Agent, placement: FakePlacement) -> None:
    """What a cycle leaves the reconciliation: a new read of Placement's tree."""
    agent.sync.cache = ProviderTree.parents_first([
        Provider(row["uuid"], row["name"], row["parent_provider_uuid"],
                 generation=row["generation"]) for row in placement.tree])


def found(agent: Agent, at_start: bool = False) -> list[tuple[str, str, bool]]:
    report = agent.reconcile(at_start)
    assert report.unknown == []
    return [(f.kind, f.subject, f.fixed) for f in report.findings]


def build(agent: Agent, placement: FakePlacement) -> None:
    """INSTANCE built on the agent's cell, as a conductor has it allocated."""
    placement.held[INSTANCE] = {cell(placement): dict(RESOURCES)}
    agent.manager.build_instance(INSTANCE, SPEC,
                                 {cell(placement): {"resources": dict(RESOURCES)}})


def test_a_consumer_no_record_explains_is_found_in_the_cycles_view(agent, placement):
    placement.held["stray"] = {cell(placement): {"VCPU": 1}}
    cycle(agent, placement)
    assert found(agent) == [("allocation_without_record", "stray", False)]
    assert placement.tree_reads == 0
    assert agent.metrics.registry.get_sample_value(
        f"{PREFIX}_reconcile_findings_total",
        {"rule": "allocation_without_record", "outcome": "reported"}) == 1


def test_without_a_cycle_since_the_last_one_it_reads_the_tree_itself(agent, placement):
    """The cycle's view, already used, would hide a generation that moved
    since: the provider's allocations would not be read again."""
    cycle(agent, placement)
    assert found(agent) == []
    placement.held["late"] = {cell(placement): {"VCPU": 1}}
    placement.generation_moves(cell(placement))
    assert found(agent) == [("allocation_without_record", "late", False)]
    assert placement.tree_reads == 1
    cycle(agent, placement)
    found(agent)
    assert placement.tree_reads == 1


def test_unchanged_providers_are_not_read_again_until_sighup(agent, placement):
    cycle(agent, placement)
    found(agent)
    # A deletion, or a move away, leaves the provider's generation as it was.
    placement.held["unseen"] = {cell(placement): {"VCPU": 1}}
    cycle(agent, placement)
    assert found(agent) == []
    agent.reconciliation.drop_allocations()
    cycle(agent, placement)
    assert found(agent) == [("allocation_without_record", "unseen", False)]
    placement.provider_reads.clear()
    cycle(agent, placement)
    found(agent)
    assert placement.provider_reads == []  # dropped once, not at every pass


def test_the_providers_a_claim_touched_are_read_again(agent, placement):
    """The conductor wrote the instance's allocations just before its
    claim: read on the cell the claim touched, they explain the claim."""
    cycle(agent, placement)
    found(agent)
    build(agent, placement)
    cycle(agent, placement)
    assert found(agent) == []
    assert placement.provider_reads[-1:] == [cell(placement)]


def test_placement_not_answering_leaves_its_allocations_unknown(agent, placement, caplog):
    cycle(agent, placement)
    placement.down = True
    report = agent.reconcile(at_start=False)
    assert report.unknown == ["Placement's allocations"]
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == reconciliation.__name__] == [
        ("WARNING", "Reconciling without Placement's allocations: Placement at "
                    "http://placement did not answer (down)")]


def test_placement_already_said_down_is_not_said_again(agent, placement, caplog):
    agent.dependencies.failed(Dependency.PLACEMENT, placement.url, "did not answer (down)")
    cycle(agent, placement)
    placement.down = True
    caplog.set_level(logging.DEBUG, logger=reconciliation.__name__)
    assert agent.reconcile(at_start=False).unknown == ["Placement's allocations"]
    assert [r.levelname for r in caplog.records if r.name == reconciliation.__name__] == [
        "DEBUG"]


@pytest.mark.parametrize("refusal,why", [
    (PlacementError("400 Bad Request"), "400 Bad Request"),
    (None, "Placement's tree is not read yet"),
])
def test_allocations_placement_refuses_or_not_read_yet_are_unknown(agent, placement, caplog,
                                                                   refusal, why):
    if refusal is not None:
        cycle(agent, placement)
        placement.refusal = refusal
    assert agent.reconcile(at_start=False).unknown == ["Placement's allocations"]
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == reconciliation.__name__] == [
        ("WARNING", f"Reconciling without Placement's allocations: {why}")]


def evacuated_while_down(agent: Agent, placement: FakePlacement) -> str:
    """INSTANCE evacuated while its host was down: its allocations on
    another host's cell, the evacuation's hold on this host's share. The
    hold's consumer."""
    build(agent, placement)
    hold = evacuation_migration_uuid(INSTANCE, ROOT)
    placement.held[hold] = placement.held.pop(INSTANCE)
    placement.held[INSTANCE] = {OTHER_HOSTS_CELL: dict(RESOURCES)}
    cycle(agent, placement)
    return hold


def test_at_start_an_instance_evacuated_elsewhere_is_given_up_and_its_hold_dropped(
        agent, placement):
    hold = evacuated_while_down(agent, placement)
    assert found(agent, at_start=True) == [("evacuated_elsewhere", INSTANCE, True)]
    assert not agent.manager.tracker.knows(INSTANCE)
    assert hold not in placement.held
    assert placement.held[INSTANCE] == {OTHER_HOSTS_CELL: RESOURCES}


def test_where_an_instance_went_is_asked_at_start_only(agent, placement):
    """Not at every pass: a read per instance would cost the steady state."""
    hold = evacuated_while_down(agent, placement)
    assert found(agent, at_start=False) == [  # its guest runs: reported, left alone
        ("assignment_without_allocation", INSTANCE, False)]
    assert agent.manager.tracker.knows(INSTANCE) and hold in placement.held
    assert placement.consumer_reads == []
    found(agent, at_start=True)
    assert INSTANCE in placement.consumer_reads


def test_an_instance_whose_allocations_cannot_be_looked_for_is_kept(agent, placement, caplog):
    evacuated_while_down(agent, placement)
    def times_out(consumer: str) -> dict:
        raise PlacementUnavailable(placement.url, "did not answer (timed out)")

    placement.get_consumer_allocations = times_out  # the providers' reads answer
    assert found(agent, at_start=True) == [("assignment_without_allocation", INSTANCE, False)]
    assert agent.manager.tracker.knows(INSTANCE)
    assert [r.getMessage() for r in caplog.records if r.name == reconciliation.__name__] == [
        "Evacuated instances not looked for: Placement at http://placement did not answer "
        "(timed out)"]


def test_an_evacuations_hold_on_our_providers_is_its_instances_not_unexplained(
        agent, placement):
    build(agent, placement)
    hold = evacuation_migration_uuid(INSTANCE, ROOT)
    placement.held[hold] = {cell(placement): dict(RESOURCES)}
    cycle(agent, placement)
    assert found(agent) == []
    assert hold in placement.held


def test_a_live_migration_announced_and_left_gives_its_allocations_back_and_ends(
        tmp_path, placement):
    agent = agent_for(tmp_path, placement,
                      AgentSettings(live_migration_announced_timeout=0))
    build(agent, placement)
    agent.manager.tracker.announce_move_source(MoveKind.LIVE_MIGRATION, MIGRATION, INSTANCE,
                                               RequestDigest.of(destination="h2"))
    # The conductor's swap, and then nothing.
    placement.held[MIGRATION] = placement.held.pop(INSTANCE)
    cycle(agent, placement)
    assert found(agent) == [("live_migration_never_started", INSTANCE, True)]
    assert placement.held == {INSTANCE: {cell(placement): RESOURCES}}
    _, rows, moves = agent.manager.tracker.instance(INSTANCE)
    assert [m.state for m in moves] == [MigrationState.REVERTED]
    assert {a.migration_uuid for a in rows} == {None}  # the instance's devices, still
    agent.manager.tracker.store.close()


# --- a restart ----------------------------------------------------------------------

def restarted(tmp_path, agent: Agent, placement: FakePlacement) -> Agent:
    """The agent stopped and started again on its state directory, with
    Placement's tree, as it now is, read by its first cycle."""
    agent.manager.tracker.store.close()
    placement.provider_reads.clear()
    again = agent_on_fake_host(tmp_path, client=placement)
    cycle(again, placement)
    return again


def test_a_restart_reads_no_allocations_where_nothing_moved(tmp_path, agent, placement):
    placement.held["stray"] = {cell(placement): {"VCPU": 1}}
    cycle(agent, placement)
    assert found(agent, at_start=True) == [("allocation_without_record", "stray", False)]
    assert len(placement.provider_reads) == 2
    again = restarted(tmp_path, agent, placement)
    try:
        # Known from the reads saved: none made again.
        assert found(again, at_start=True) == [("allocation_without_record", "stray", False)]
        assert placement.provider_reads == []
    finally:
        again.manager.tracker.store.close()


def test_a_restart_reads_the_allocations_of_a_provider_whose_generation_moved(
        tmp_path, agent, placement):
    cycle(agent, placement)
    found(agent, at_start=True)
    placement.held["stray"] = {cell(placement): {"VCPU": 1}}
    placement.generation_moves(cell(placement))
    again = restarted(tmp_path, agent, placement)
    try:
        assert found(again, at_start=True) == [("allocation_without_record", "stray", False)]
        assert placement.provider_reads == [cell(placement)]
    finally:
        again.manager.tracker.store.close()


def test_an_audit_beside_the_agent_reads_every_allocation_afresh(tmp_path, agent, placement):
    """A reader (manage audit) does not take the agent's saved reads for
    Placement's: it has no refresh interval behind it."""
    placement.held["stray"] = {cell(placement): {"VCPU": 1}}
    cycle(agent, placement)
    found(agent, at_start=True)
    placement.provider_reads.clear()
    reader = agent_on_fake_host(tmp_path, client=placement, read_only=True)
    cycle(reader, placement)
    try:
        assert found(reader, at_start=True) == [("allocation_without_record", "stray", False)]
        assert sorted(placement.provider_reads) == sorted(row["uuid"] for row in placement.tree)
    finally:
        reader.manager.tracker.store.close()


def test_a_restart_s_saved_allocations_wait_for_a_cycle_of_its_own(tmp_path, agent,
                                                                    placement, caplog):
    """The view saved matches the allocations saved: taken as they are
    before a cycle read the tree, a Placement away at the start would look
    like one that answered."""
    placement.held["stray"] = {cell(placement): {"VCPU": 1}}
    assert agent.run_cycle().ok  # its view of the tree saved, as the allocations next
    found(agent, at_start=True)
    agent.manager.tracker.store.close()
    placement.provider_reads.clear()
    placement.down = True
    again = agent_on_fake_host(tmp_path, client=placement)
    try:
        assert again.reconcile(at_start=True).unknown == ["Placement's allocations"]
        assert ("WARNING", "Reconciling without Placement's allocations: Placement's tree "
                "is not read yet") in [(r.levelname, r.getMessage()) for r in caplog.records]
        placement.down = False
        cycle(again, placement)
        assert found(again, at_start=True) == [("allocation_without_record", "stray", False)]
        assert placement.provider_reads == []
    finally:
        again.manager.tracker.store.close()
