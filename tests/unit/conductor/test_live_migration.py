"""The conductor's side of a live migration (compute_agent/conductor/
live_migration.py), driving recorders for Placement and the agents: the
order of its steps (the source told before the swap, RPC API 1.4) and of
their rollback; then issue 14, a live migration whose source's answer is
lost: the rule (which outcome the source's answer stands for, and what the
conductor does about it) on its own, then the helper asking the source
again instead of rolling back, leaving everything as it is when the source
never says, and finishing the move when rerun with the same migration
uuid."""
from __future__ import annotations

import pytest
from oslo_messaging import MessagingTimeout, RemoteError

from compute_agent.claims.model import MigrationRole
from compute_agent.conductor.live_migration import (
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
