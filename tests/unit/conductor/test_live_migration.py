"""The conductor's side of a live migration (compute_agent/conductor/
live_migration.py), driving recorders for Placement and the agents: the
order of its steps (the source told before the swap, RPC API 1.4) and of
their rollback; then issue 14, a live migration whose source's answer is
lost: the rule (which outcome the source's answer stands for, and what the
conductor does about it) on its own, then the helper asking the source
again instead of rolling back, leaving everything as it is when the source
never says, and finishing the move when rerun with the same migration
uuid; a rerun the source refuses, and a claim whose rollback is not
answered. Last, LiveMigrator on the Placement stand-in of placements.py:
the source, the room on the target and a resumed move, its steps
recorded."""
from __future__ import annotations

import logging
import uuid as uuid_lib
from dataclasses import dataclass

import pytest
from oslo_messaging import MessagingTimeout, RemoteError

from compute_agent.claims.model import MigrationRole
from compute_agent.conductor import live_migration
from compute_agent.conductor.errors import LiveMigrationNotPossible
from compute_agent.conductor.live_migration import (
    LiveMigrator,
    MoveOutcome,
    NextStep,
    answer_lost,
    live_migrate_instance,
    live_migrate_outcome,
    next_step,
)
from compute_agent.exception import (
    InternalError,
    InvalidRequest,
    LiveMigrationFailed,
    LiveMigrationOutcomeUnknown,
    LiveMigrationRefused,
    MoveInProgress,
    NoSuchInstance,
    StoreUnavailable,
    VersionCapped,
)
from compute_agent.messaging import messaging
from compute_agent.rpc.errors import BrokerUnreachable, NoAnswer
from tests.functional.claims_world import spec
from tests.unit.conductor.placements import Held, Placement

MIG = "mig"


@pytest.mark.parametrize("answer, outcome", [
    ({"migration_uuid": MIG, "state": "migrated"}, MoveOutcome.MIGRATED),
    ({"migration_uuid": MIG}, MoveOutcome.UNKNOWN),
    (MoveInProgress("inst", MIG), MoveOutcome.MIGRATING),
    # Another move holds the instance: this one never started.
    (MoveInProgress("inst", "other"), MoveOutcome.STAYED),
    (LiveMigrationFailed("inst", MIG, "aborted", "QEMU died"), MoveOutcome.STAYED),
    (LiveMigrationFailed("inst", MIG, "destination_unreachable", "x"),
     MoveOutcome.STAYED),
    (LiveMigrationFailed("inst", MIG, "outcome_unknown", "libvirtd went away"),
     MoveOutcome.UNKNOWN),
    (LiveMigrationRefused("inst", MigrationRole.SOURCE, ["vf 0000:81:00.1"]), MoveOutcome.STAYED),
    (InvalidRequest("migration_uuid", MIG, "this live migration failed or was "
                    "rolled back"), MoveOutcome.STAYED),
    (NoSuchInstance("inst"), MoveOutcome.STAYED),
    (VersionCapped("live_migrate", "1.2", "1.0"), MoveOutcome.STAYED),
    # The answer was lost: the source may have migrated the guest.
    (MessagingTimeout("no reply"), MoveOutcome.UNKNOWN),
    (BrokerUnreachable("broker down"), MoveOutcome.UNKNOWN),
    # Failures that can come after the guest left (the store, at confirm).
    (StoreUnavailable("live_migrate", "disk I/O error"), MoveOutcome.UNKNOWN),
    (InternalError("live_migrate", "boom"), MoveOutcome.UNKNOWN),
    (RemoteError("KeyError", "x"), MoveOutcome.UNKNOWN),
])
def test_the_outcome_each_answer_stands_for(answer, outcome):
    assert live_migrate_outcome(answer, MIG) is outcome


@pytest.mark.parametrize("error, lost", [
    # No answer came: the destination may have claimed.
    (MessagingTimeout("no reply"), True),
    # The client's own timeouts are AgentErrors too, and still no answer.
    (NoAnswer("dest", "check_can_live_migrate_destination", 30), True),
    (BrokerUnreachable("broker down"), True),
    (RemoteError("KeyError", "x"), True),
    # The agent failed while at it.
    (StoreUnavailable("check_can_live_migrate_destination", "disk I/O error"), True),
    (InternalError("check_can_live_migrate_destination", "boom"), True),
    # Its refusals did nothing.
    (InvalidRequest("instance_uuid", "x", "not a UUID"), False),
    (LiveMigrationRefused("inst", MigrationRole.DESTINATION, ["vf 0000:81:00.1"]), False),
    (MoveInProgress("inst", "other"), False),
])
def test_an_answer_is_lost_unless_the_agent_refused(error, lost):
    assert answer_lost(error) is lost


@pytest.mark.parametrize("outcome, time_left, step", [
    (MoveOutcome.MIGRATED, True, NextStep.SETTLE),
    (MoveOutcome.MIGRATED, False, NextStep.SETTLE),
    (MoveOutcome.STAYED, True, NextStep.ROLL_BACK),
    (MoveOutcome.STAYED, False, NextStep.ROLL_BACK),
    (MoveOutcome.MIGRATING, True, NextStep.ASK_AGAIN),
    (MoveOutcome.MIGRATING, False, NextStep.LEAVE_AS_IS),
    (MoveOutcome.UNKNOWN, True, NextStep.ASK_AGAIN),
    (MoveOutcome.UNKNOWN, False, NextStep.LEAVE_AS_IS),
])
def test_what_the_conductor_does_about_each_outcome(outcome, time_left, step):
    assert next_step(outcome, time_left) is step


def test_no_outcome_but_a_settled_or_stayed_one_ever_undoes_anything():
    """The bug: a lost answer rolled the destination back."""
    for outcome in (MoveOutcome.MIGRATING, MoveOutcome.UNKNOWN):
        for time_left in (True, False):
            assert next_step(outcome, time_left) is not NextStep.ROLL_BACK


# --- the conductor's order ------------------------------------------------

class Conductor:
    """Placement's consumers and the agents' calls, in one journal."""

    def __init__(self, fail: str | None = None, cap_14: bool = True,
                 lost: str | None = None):
        """``fail``: the method that answers a failure; ``lost``: the one
        whose answer is lost (a timeout), its work maybe done."""
        self.journal: list[str] = []
        self.fail = fail
        self.lost = lost
        self.cap_14 = cap_14
        self.consumers = {"inst": {"allocations": {"src-rp": {"resources": {"VGPU": 1}}},
                                   "project_id": "p", "user_id": "u",
                                   "consumer_generation": 1}}

    # Placement
    def get_consumer_allocations(self, consumer):
        return self.consumers.get(consumer, {"allocations": {}})

    def post_allocations(self, body):
        for consumer, c in body.items():
            self.consumers[consumer] = {**c, "consumer_generation": 1}
        self.journal.append("placement: " + ", ".join(
            f"{k}={sorted(v['allocations'])}" for k, v in sorted(body.items())))

    # agents
    def can_send(self, version):
        return self.cap_14 or version != "1.4"

    def __getattr__(self, method):
        def call(host, *args, **kwargs):
            self.journal.append(f"{host}: {method}")
            if method == self.fail:
                raise LiveMigrationFailed("inst", "mig", "failed", "it broke")
            if method == self.lost:
                raise messaging.MessagingTimeout("no reply")
            # As the agents answer: the source's record, the source's
            # migration, the destination's claim and its instance.
            return {"state": {"check_can_live_migrate_source": "announced",
                              "live_migrate": "migrated"}.get(method),
                    "claimed": [], "migration_uri": "fake://b", "running": True}
        return call


def run(conductor: Conductor) -> list[str]:
    try:
        live_migrate_instance(conductor, conductor, "inst", "A", "B", spec(),
                              {"dst-rp": {"resources": {"VGPU": 1}}}, "mig")
    except LiveMigrationFailed:
        conductor.journal.append("raised")
    return conductor.journal


SWAP = "placement: inst=[], mig=['src-rp']"
DESTINATION_ALLOCATIONS = "placement: inst=['dst-rp']"
RETURNED = "placement: inst=['src-rp'], mig=[]"


def test_the_conductor_tells_the_source_before_the_swap():
    assert run(Conductor()) == [
        "A: check_can_live_migrate_source", SWAP, DESTINATION_ALLOCATIONS,
        "B: check_can_live_migrate_destination", "A: live_migrate",
        "B: post_live_migration_at_destination", "placement: mig=[]"]


def test_a_refused_source_leaves_nothing_to_undo():
    assert run(Conductor(fail="check_can_live_migrate_source")) == [
        "A: check_can_live_migrate_source", "raised"]


def test_on_failure_the_allocations_return_before_the_source_ends_the_move():
    """A source restarting between the two must find either the instance's
    allocations on its providers or the move open, never neither."""
    assert run(Conductor(fail="live_migrate"))[-4:] == [
        "B: rollback_live_migration_at_destination", RETURNED,
        "A: rollback_live_migration_at_source", "raised"]
    refused = run(Conductor(fail="check_can_live_migrate_destination"))
    assert refused[-3:] == [RETURNED, "A: rollback_live_migration_at_source", "raised"]
    assert "B: rollback_live_migration_at_destination" not in refused


def test_a_claim_whose_answer_is_lost_is_given_back_at_the_destination():
    """The destination may have claimed before its answer was lost: asked
    to give it back (a refusal, as above, claimed nothing)."""
    conductor = Conductor(lost="check_can_live_migrate_destination")
    with pytest.raises(messaging.MessagingTimeout):
        live_migrate_instance(conductor, conductor, "inst", "A", "B", spec(),
                              {"dst-rp": {"resources": {"VGPU": 1}}}, "mig")
    assert conductor.journal[-4:] == [
        "B: check_can_live_migrate_destination",
        "B: rollback_live_migration_at_destination", RETURNED,
        "A: rollback_live_migration_at_source"]


def test_a_conductor_capped_below_1_4_skips_the_source_steps():
    journal = run(Conductor(fail="live_migrate", cap_14=False))
    assert not [j for j in journal if "source" in j]
    assert journal[0] == SWAP


# --- a lost answer ----------------------------------------------------------

class LossyConductor(Conductor):
    """The source answers live_migrate from ``answers``, one per call (an
    exception is raised); once they run out, the last is repeated."""

    timeout = 5.0

    def __init__(self, answers: list, confirmed_at_source: bool = False):
        super().__init__()
        self.answers = answers
        self.confirmed_at_source = confirmed_at_source

    def live_migrate(self, host, migration, instance, destination, timeout=None):
        self.journal.append(f"{host}: live_migrate")
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def check_can_live_migrate_source(self, host, migration, instance, destination):
        self.journal.append(f"{host}: check_can_live_migrate_source")
        return {"migration_uuid": migration,
                "state": "confirmed" if self.confirmed_at_source else "announced"}


def migrate(conductor: Conductor, outcome_wait: float = 5.0) -> dict:
    return live_migrate_instance(conductor, conductor, "inst", "A", "B", spec(),
                                 {"dst-rp": {"resources": {"VGPU": 1}}}, MIG,
                                 outcome_wait=outcome_wait, ask_pause=0.01)


def allocations(conductor: Conductor) -> dict[str, list[str]]:
    return {c: sorted(v["allocations"]) for c, v in conductor.consumers.items()}


def test_a_lost_answer_is_asked_after_and_the_move_settled():
    conductor = LossyConductor([MessagingTimeout("lost"), MoveInProgress("inst", MIG),
                                {"migration_uuid": MIG, "state": "migrated"}])
    assert migrate(conductor)["running"]
    assert conductor.journal[-5:] == [
        "A: live_migrate", "A: live_migrate", "A: live_migrate",
        "B: post_live_migration_at_destination", "placement: mig=[]"]
    assert not [j for j in conductor.journal if "rollback" in j]
    assert allocations(conductor) == {"inst": ["dst-rp"], "mig": []}


def test_a_source_that_never_answers_leaves_everything_as_it_is():
    conductor = LossyConductor([MessagingTimeout("lost")])
    with pytest.raises(LiveMigrationOutcomeUnknown) as caught:
        migrate(conductor, outcome_wait=0.05)
    assert not [j for j in conductor.journal if "rollback" in j or "post" in j]
    assert allocations(conductor) == {"inst": ["dst-rp"], "mig": ["src-rp"]}
    assert str(caught.value).startswith(
        "live migration mig of instance inst: whether the guest left A is unknown "
        "(MessagingTimeout: lost); nothing was rolled back: B keeps its claim")
    assert "--migration mig" in str(caught.value)


def test_a_rerun_after_an_unknown_outcome_neither_swaps_again_nor_rolls_back():
    conductor = LossyConductor([MessagingTimeout("lost")])
    with pytest.raises(LiveMigrationOutcomeUnknown):
        migrate(conductor, outcome_wait=0.05)
    # The source migrated meanwhile, and answers the retry so.
    conductor.answers = [{"migration_uuid": MIG, "state": "migrated"}]
    conductor.journal.clear()
    migrate(conductor)
    assert SWAP not in conductor.journal
    assert conductor.journal == [
        "A: check_can_live_migrate_source", DESTINATION_ALLOCATIONS,
        "B: check_can_live_migrate_destination", "A: live_migrate",
        "B: post_live_migration_at_destination", "placement: mig=[]"]
    assert allocations(conductor) == {"inst": ["dst-rp"], "mig": []}


def test_a_rerun_of_a_move_the_source_completed_only_settles():
    conductor = LossyConductor([MessagingTimeout("lost")])
    with pytest.raises(LiveMigrationOutcomeUnknown):
        migrate(conductor, outcome_wait=0.05)
    conductor.confirmed_at_source = True
    conductor.journal.clear()
    migrate(conductor)
    assert conductor.journal == ["A: check_can_live_migrate_source",
                                 "B: post_live_migration_at_destination",
                                 "placement: mig=[]"]


def test_a_source_that_says_the_guest_stayed_after_a_lost_answer_rolls_back():
    conductor = LossyConductor([MessagingTimeout("lost"), LiveMigrationFailed(
        "inst", MIG, "aborted", "the destination's QEMU died")])
    with pytest.raises(LiveMigrationFailed):
        migrate(conductor)
    assert conductor.journal[-3:] == [
        "B: rollback_live_migration_at_destination",
        "placement: inst=['src-rp'], mig=[]", "A: rollback_live_migration_at_source"]


# --- a rerun the source refuses, a claim that may stay ---------------------------

class RolledBackAtSource(Conductor):
    """A rerun of migration ``mig`` after a first run whose outcome was
    unknown: the migration holds the source's allocations, the instance
    the destination's, and the source refuses the move, rolled back there
    or not. ``moves``: each host's state of the move in get_instance, None
    when it has no such instance."""

    def __init__(self, moves: dict[str, str | None]) -> None:
        super().__init__()
        self.moves = moves
        self.consumers = {
            consumer: {"allocations": {rp: {"resources": {"VGPU": 1}}}, "project_id": "p",
                       "user_id": "u", "consumer_generation": 2}
            for consumer, rp in (("inst", "dst-rp"), (MIG, "src-rp"))}

    def check_can_live_migrate_source(self, host, migration, instance, destination):
        self.journal.append(f"{host}: check_can_live_migrate_source")
        raise InvalidRequest("migration_uuid", migration,
                             "this live migration failed or was rolled back")

    def get_instance(self, host, instance):
        self.journal.append(f"{host}: get_instance")
        if self.moves[host] is None:
            raise NoSuchInstance(instance)
        return {"migrations": [{"uuid": MIG, "state": self.moves[host]}]}


def rerun(conductor: Conductor, migration: str | None = MIG) -> list[str]:
    with pytest.raises(InvalidRequest, match="rolled back"):
        live_migrate_instance(conductor, conductor, "inst", "A", "B", spec(),
                              {"dst-rp": {"resources": {"VGPU": 1}}}, migration)
    return conductor.journal


def test_a_rerun_of_a_move_the_source_rolled_back_undoes_what_the_first_run_left():
    conductor = RolledBackAtSource({"A": "reverted", "B": "active"})
    assert rerun(conductor) == [
        "A: check_can_live_migrate_source", "A: get_instance", "B: get_instance",
        "B: rollback_live_migration_at_destination", RETURNED]
    assert allocations(conductor) == {"inst": ["src-rp"], MIG: []}


def test_a_destination_that_never_claimed_the_rolled_back_move_is_not_asked_to_undo_it():
    for at_destination in (None, "reverted"):
        conductor = RolledBackAtSource({"A": "reverted", "B": at_destination})
        assert rerun(conductor)[-2:] == ["B: get_instance", RETURNED]


@pytest.mark.parametrize("migration, at_source, asked", [
    # A first run's refusal left nothing anywhere: nobody is asked more.
    (None, "reverted", ["A: check_can_live_migrate_source"]),
    (MIG, "announced", ["A: check_can_live_migrate_source", "A: get_instance"]),
])
def test_a_refusal_of_a_first_run_or_of_a_move_not_rolled_back_undoes_nothing(
        migration, at_source, asked):
    conductor = RolledBackAtSource({"A": at_source, "B": "active"})
    assert rerun(conductor, migration) == asked
    assert allocations(conductor) == {"inst": ["dst-rp"], MIG: ["src-rp"]}


class ClaimUnanswered(Conductor):
    """The destination's answer to its claim is lost; so is, or is refused,
    the rollback of that claim."""

    def __init__(self, rollback_error: Exception) -> None:
        super().__init__(lost="check_can_live_migrate_destination")
        self.rollback_error = rollback_error

    def rollback_live_migration_at_destination(self, host, migration, instance):
        self.journal.append(f"{host}: rollback_live_migration_at_destination")
        raise self.rollback_error


@pytest.mark.parametrize("rollback_error, warned", [
    (MessagingTimeout("no reply"), True),
    # It never heard of the move: it claimed nothing, as good as given back.
    (NoSuchInstance("inst"), False),
])
def test_a_claim_whose_rollback_is_not_answered_either_is_said_to_stay(
        rollback_error, warned, caplog):
    conductor = ClaimUnanswered(rollback_error)
    with pytest.raises(MessagingTimeout):
        live_migrate_instance(conductor, conductor, "inst", "A", "B", spec(),
                              {"dst-rp": {"resources": {"VGPU": 1}}}, MIG)
    # The rest of the rollback goes on all the same.
    assert conductor.journal[-3:] == ["B: rollback_live_migration_at_destination", RETURNED,
                                      "A: rollback_live_migration_at_source"]
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == ([f"Live migration {MIG} of instance inst: the claim at B may stay until "
                     "the migration is run again (MessagingTimeout)"] if warned else [])


# --- LiveMigrator: the source, the destination's room, a resumed run -------------

A, A_CELL, B, B_CELL = (str(uuid_lib.uuid4()) for _ in range(4))
INSTANCE = str(uuid_lib.uuid4())
HELD = {"VCPU": 2, "MEMORY_MB": 1024}
SPEC = {"name": "web-1", "vcpus": 2, "memory_mb": 1024}


def hosts_a_and_b() -> Placement:
    """Hosts a and b, each a root with one NUMA cell; b has room; the
    instance runs on a."""
    placement = Placement(room=[B])
    for name, root, cell in (("a", A, A_CELL), ("b", B, B_CELL)):
        placement.add(root, name, None, frozenset({"COMPUTE_NODE"}))
        placement.add(cell, f"{name}_numa_0", root, frozenset({"HW_NUMA_ROOT"}))
    placement.consumers[INSTANCE] = Held({A_CELL: dict(HELD)})
    return placement


class Hosts:
    """The agents' get_instance: ``has`` names the hosts that have the
    instance (its spec)."""

    def __init__(self, has: set[str]) -> None:
        self.has = has
        self.asked: list[str] = []

    def get_instance(self, host: str, instance: str) -> dict:
        self.asked.append(host)
        if host not in self.has:
            raise NoSuchInstance(instance)
        return {"spec": dict(SPEC), "migrations": []}


@dataclass
class Migrator:
    placement: Placement
    hosts: Hosts
    runs: list[tuple]  # live_migrate_instance's arguments, each run
    migrator: LiveMigrator


@pytest.fixture
def lm(monkeypatch) -> Migrator:
    """A LiveMigrator whose run of the steps (live_migrate_instance, tested
    above) is recorded: the guest arrives at once, not running yet."""
    placement, hosts, runs = hosts_a_and_b(), Hosts({"a"}), []

    def steps(api, placement, instance, source, destination, spec, allocations,
              migration):
        runs.append((instance, source, destination, spec, allocations, migration))
        return {"running": False}  # arrived, as the destination reports it

    monkeypatch.setattr(live_migration, "live_migrate_instance", steps)
    return Migrator(placement, hosts, runs, LiveMigrator(placement, hosts))


def test_an_instance_moves_to_room_on_the_target_s_tree_with_its_spec(lm):
    moved = lm.migrator.live_migrate(INSTANCE, "b")
    [(instance, source, destination, spec, wanted, migration)] = lm.runs
    assert (instance, source, destination, spec) == (INSTANCE, "a", "b", SPEC)
    assert wanted == {B_CELL: {"resources": HELD}}
    assert str(uuid_lib.UUID(migration)) == migration
    assert moved == {"instance": INSTANCE, "source": "a", "destination": "b",
                     "migration": migration, "running": False}
    (asked,) = [r for r in lm.placement.requests if r.startswith("GET /allocation_c")]
    assert f"in_tree_CELL0={B}" in asked
    assert lm.hosts.asked == ["a"]


@pytest.mark.parametrize("target, refusal", [
    ("a", "--target: a is the instance's host already"),
    ("c", "--target: c is no compute host in Placement"),
])
def test_a_target_that_cannot_take_it_is_refused_before_any_agent_is_asked(lm, target,
                                                                           refusal):
    with pytest.raises(LiveMigrationNotPossible, match=f"^{refusal}$"):
        lm.migrator.live_migrate(INSTANCE, target)
    assert lm.runs == [] and lm.hosts.asked == []


def test_a_target_without_room_is_refused(lm):
    lm.placement.room = []
    with pytest.raises(LiveMigrationNotPossible, match=(
            f"^--target: b has no room for instance {INSTANCE} with each device on its "
            r"CPUs' NUMA cell \(allocation candidates\)$")):
        lm.migrator.live_migrate(INSTANCE, "b")
    assert lm.runs == []


def test_a_candidate_not_wholly_on_the_target_s_tree_is_passed_over(lm, monkeypatch):
    """With a sharing provider (a storage pool in an aggregate), a
    candidate can reach beyond the tree asked for."""
    shared = lm.placement.add(str(uuid_lib.uuid4()), "nfs-pool")
    candidates = lm.placement.get_allocation_candidates

    def with_a_sharing_provider(query):
        found = candidates(query)
        found["allocation_requests"].insert(0, {"allocations": {
            B_CELL: {"resources": HELD}, shared: {"resources": {"DISK_GB": 10}}}})
        found["provider_summaries"][shared] = {"root_provider_uuid": shared}
        return found

    monkeypatch.setattr(lm.placement, "get_allocation_candidates", with_a_sharing_provider)
    lm.migrator.live_migrate(INSTANCE, "b")
    [run] = lm.runs
    assert run[4] == {B_CELL: {"resources": HELD}}


def test_an_instance_placement_has_nowhere_or_on_two_hosts_is_refused(lm):
    nowhere = str(uuid_lib.uuid4())
    with pytest.raises(LiveMigrationNotPossible,
                       match=f"^INSTANCE: {nowhere} holds no allocations in Placement$"):
        lm.migrator.live_migrate(nowhere, "b")
    lm.placement.consumers[INSTANCE].allocations[B_CELL] = {"VCPU": 1}
    with pytest.raises(LiveMigrationNotPossible, match=(
            f"^INSTANCE: {INSTANCE} holds allocations on 2 hosts: it is in a move "
            "already$")):
        lm.migrator.live_migrate(INSTANCE, "b")
    assert lm.runs == []


def left_unknown(lm: Migrator) -> str:
    """What a run whose outcome was unknown left: the migration holds the
    source's allocations, the instance the destination's."""
    migration = str(uuid_lib.uuid4())
    lm.placement.consumers[migration] = Held({A_CELL: dict(HELD)}, "MIGRATION")
    lm.placement.consumers[INSTANCE] = Held({B_CELL: dict(HELD)})
    return migration


@pytest.mark.parametrize("has, spec_from", [({"a", "b"}, "a"), ({"b"}, "b")])
def test_a_move_left_unknown_is_resumed_from_where_its_allocations_are(lm, has, spec_from):
    """The source is where the migration holds allocations; the guest may
    have left it, and its spec is then the destination's."""
    migration = left_unknown(lm)
    lm.hosts.has = has
    moved = lm.migrator.live_migrate(INSTANCE, "b", migration)
    assert lm.runs == [(INSTANCE, "a", "b", SPEC, {B_CELL: {"resources": HELD}}, migration)]
    assert moved["migration"] == migration and moved["source"] == "a"
    assert lm.hosts.asked[-1] == spec_from
    # No new candidates: the destination's allocations are those written.
    assert not [r for r in lm.placement.requests if r.startswith("GET /allocation_c")]


def test_a_move_resumed_towards_its_own_source_is_refused(lm):
    migration = left_unknown(lm)
    with pytest.raises(LiveMigrationNotPossible, match=(
            f"^--migration: {migration} moves instance {INSTANCE} away from a, not to "
            "it$")):
        lm.migrator.live_migrate(INSTANCE, "a", migration)
    assert lm.runs == []


def test_a_migration_uuid_that_holds_nothing_names_a_new_move(lm):
    migration = str(uuid_lib.uuid4())
    lm.migrator.live_migrate(INSTANCE, "b", migration)
    [run] = lm.runs
    assert run[1:3] == ("a", "b") and run[-1] == migration
