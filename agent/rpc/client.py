"""The client conductors import: one method per RPC, with timeouts and a
version cap for rolling upgrades, plus the allocation-swap helper.

    api = ComputeAgentAPI(conf)
    api.build_instance("host-1", instance_uuid, spec, allocations)

Errors arrive as the agent's own types (agent.exception): InvalidRequest,
NoSuchInstance, ClaimFailed, MoveInProgress, StoreUnavailable and
InternalError. A call newer than the client's version cap is refused here,
before it is sent, with VersionCapped. A call that gets no answer within
its timeout raises oslo.messaging's MessagingTimeout (NoAnswer, naming the
host), also while the broker cannot be reached (BrokerUnreachable): the
call may or may not have been done, and every call is safe to retry with
the same uuids.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid as uuid_lib
from contextlib import contextmanager
from enum import Enum
from typing import Callable

from kombu.exceptions import OperationalError

from agent.rpc import broker
from agent.claims.model import MigrationState
from agent.dependencies import describe
from agent.exception import (AgentError, CallFailed, GenerationConflict, InvalidRequest,
                             LiveMigrationFailed,
                             LiveMigrationOutcomeUnknown, LiveMigrationRefused,
                             MoveInProgress, NoSuchInstance, VersionCapped)
from agent.messaging import TOPIC, messaging, transport
from agent.placement.client import PlacementClient
from agent.rpc.versions import OLDEST, VERSION
from agent.reports.status import Probe
from drivers.base import MigrationFailure
from agent.rpc.errors import BrokerDown, BrokerUnreachable, NoAnswer

LOG = logging.getLogger(__name__)

# oslo.messaging retries a send for ever by default, blocking the caller
# for as long as the broker is away, its timeout not yet started. A call
# here sends once (no reconnection attempts: the driver's back-off would
# sleep a second or more between them), and again after a pause, while
# its timeout lasts.
SEND_RETRIES = 0
RESEND_PAUSE_SECONDS = 0.5


# What a send that did not reach the broker raises: oslo.messaging's error
# once its attempts are spent, kombu's when the driver had no connection to
# the broker yet (the rabbit driver lets it through), or ours.
NOT_SENT = (messaging.MessageDeliveryFailure, OperationalError, BrokerDown)


class OutstandingCalls:
    """The calls one or more clients have sent and not had answered, for a
    caller's watchdog: how long the oldest has waited, or, with none
    outstanding, how long since the last answer. A command that makes many
    calls (an evacuation) is stuck only when one call outlives its timeout,
    not when the calls together take longer than one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._started: dict[int, float] = {}
        self._last_answer = time.monotonic()

    @contextmanager
    def one(self):
        with self._lock:
            call = next(self._ids)
            self._started[call] = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                del self._started[call]
                self._last_answer = time.monotonic()

    def waiting_for(self) -> float:
        """Seconds since the oldest outstanding call was sent, or, with
        none outstanding, since the last answer (or since this began)."""
        with self._lock:
            since = min(self._started.values(), default=self._last_answer)
        return time.monotonic() - since

    def any(self) -> bool:
        with self._lock:
            return bool(self._started)


class ComputeAgentAPI:
    def __init__(self, conf, timeout: float = 60,
                 outstanding: OutstandingCalls | None = None):
        """``conf`` has the agent's options registered (agent.config).
        ``outstanding`` is shared by clients one watchdog looks after."""
        self.timeout = timeout
        self.outstanding = outstanding or OutstandingCalls()
        self._conf = conf
        # A client's first call opens the connection its answers come back
        # on, with no bound on its attempts: until then each call asks the
        # broker first (agent/rpc/broker.py).
        self._answers_connected = False
        self.client = messaging.get_rpc_client(
            transport(conf), messaging.Target(topic=TOPIC, version=VERSION),
            version_cap=conf.upgrade_levels.compute_agent or VERSION, timeout=timeout,
            retry=SEND_RETRIES)

    def close(self) -> None:
        """Close the connection to the broker."""
        self.client.transport.cleanup()

    def can_send(self, version: str) -> bool:
        """Whether the version cap lets calls of API ``version`` go."""
        return self.client.can_send_version(version)

    def _call(self, host: str, method: str, version: str = OLDEST,
              timeout: float | None = None, **payload):
        """Send ``method``, which appeared in API ``version``."""
        if not self.client.can_send_version(version):
            raise VersionCapped(method, version, self.client.version_cap)
        with self.outstanding.one():
            return self._send(host, method, version, timeout or self.timeout, payload)

    def _send(self, host: str, method: str, version: str, timeout: float,
              payload: dict):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                if not self._answers_connected:
                    self._broker_answers(max(left, RESEND_PAUSE_SECONDS))
                prepared = self.client.prepare(
                    server=host, version=version, timeout=max(left, RESEND_PAUSE_SECONDS))
                try:
                    return prepared.call({}, method, **payload)
                except messaging.MessagingTimeout:
                    raise NoAnswer(host, method, timeout) from None
                finally:
                    self._answers_connected = True
            except NOT_SENT as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerUnreachable(
                        f"{method} to {host}: the message broker did not take it "
                        f"within {timeout:g}s ({e})") from None
            time.sleep(min(RESEND_PAUSE_SECONDS, left))

    def _broker_answers(self, timeout: float) -> None:
        answer = broker.probe(self._conf, timeout)
        if isinstance(answer, Probe) and answer.problem is not None:
            raise BrokerDown(describe(answer.dependency, answer.url, answer.problem))

    # introspection
    def get_host_info(self, host: str) -> dict:
        return self._call(host, "get_host_info")

    def get_provider_tree(self, host: str) -> list[dict]:
        return self._call(host, "get_provider_tree")

    def get_instance(self, host: str, instance_uuid: str) -> dict:
        return self._call(host, "get_instance", instance_uuid=instance_uuid)

    def list_instances(self, host: str) -> list[dict]:
        """Every instance ``host`` holds: uuid, name, state (building,
        active, moving) and the open move's uuid. Needs API 1.1."""
        return self._call(host, "list_instances", version="1.1")

    # build and delete
    def build_instance(self, host: str, instance_uuid: str, spec: dict,
                       allocations: dict) -> dict:
        return self._call(host, "build_instance", instance_uuid=instance_uuid,
                          spec=spec, allocations=allocations)

    def delete_instance(self, host: str, instance_uuid: str) -> dict:
        return self._call(host, "delete_instance", instance_uuid=instance_uuid)

    # moves: the destination's claims
    def prep_resize(self, host, migration_uuid, instance_uuid, spec, allocations):
        return self._call(host, "prep_resize", migration_uuid=migration_uuid,
                          instance_uuid=instance_uuid, spec=spec,
                          allocations=allocations)

    def check_can_live_migrate_destination(self, host, migration_uuid, instance_uuid,
                                           spec, allocations):
        return self._call(host, "check_can_live_migrate_destination",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          spec=spec, allocations=allocations)

    def rebuild_instance(self, host, migration_uuid, instance_uuid, spec, allocations,
                         source_host: str | None = None, force: bool = False):
        """Without ``source_host`` (1.0): claim, build, settle, then answer.
        With it (1.3): ``source_host`` is asserted down, which ``host``
        checks by its heartbeat (SourceHostUp when it answers) unless
        ``force``; answered once the claim is on disk, the guest built
        after."""
        if source_host is None:
            return self._call(host, "rebuild_instance", migration_uuid=migration_uuid,
                              instance_uuid=instance_uuid, spec=spec,
                              allocations=allocations)
        return self._call(host, "rebuild_instance", version="1.3",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          spec=spec, allocations=allocations, source_host=source_host,
                          force=force)

    # moves: steps that name the move and the instance
    def _move(self, method: str, host: str, migration_uuid: str, instance_uuid: str):
        return self._call(host, method, migration_uuid=migration_uuid,
                          instance_uuid=instance_uuid)

    def resize_instance(self, host, migration_uuid, instance_uuid):
        return self._move("resize_instance", host, migration_uuid, instance_uuid)

    def finish_resize(self, host, migration_uuid, instance_uuid):
        return self._move("finish_resize", host, migration_uuid, instance_uuid)

    def confirm_resize(self, host, migration_uuid, instance_uuid):
        return self._move("confirm_resize", host, migration_uuid, instance_uuid)

    def revert_resize(self, host, migration_uuid, instance_uuid):
        return self._move("revert_resize", host, migration_uuid, instance_uuid)

    def check_can_live_migrate_source(self, host, migration_uuid, instance_uuid,
                                      destination_host: str):
        """The source refuses what cannot move from it, or records the move
        as announced; first of a live migration's steps, before the
        allocation swap. Needs API 1.4."""
        return self._call(host, "check_can_live_migrate_source", version="1.4",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          destination_host=destination_host)

    def rollback_live_migration_at_source(self, host, migration_uuid, instance_uuid):
        """The source ends the move; the guest stays. Needs API 1.4."""
        return self._call(host, "rollback_live_migration_at_source", version="1.4",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid)

    def live_migrate(self, host, migration_uuid, instance_uuid, destination: dict,
                     timeout: float | None = None):
        """The source migrates the guest; ``destination``: the ``claimed``
        and ``migration_uri`` of the destination's answer to
        check_can_live_migrate_destination. Needs API 1.2. Idempotent: a
        retry of a migration that is done answers "migrated", of one under
        way MoveInProgress, of one that failed or was rolled back
        InvalidRequest."""
        return self._call(host, "live_migrate", version="1.2", timeout=timeout,
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          destination=destination)

    def post_live_migration_at_destination(self, host, migration_uuid, instance_uuid):
        return self._move("post_live_migration_at_destination", host, migration_uuid,
                          instance_uuid)

    def rollback_live_migration_at_destination(self, host, migration_uuid,
                                               instance_uuid):
        return self._move("rollback_live_migration_at_destination", host,
                          migration_uuid, instance_uuid)


def move_allocations(placement: PlacementClient, source_consumer: str,
                     target_consumer: str, target_type: str = "MIGRATION",
                     attempts: int = 4, replacement: dict | None = None) -> dict:
    """Move every allocation of one consumer to another in one
    ``POST /allocations``, guarded by both consumer generations: the
    instance's to its migration when a move starts (nova's allocation swap),
    and the migration's back to the instance on revert. Returns what moved.
    ``replacement``: the allocations the source consumer holds instead, in
    the same request (an evacuation's destination), none by default.
    """
    for attempt in range(attempts):
        source = placement.get_consumer_allocations(source_consumer)
        target = placement.get_consumer_allocations(target_consumer)
        moving = {rp: {"resources": a["resources"]}
                  for rp, a in source["allocations"].items()}
        body = {
            source_consumer: {
                "allocations": replacement or {}, "project_id": source["project_id"],
                "user_id": source["user_id"],
                "consumer_generation": source["consumer_generation"],
                "consumer_type": source.get("consumer_type", "INSTANCE")},
            target_consumer: {
                "allocations": moving, "project_id": source["project_id"],
                "user_id": source["user_id"],
                "consumer_generation": target.get("consumer_generation"),
                "consumer_type": target_type},
        }
        try:
            placement.post_allocations(body)
            return moving
        except GenerationConflict:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


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
    announced = api.can_send("1.4")
    if announced:
        try:
            recorded = api.check_can_live_migrate_source(source, migration,
                                                         instance_uuid, destination)
        except InvalidRequest:
            # A first run's refusal leaves nothing to undo anywhere; a
            # rerun's may find what an earlier run left.
            if migration_uuid is not None:
                _undo_if_rolled_back_at_source(api, placement, instance_uuid, source,
                                               destination, migration)
            raise
        if recorded["state"] == MigrationState.CONFIRMED.value:
            # An earlier run lost the source's answer; the guest left it.
            return _settle(api, placement, instance_uuid, destination, migration)
    swapped = claimed = None
    claim_asked = False

    def roll_back(claim_unanswered: bool = False) -> None:
        if claimed is not None:
            api.rollback_live_migration_at_destination(destination, migration,
                                                       instance_uuid)
        elif claim_unanswered:
            _give_back_unanswered_claim(api, instance_uuid, destination, migration)
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
    step, answer = _ask_source(api, instance_uuid, source, migration,
                               {"claimed": claimed["claimed"],
                                "migration_uri": claimed["migration_uri"]},
                               outcome_wait, ask_pause)
    if step is NextStep.ROLL_BACK:
        roll_back()
        raise answer
    if step is NextStep.LEAVE_AS_IS:
        last = (f"{type(answer).__name__}: {answer}" if isinstance(answer, Exception)
                else f"answered {answer!r}")
        raise LiveMigrationOutcomeUnknown(instance_uuid, migration, source, destination,
                                          " ".join(last.split())[:300]) from None
    return _settle(api, placement, instance_uuid, destination, migration)


def answer_lost(error: Exception) -> bool:
    """Whether a call that raised ``error`` may have done its work: no
    answer came (a timeout, the broker), or the agent failed while at it
    (CallFailed: its store, an unforeseen error). Its refusals did nothing."""
    return (isinstance(error, (messaging.MessagingTimeout, CallFailed))
            or not isinstance(error, AgentError))


def _give_back_unanswered_claim(api: ComputeAgentAPI, instance_uuid: str,
                                destination: str, migration: str) -> None:
    """The destination's claim may have been made with its answer lost: its
    rollback, asked once. A destination that never heard of the move
    refuses, which is as good; one that does not answer keeps the claim
    (the safe side: a rerun of the same migration gives it back), said in
    one line."""
    answer = answer_of(lambda: api.rollback_live_migration_at_destination(
        destination, migration, instance_uuid))
    if isinstance(answer, Exception) and not isinstance(answer, REFUSED_BEFORE_MOVING):
        LOG.warning("Live migration %s of instance %s: the claim at %s may stay until "
                    "the migration is run again (%s)", migration, instance_uuid,
                    destination, type(answer).__name__)


def _ask_source(api: ComputeAgentAPI, instance_uuid: str, source: str, migration: str,
                destination: dict, outcome_wait: float, ask_pause: float
                ) -> tuple[NextStep, dict | Exception]:
    """live_migrate at the source, asked again while its answer does not
    say where the guest is, for up to ``outcome_wait`` seconds after the
    first answer. Returns what to do and the last answer."""
    answer = answer_of(lambda: api.live_migrate(source, migration, instance_uuid,
                                                destination))
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
        answer = answer_of(lambda: api.live_migrate(
            source, migration, instance_uuid, destination,
            timeout=min(timeout, api.timeout)))


def _settle(api: ComputeAgentAPI, placement: PlacementClient, instance_uuid: str,
            destination: str, migration: str) -> dict:
    """The guest left the source: the destination settles its claim, the
    migration's allocations (the source's side) go. Both idempotent."""
    arrived = api.post_live_migration_at_destination(destination, migration,
                                                     instance_uuid)
    _write_allocations(placement, migration, migration, {}, "MIGRATION")
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
                                   instance_uuid: str, source: str, destination: str,
                                   migration: str) -> None:
    """When the source rolled the move back (its guest stayed), what an
    earlier run left goes: the destination's claim, the migration's
    allocations."""
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
