"""The conductor's side of one live migration, as ``compute-agent-ctl
live-migrate INSTANCE --target HOST`` runs it.

1. The source is where Placement has the instance: the one host whose tree
   holds all its allocations (a host's root provider is named after it).
   An instance whose allocations span two hosts is in a move already.
2. Its spec (name, vCPUs, memory) is the source agent's, which is up: a
   live migration moves a running guest.
3. The destination's allocations come from ``GET /allocation_candidates``
   restricted to the target's tree, asking for what the instance holds
   with each device kept on one NUMA cell with its CPUs (``same_subtree``,
   the request an evacuation makes: compute_agent/moves/evacuation.py).
4. live_migrate_instance (below; conductors import it from compute_agent.rpcapi)
   does the rest, in the order of RPC API 1.4: the source is told, the
   allocations swapped, the destination claims, the source migrates, the
   destination settles; or all of it is rolled back. Whatever the source's
   answer, the outcome is judged by two pure rules, live_migrate_outcome
   and next_step, and a destination is never rolled back while the guest
   may run there.
"""
from __future__ import annotations

import logging
import time
import uuid as uuid_lib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import partial

import os_traits

from compute_agent.claims.model import MigrationState
from compute_agent.conductor.errors import LiveMigrationNotPossible
from compute_agent.conductor.source_tree import read_device_traits, read_source_tree
from compute_agent.drivers.base import MigrationFailure
from compute_agent.exception import (
    AgentError,
    CallFailed,
    InvalidRequest,
    LiveMigrationFailed,
    LiveMigrationOutcomeUnknown,
    LiveMigrationRefused,
    MoveInProgress,
    NoSuchInstance,
    VersionCapped,
)
from compute_agent.messaging import messaging
from compute_agent.moves.request import candidate_root, move_request
from compute_agent.placement.allocations import move_allocations
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI

LOG = logging.getLogger(__name__)


class MoveOutcome(str, Enum):
    """What the source's answer to live_migrate says became of the guest."""

    MIGRATED = "migrated"  # it left the source, which gave its devices back
    STAYED = "stayed"  # it runs on the source with its devices: nothing moved
    MIGRATING = "migrating"  # the source is migrating it now
    UNKNOWN = "unknown"  # no answer, or one that does not say where it runs


class NextStep(str, Enum):
    """What the conductor does about a live migration's outcome."""

    SETTLE = "settle"  # the destination settles, the migration's allocations go
    ROLL_BACK = "roll_back"  # the destination's claim goes, the allocations return
    ASK_AGAIN = "ask_again"  # live_migrate again (idempotent), after a pause
    # Nothing undone: undoing the destination while the guest may run there
    # would hand its devices to a second guest.
    LEAVE_AS_IS = "leave_as_is"


# The source's refusals of live_migrate: each is raised before the guest
# moves (the pre-check, the payload, a move rolled back already).
REFUSED_BEFORE_MOVING = (LiveMigrationRefused, InvalidRequest, NoSuchInstance,
                         VersionCapped)


def live_migrate_outcome(answer: dict | BaseException, migration_uuid: str
                         ) -> MoveOutcome:
    """The outcome the source's ``answer`` to live_migrate of
    ``migration_uuid`` (its result, or what the call raised) stands for.
    Only what the source itself says moves the outcome off UNKNOWN: a
    timeout, a failing store or an unforeseen error may come after the
    guest left."""
    if isinstance(answer, dict):
        return (MoveOutcome.MIGRATED if answer.get("state") == "migrated"
                else MoveOutcome.UNKNOWN)
    if isinstance(answer, MoveInProgress):
        # Another move of the instance holds it: this one never started.
        return (MoveOutcome.MIGRATING if answer.migration_uuid == migration_uuid
                else MoveOutcome.STAYED)
    if isinstance(answer, LiveMigrationFailed):
        return (MoveOutcome.UNKNOWN
                if answer.cause == MigrationFailure.OUTCOME_UNKNOWN.value
                else MoveOutcome.STAYED)
    if isinstance(answer, REFUSED_BEFORE_MOVING):
        return MoveOutcome.STAYED
    return MoveOutcome.UNKNOWN


def next_step(outcome: MoveOutcome, time_left: bool) -> NextStep:
    """What to do about ``outcome``; ``time_left``: whether the conductor
    may still wait for the source to say more."""
    if outcome is MoveOutcome.MIGRATED:
        return NextStep.SETTLE
    if outcome is MoveOutcome.STAYED:
        return NextStep.ROLL_BACK
    return NextStep.ASK_AGAIN if time_left else NextStep.LEAVE_AS_IS


# How long a conductor asks a source that has not said what became of a
# live migration (libvirt's own migrations of a busy guest take minutes),
# and how often.
OUTCOME_WAIT_SECONDS = 300.0
ASK_PAUSE_SECONDS = 1.0
# The least time one ask is given, however little of the wait is left.
ASK_TIMEOUT_FLOOR_SECONDS = 1.0


@dataclass(frozen=True)
class LiveMove:
    """One live migration, as each of its steps names it: the instance, the
    migration's uuid, and the hosts the guest leaves and goes to."""

    instance_uuid: str
    migration: str
    source: str
    destination: str


def answer_of(call: Callable[[], dict]) -> dict | Exception:
    """What ``call`` returned or raised."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - every answer is judged by the rule
        return e


def live_migrate_instance(api: ComputeAgentAPI, placement: PlacementClient,
                          instance_uuid: str, source: str, destination: str, spec: dict,
                          allocations: dict, migration_uuid: str | None = None,
                          outcome_wait: float = OUTCOME_WAIT_SECONDS,
                          ask_pause: float = ASK_PAUSE_SECONDS) -> dict:
    """A conductor's whole live migration of one instance, as nova's
    conductor runs it: the source checks and records the move as announced
    (check_can_live_migrate_source, API 1.4; skipped when the version cap
    is older); the instance's allocations pass to the migration (the
    source's side) and ``allocations`` on the destination's providers are
    written for the instance; the destination claims and answers
    (check_can_live_migrate_destination); the source migrates the running
    guest and gives its devices back; the destination settles its claim;
    the migration's allocations go.

    When a step before the migration is refused or fails, or the source
    says the guest stayed, the destination's claim is rolled back, the
    allocations return to the source, then the source ends its move, and
    the error is raised as the agent sent it. When the source's answer to
    live_migrate does not say where the guest is (lost, or the hypervisor
    could not tell), the source is asked again (live_migrate is
    idempotent) for up to ``outcome_wait`` seconds: a guest that left is
    settled on the destination; past the wait nothing is undone and
    LiveMigrationOutcomeUnknown is raised.

    Run again with the same ``migration_uuid``, it resumes: a move the
    source has done is settled, one under way is asked after, one the
    source rolled back is rolled back here too. Returns the instance as
    the destination reports it."""
    migration = migration_uuid or str(uuid_lib.uuid4())
    move = LiveMove(instance_uuid, migration, source, destination)
    announced = api.can_send("1.4")
    if announced:
        try:
            recorded = api.check_can_live_migrate_source(source, migration,
                                                         instance_uuid, destination)
        except InvalidRequest:
            # A first run's refusal leaves nothing to undo anywhere; a
            # rerun's may find what an earlier run left.
            if migration_uuid is not None:
                _undo_if_rolled_back_at_source(api, placement, move)
            raise
        if recorded["state"] == MigrationState.CONFIRMED.value:
            # An earlier run lost the source's answer; the guest left it.
            return _settle(api, placement, move)
    swapped = claimed = None
    claim_asked = False

    def roll_back(claim_unanswered: bool = False) -> None:
        if claimed is not None:
            api.rollback_live_migration_at_destination(destination, migration,
                                                       instance_uuid)
        elif claim_unanswered:
            _give_back_unanswered_claim(api, move)
        # The allocations return before the source ends the move: a source
        # restarting in between must find the instance's allocations on its
        # own providers or the move still open, never neither (it would take
        # the instance for evacuated).
        if swapped is not None:
            move_allocations(placement, migration, instance_uuid, "INSTANCE")
        if announced:
            api.rollback_live_migration_at_source(source, migration, instance_uuid)

    try:
        swapped = _swap_once(placement, instance_uuid, migration)
        _write_allocations(placement, instance_uuid, migration, allocations)
        claim_asked = True
        claimed = api.check_can_live_migrate_destination(
            destination, migration, instance_uuid, spec, allocations)
    except Exception as e:
        roll_back(claim_unanswered=claim_asked and answer_lost(e))
        raise
    step, answer = _ask_source(api, move,
                               {"claimed": claimed["claimed"],
                                "migration_uri": claimed["migration_uri"]},
                               outcome_wait, ask_pause)
    if step is NextStep.ROLL_BACK:
        roll_back()
        assert isinstance(answer, Exception)  # it stayed: only a refusal says so
        raise answer
    if step is NextStep.LEAVE_AS_IS:
        last = (f"{type(answer).__name__}: {answer}" if isinstance(answer, Exception)
                else f"answered {answer!r}")
        raise LiveMigrationOutcomeUnknown(instance_uuid, migration, source, destination,
                                          " ".join(last.split())[:300]) from None
    return _settle(api, placement, move)


def answer_lost(error: Exception) -> bool:
    """Whether a call that raised ``error`` may have done its work: no
    answer came (a timeout, the broker), or the agent failed while at it
    (CallFailed: its store, an unforeseen error). Its refusals did nothing."""
    return (isinstance(error, (messaging.MessagingTimeout, CallFailed))
            or not isinstance(error, AgentError))


def _give_back_unanswered_claim(api: ComputeAgentAPI, move: LiveMove) -> None:
    """The destination's claim may have been made with its answer lost: its
    rollback, asked once. A destination that never heard of the move
    refuses, which is as good; one that does not answer keeps the claim
    (the safe side: a rerun of the same migration gives it back), said in
    one line."""
    answer = answer_of(lambda: api.rollback_live_migration_at_destination(
        move.destination, move.migration, move.instance_uuid))
    if isinstance(answer, Exception) and not isinstance(answer, REFUSED_BEFORE_MOVING):
        LOG.warning("Live migration %s of instance %s: the claim at %s may stay until "
                    "the migration is run again (%s)", move.migration, move.instance_uuid,
                    move.destination, type(answer).__name__)


def _ask_source(api: ComputeAgentAPI, move: LiveMove, claimed: dict, outcome_wait: float,
                ask_pause: float) -> tuple[NextStep, dict | Exception]:
    """live_migrate at the source, with what the destination ``claimed``,
    asked again while its answer does not say where the guest is, for up
    to ``outcome_wait`` seconds after the first answer. Returns what to do
    and the last answer."""
    source, migration, instance_uuid = move.source, move.migration, move.instance_uuid
    answer = answer_of(lambda: api.live_migrate(source, migration, instance_uuid, claimed))
    deadline = time.monotonic() + outcome_wait
    while True:
        outcome = live_migrate_outcome(answer, migration)
        left = deadline - time.monotonic()
        step = next_step(outcome, left > 0)
        if step is not NextStep.ASK_AGAIN:
            return step, answer
        LOG.warning("Live migration %s of instance %s: %s at %s (%s); asking again, "
                    "%.0f s left", migration, instance_uuid, outcome.value, source,
                    type(answer).__name__, left)
        time.sleep(min(ask_pause, left))
        timeout = max(deadline - time.monotonic(), ASK_TIMEOUT_FLOOR_SECONDS)
        answer = answer_of(partial(api.live_migrate, source, migration, instance_uuid,
                                   claimed, timeout=min(timeout, api.timeout)))


def _settle(api: ComputeAgentAPI, placement: PlacementClient, move: LiveMove) -> dict:
    """The guest left the source: the destination settles its claim, the
    migration's allocations (the source's side) go. Both idempotent."""
    arrived = api.post_live_migration_at_destination(move.destination, move.migration,
                                                     move.instance_uuid)
    _write_allocations(placement, move.migration, move.migration, {}, "MIGRATION")
    return arrived


def _swap_once(placement: PlacementClient, instance_uuid: str, migration: str) -> dict:
    """The instance's allocations passed to the migration, unless an earlier
    run of the same migration did so (the migration holds allocations):
    swapping again would hand it the destination's. Returns what it holds."""
    held = placement.get_consumer_allocations(migration)["allocations"]
    if held:
        return {rp: {"resources": a["resources"]} for rp, a in held.items()}
    return move_allocations(placement, instance_uuid, migration)


def _undo_if_rolled_back_at_source(api: ComputeAgentAPI, placement: PlacementClient,
                                   move: LiveMove) -> None:
    """When the source rolled the move back (its guest stayed), what an
    earlier run left goes: the destination's claim, the migration's
    allocations."""
    instance_uuid, migration = move.instance_uuid, move.migration
    source, destination = move.source, move.destination
    moves = {m["uuid"]: m["state"]
             for m in api.get_instance(source, instance_uuid)["migrations"]}
    if moves.get(migration) != MigrationState.REVERTED.value:
        return
    try:
        there = api.get_instance(destination, instance_uuid)["migrations"]
    except NoSuchInstance:  # never claimed there, or given back already
        there = []
    if any(m["uuid"] == migration and m["state"] == MigrationState.ACTIVE.value
           for m in there):
        api.rollback_live_migration_at_destination(destination, migration,
                                                   instance_uuid)
    if placement.get_consumer_allocations(migration)["allocations"]:
        move_allocations(placement, migration, instance_uuid, "INSTANCE")


def _write_allocations(placement: PlacementClient, consumer: str, owner_of: str,
                       allocations: dict, consumer_type: str = "INSTANCE") -> None:
    """``consumer``'s allocations replaced by ``allocations`` (none: removed),
    for the project and user ``owner_of``'s allocations name."""
    owner = placement.get_consumer_allocations(owner_of)
    current = placement.get_consumer_allocations(consumer)
    placement.post_allocations({consumer: {
        "allocations": allocations, "project_id": owner["project_id"],
        "user_id": owner["user_id"],
        "consumer_generation": current.get("consumer_generation"),
        "consumer_type": consumer_type}})


class LiveMigrator:
    def __init__(self, placement: PlacementClient, api: ComputeAgentAPI):
        self.placement = placement
        self.api = api

    def _provider(self, uuid: str) -> dict:
        (found,) = self.placement.get_providers(uuid=uuid)
        return found

    def _root_named(self, host: str) -> str | None:
        roots = self.placement.get_providers(name=host, required=os_traits.COMPUTE_NODE)
        return roots[0]["uuid"] if roots else None

    def source_of(self, instance_uuid: str, field: str = "INSTANCE"
                  ) -> tuple[str, str, dict[str, dict[str, int]]]:
        """The host Placement has the instance (or the consumer ``field``
        names) on, its root provider, and its allocations there
        (provider -> class -> amount)."""
        held = self.placement.get_consumer_allocations(instance_uuid)
        allocations = {rp: dict(a["resources"]) for rp, a in held["allocations"].items()}
        if not allocations:
            raise LiveMigrationNotPossible(field, instance_uuid,
                                           "holds no allocations in Placement")
        roots = {self._provider(rp)["root_provider_uuid"] for rp in allocations}
        if len(roots) != 1:
            raise LiveMigrationNotPossible(
                field, instance_uuid, f"holds allocations on {len(roots)} hosts: "
                "it is in a move already")
        root = roots.pop()
        return self._provider(root)["name"], root, allocations

    def destination_allocations(self, instance_uuid: str,
                                allocations: dict[str, dict[str, int]],
                                source_root: str, target: str, target_root: str) -> dict:
        """Allocations on the target's tree for what the instance holds, in
        Placement's shape; LiveMigrationNotPossible when it has no room."""
        source_tree = read_source_tree(self.placement, source_root)
        read_device_traits(self.placement, source_tree, allocations)
        request = move_request(allocations, source_tree)
        found = self.placement.get_allocation_candidates(
            request.query(in_tree=target_root))
        tree_of = {rp: s["root_provider_uuid"]
                   for rp, s in found.get("provider_summaries", {}).items()}
        for candidate in found["allocation_requests"]:
            if candidate_root(candidate, tree_of) == target_root:
                return candidate["allocations"]
        raise LiveMigrationNotPossible(
            "--target", target, f"has no room for instance {instance_uuid} with each "
            "device on its CPUs' NUMA cell (allocation candidates)")

    def live_migrate(self, instance_uuid: str, target: str,
                     migration_uuid: str | None = None) -> dict:
        """Move the running instance to ``target``; the agents' refusals and
        failures are raised as they sent them, after the rollback. With the
        ``migration_uuid`` of a run whose outcome was unknown, that move is
        resumed: it is settled or rolled back."""
        migration = migration_uuid or str(uuid_lib.uuid4())
        if migration_uuid is not None and self.placement.get_consumer_allocations(
                migration)["allocations"]:
            return self._resume(instance_uuid, target, migration)
        source, source_root, allocations = self.source_of(instance_uuid)
        if target == source:
            raise LiveMigrationNotPossible("--target", target, "is the instance's "
                                           "host already")
        target_root = self._root_named(target)
        if target_root is None:
            raise LiveMigrationNotPossible("--target", target,
                                           "is no compute host in Placement")
        spec = self.api.get_instance(source, instance_uuid)["spec"]
        wanted = self.destination_allocations(instance_uuid, allocations, source_root,
                                              target, target_root)
        return self._run(LiveMove(instance_uuid, migration, source, target), spec, wanted)

    def _resume(self, instance_uuid: str, target: str, migration: str) -> dict:
        """A move an earlier run started (the allocation swap gave the
        migration the source's allocations) and left with its outcome
        unknown: the source is where the migration's allocations are, the
        destination's allocations the instance's own, as that run wrote
        them."""
        source, _, _ = self.source_of(migration, "--migration")
        if source == target:
            raise LiveMigrationNotPossible("--migration", migration,
                                           f"moves instance {instance_uuid} away from "
                                           f"{target}, not to it")
        wanted = {rp: {"resources": a["resources"]} for rp, a in
                  self.placement.get_consumer_allocations(instance_uuid)
                  ["allocations"].items()}
        try:
            spec = self.api.get_instance(source, instance_uuid)["spec"]
        except NoSuchInstance:  # the source gave it up: the guest left it
            spec = self.api.get_instance(target, instance_uuid)["spec"]
        return self._run(LiveMove(instance_uuid, migration, source, target), spec, wanted)

    def _run(self, move: LiveMove, spec: dict, wanted: dict) -> dict:
        arrived = live_migrate_instance(self.api, self.placement, move.instance_uuid,
                                        move.source, move.destination, spec, wanted,
                                        move.migration)
        return {"instance": move.instance_uuid, "source": move.source,
                "destination": move.destination, "migration": move.migration,
                "running": arrived["running"]}
