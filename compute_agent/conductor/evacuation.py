"""The conductor's side of an evacuation, and of telling hosts apart by
their heartbeat: what ``compute-agent-ctl hosts`` and ``evacuate`` do.

Evacuating a down SOURCE, instance by instance:

1. Its instances are the INSTANCE consumers holding allocations on its
   tree; the spec each needs is derived from those allocations
   (compute_agent/moves/evacuation.py), so nothing of the dead host is needed.
2. A destination from ``GET /allocation_candidates``, one request per
   instance, with each device kept on one NUMA cell with its CPUs
   (``same_subtree``), on an up host other than the source.
3. One ``POST /allocations`` (the allocation-swap helper): the migration
   consumer takes the source's allocations, the instance the destination's.
4. ``rebuild_instance`` (1.3) to the destination, naming the source; it
   answers once the move and the claim are on its disk, and owns the
   rebuild from then on. A refusal moves the allocations back: the instance
   stays recorded on the source.
5. Progress: each accepted instance, until its guest runs.

Run again, it finds only migration consumers on the source: nothing is
evacuated twice.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from functools import partial

import os_traits

from compute_agent.conductor.errors import NoSuchHost
from compute_agent.conductor.source_tree import read_device_traits, read_source_tree
from compute_agent.exception import AgentError, NoSuchInstance, PlacementError, SourceHostUp
from compute_agent.messaging import messaging
from compute_agent.moves.evacuation import (
    DestinationRecord,
    InterruptedEvacuation,
    destination_record,
    evacuation_migration_uuid,
    interrupted_evacuations,
    spec_from_allocations,
)
from compute_agent.moves.request import SourceProvider, candidate_root, move_request
from compute_agent.placement.allocations import move_allocations, tree_allocations
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.heartbeat import Heartbeat, Liveness

# A consumer's allocations: provider uuid -> class -> amount.
Allocations = Mapping[str, Mapping[str, int]]

# Instances evacuated at once by default: enough to overlap Placement's and
# the destination's answers, few enough not to crowd one destination.
DEFAULT_PARALLEL = 4
# Allocation writes per instance when another writer took the chosen
# capacity first (each after asking for candidates again).
WRITE_ATTEMPTS = 5


def lost_a_race(error: PlacementError) -> bool:
    """Placement refused the allocation write because someone wrote first:
    the capacity of the chosen candidate is gone (another instance of this
    evacuation, or any scheduler, took it), or a generation moved. Fresh
    candidates may still fit."""
    return error.status == 409


@dataclass
class Outcome:
    """One instance of the source, and what became of it."""

    instance: str
    state: str  # accepted, running, failed, skipped
    destination: str | None = None
    migration: str | None = None
    error: str | None = None


@dataclass
class Evacuation:
    source: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.state in ("running", "skipped") for o in self.outcomes)

    def as_dict(self) -> dict:
        return {"source": self.source, "ok": self.ok,
                "instances": [asdict(o) for o in self.outcomes]}


@dataclass
class _Run:
    """One evacuation of a source, as its workers share it."""

    source: str
    source_root: str
    roots: dict[str, str]  # every compute host: root provider uuid -> name
    target_root: str | None
    force: bool
    providers: dict[str, SourceProvider]  # the source's tree
    traits_read: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Held around each allocation write: the workers' writes all touch the
    # destination's providers, and each moves their generations, so at once
    # they would only make each other retry (inside Placement; and an
    # SQLite-backed Placement answers 500, "database is locked"). The reads,
    # the candidates and the destination's answers are what overlap.
    writing: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class _Rebuild:
    """One instance's rebuild_instance call to its destination, whose
    providers hold its allocations already."""

    instance: str
    destination: str
    migration: str
    spec: dict
    wanted: dict

    def outcome(self, state: str, error: str | None = None) -> Outcome:
        return Outcome(self.instance, state, self.destination, self.migration, error)


class Evacuator:
    def __init__(self, placement: PlacementClient, api: ComputeAgentAPI,
                 heartbeat: Heartbeat, poll: ComputeAgentAPI | None = None,
                 parallel: int = DEFAULT_PARALLEL):
        """``poll``: the client progress is read with, on a short timeout (a
        destination that dies must not hold the rest up); ``api`` by
        default. ``parallel``: the instances an evacuation moves at once."""
        self.placement = placement
        self.api = api
        self.poll = poll or api
        self.heartbeat = heartbeat
        self.parallel = parallel
        self._liveness: dict[str, Liveness] = {}
        self._liveness_lock = threading.Lock()

    # --- hosts ------------------------------------------------------------

    def compute_roots(self) -> dict[str, str]:
        """root provider uuid -> host name, for every compute node."""
        return {p["uuid"]: p["name"] for p in
                self.placement.get_providers(required=os_traits.COMPUTE_NODE)}

    def hosts(self) -> list[dict]:
        """Every compute host: up or down by its heartbeat, when it last
        answered, and its instances (its own count when up; when down, the
        instance consumers Placement has on its tree). A down host's last
        answer is None: the heartbeat is asked, never kept, and nothing else
        (Placement has no timestamps) records when a host was last alive."""
        roots = self.compute_roots()
        found = self.heartbeat.check_many(sorted(roots.values()))
        out = []
        for root, name in sorted(roots.items(), key=lambda r: r[1]):
            seen = found[name]
            report = seen.report  # None exactly when the host is not up
            out.append({"host": name, "root_uuid": root, "state": seen.state.value,
                        "last_seen": report["time"] if report is not None else None,
                        "instances": (report["instances"] if report is not None
                                      else self._instances_on(root))})
        return out

    def _instances_on(self, root_uuid: str) -> int:
        """The instance consumers on a tree: an evacuation's migration
        consumers stay on a down source until it returns, and are not its
        instances any more. One read per consumer, only for down hosts."""
        consumers = sorted(tree_allocations(self.placement, root_uuid))
        if not consumers:
            return 0
        with ThreadPoolExecutor(max_workers=min(8, len(consumers))) as pool:
            held = pool.map(self.placement.get_consumer_allocations, consumers)
            return sum(1 for h in held if h.get("consumer_type", "INSTANCE") == "INSTANCE")

    def _alive(self, host: str) -> bool:
        """Asked once per host and evacuation, whatever the number of
        workers: a down host costs one deadline, not one per worker."""
        self._ask_liveness([host])
        return self._liveness[host].up

    def _ask_liveness(self, hosts: list[str]) -> None:
        """The hosts not asked yet in this evacuation, asked at once: many
        down candidates cost one deadline together, not one each."""
        with self._liveness_lock:
            new = sorted(set(hosts) - set(self._liveness))
            self._liveness.update(self.heartbeat.check_many(new))

    # --- evacuation -------------------------------------------------------

    def evacuate(self, source: str, target: str | None = None, force: bool = False,
                 progress: Callable[[Outcome], None] = lambda o: None,
                 deadline: float | None = None) -> Evacuation:
        """Every instance of ``source``, ``parallel`` at a time; then every
        instance an earlier run left between the allocation write and the
        destination's answer. ``progress`` is called in the caller's thread."""
        roots = self.compute_roots()
        by_name = {name: uuid for uuid, name in roots.items()}
        if source not in by_name:
            raise NoSuchHost(source)
        if target is not None and target not in by_name:
            raise NoSuchHost(target)
        if not force and self._alive(source):
            raise SourceHostUp(source, self.heartbeat.down_after)
        run = _Run(source, by_name[source], roots,
                   by_name.get(target) if target else None, force,
                   read_source_tree(self.placement, by_name[source]))
        result = Evacuation(source)
        # Migration consumers on the source (an earlier evacuation's, maybe
        # interrupted) -> what they hold there; filled by the first pass.
        migrations: dict[str, Allocations] = {}
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            def collect(work: list[Callable[[], Outcome | None]]) -> None:
                for done in as_completed([pool.submit(w) for w in work]):
                    outcome = done.result()
                    if outcome is not None:
                        result.outcomes.append(outcome)
                        progress(outcome)
            collect([partial(self._evacuate_one, run, instance, allocations, migrations)
                     for instance, allocations in
                     sorted(tree_allocations(self.placement, run.source_root).items())])
            if migrations:
                collect([partial(self._resume_one, run, found)
                         for found in self._interrupted(run, migrations)])
        result.outcomes.sort(key=lambda o: o.instance)
        self._wait_running([o for o in result.outcomes if o.state == "accepted"],
                           progress, deadline)
        return result

    def _device_traits(self, run: _Run, allocations: Allocations) -> None:
        """Read the traits of the device providers ``allocations`` use, once
        per provider whatever the number of workers."""
        with run.lock:
            unread = set(allocations) - run.traits_read
            read_device_traits(self.placement, run.providers, unread)
            run.traits_read |= unread

    def _evacuate_one(self, run: _Run, instance: str,
                      allocations: Allocations,
                      migrations: dict[str, Allocations]) -> Outcome | None:
        """One consumer on the source: an instance is evacuated; a migration
        consumer is noted (an earlier evacuation's, maybe interrupted)."""
        held = self.placement.get_consumer_allocations(instance)
        if held.get("consumer_type", "INSTANCE") != "INSTANCE":
            with run.lock:
                migrations[instance] = allocations
            return None
        if set(held["allocations"]) - set(run.providers):
            return Outcome(instance, "skipped",
                           error="holds allocations on another host too (in a move)")
        self._device_traits(run, allocations)
        try:
            spec = spec_from_allocations(instance, allocations)
            request = move_request(allocations, run.providers)
        except ValueError as e:
            return Outcome(instance, "failed", error=str(e))
        migration = evacuation_migration_uuid(instance, run.source_root)
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            chosen = self._destination(run, request)
            if chosen is None:
                return Outcome(instance, "failed",
                               error="no up host has room for it with each device on "
                                     "its CPUs' NUMA cell (allocation candidates)")
            destination, wanted = chosen
            try:
                with run.writing:
                    move_allocations(self.placement, instance, migration,
                                     replacement=wanted)
                break
            except PlacementError as e:
                if not lost_a_race(e) or attempt == WRITE_ATTEMPTS:
                    return Outcome(instance, "failed", destination, migration,
                                   f"allocations not written: {_first_line(e)}")
        return self._call_destination(run, _Rebuild(instance, destination, migration, spec,
                                                    wanted))

    def _destination(self, run: _Run, request) -> tuple[str, dict] | None:
        """The first allocation candidate on an up host other than the
        source: (host, allocations)."""
        found = self.placement.get_allocation_candidates(
            request.query(in_tree=run.target_root))
        tree_of = {rp: s["root_provider_uuid"]
                   for rp, s in found.get("provider_summaries", {}).items()}
        self._ask_liveness([run.roots[root] for root in set(tree_of.values())
                            if root != run.source_root and root in run.roots])
        for candidate in found["allocation_requests"]:
            root = candidate_root(candidate, tree_of)
            if root is not None and root != run.source_root and root in run.roots \
                    and self._alive(run.roots[root]):
                return run.roots[root], candidate["allocations"]
        return None

    def _call_destination(self, run: _Run, rebuild: _Rebuild) -> Outcome:
        """rebuild_instance to the destination; a refusal moves the
        instance's allocations back to the source."""
        try:
            self.api.rebuild_instance(rebuild.destination, rebuild.migration,
                                      rebuild.instance, rebuild.spec, rebuild.wanted,
                                      source_host=run.source, force=run.force)
        except messaging.MessagingTimeout:
            # It may have been accepted: the destination then owns it; if
            # not, the next run finds it (_interrupted) and calls again.
            return rebuild.outcome("failed", f"no answer from {rebuild.destination}: if "
                                   "it accepted the rebuild it owns it and resumes it; "
                                   f"evacuate {run.source} again to find out")
        except AgentError as e:
            # Refused: nothing was claimed there. The instance goes back to
            # the source's allocations, where the source's store has it.
            with run.writing:
                move_allocations(self.placement, rebuild.migration, rebuild.instance,
                                 "INSTANCE")
            return rebuild.outcome("failed", _first_line(e))
        return rebuild.outcome("accepted")

    # --- what an earlier run left -----------------------------------------

    def _interrupted(self, run: _Run, migrations: dict[str, Allocations]
                     ) -> list[InterruptedEvacuation]:
        """The instances an earlier evacuation of the source moved to another
        host, read from Placement: every other host's consumers, matched to
        the migration consumers the source still has. Asked only when the
        source has some; every host, whatever --target says now."""
        consumers = {root: tree_allocations(self.placement, root) for root in run.roots
                     if root != run.source_root}
        return interrupted_evacuations(run.source_root, migrations, consumers)

    def _resume_one(self, run: _Run, found: InterruptedEvacuation) -> Outcome | None:
        """Ask the destination whether it accepted; call it again if not.
        None when it is done there (an earlier run's success)."""
        destination = run.roots[found.destination_root]
        instance, migration = found.instance, found.migration
        if not self._alive(destination):
            return Outcome(instance, "failed", destination, migration,
                           f"{destination} is down and holds its allocations: if it "
                           "accepted the rebuild it resumes it when it returns; "
                           f"if not, evacuate {run.source} again then")
        try:
            view = self.api.get_instance(destination, instance)
        except NoSuchInstance:
            view = None
        except messaging.MessagingTimeout:
            return Outcome(instance, "failed", destination, migration,
                           f"no answer from {destination}")
        record = destination_record(view, migration)
        if record is DestinationRecord.DONE:
            return None
        if record is DestinationRecord.ACCEPTED:
            return Outcome(instance, "accepted", destination, migration)
        if record is DestinationRecord.OTHER:
            return Outcome(instance, "failed", destination, migration,
                           f"{destination} has the instance but not its evacuation "
                           f"{migration}; see compute-agent-ctl show {destination} "
                           f"{instance}")
        try:
            spec = spec_from_allocations(instance, found.source_allocations)
        except ValueError as e:
            return Outcome(instance, "failed", destination, migration, str(e))
        wanted = {rp: {"resources": r}
                  for rp, r in found.destination_allocations.items()}
        return self._call_destination(run, _Rebuild(instance, destination, migration, spec,
                                                    wanted))

    def _wait_running(self, accepted: list[Outcome],
                      progress: Callable[[Outcome], None],
                      deadline: float | None) -> None:
        """Until each accepted instance runs on its destination, or the
        deadline (monotonic) passes: those stay 'accepted'."""
        waiting = list(accepted)
        while waiting:
            silent: set[str] = set()  # destinations that did not answer this round
            for o in list(waiting):
                # An accepted outcome names its destination and its move.
                assert o.destination is not None and o.migration is not None
                if o.destination in silent or (
                        deadline is not None and time.monotonic() > deadline):
                    continue
                try:
                    view = self.poll.get_instance(o.destination, o.instance)
                except messaging.MessagingTimeout:
                    silent.add(o.destination)
                    continue
                except (AgentError, messaging.MessagingException):
                    continue
                if destination_record(view, o.migration) is DestinationRecord.DONE:
                    o.state = "running"
                    progress(o)
                    waiting.remove(o)
            if not waiting or (deadline is not None and time.monotonic() > deadline):
                return
            time.sleep(0.2)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
