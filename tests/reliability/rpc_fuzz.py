"""Fuzzed RPC calls through the real broker to a real agent daemon.

The payloads come from each method's JSON schema (compute_agent/rpc/schemas.py,
which the endpoint's methods carry): valid-shaped ones, drawing uuids,
providers and resource classes from what the host really has so that
some calls are taken, then edited: keys dropped or added, values made
wrong types, huge strings and numbers, unicode, nested junk; and calls to
unknown methods and at unknown or malformed versions.

What each call may end in:
- a method the agent serves, at a version it serves: a result, or one
  of compute_agent.exception's errors for the caller's mistake (InvalidRequest,
  NoSuchInstance, ClaimFailed, MoveInProgress, DevicesInUse). An
  InternalError (the agent failed unforeseen), a StoreUnavailable (the
  store is fine), an oslo.messaging RemoteError or a timeout is a
  violation;
- an unknown method or version: oslo.messaging's NoSuchMethod or
  UnsupportedVersion; a version that is not numbers is refused by the
  client, unsent.
A MoveInProgress must name the call's instance and a move of it that was
in progress before the call; no call leaves an instance in two moves at
once; and a prep_resize that passes its schema, of an instance in a move,
under a migration the host does not know, is answered MoveInProgress (the
destination's claim checks nothing else first). Some calls are made to be
that: another move of an instance the fuzzer put in a resize.
A build_instance or prep_resize that passes its checks and names a record
an earlier call made (its instance built, its move claimed here, not
reverted) is that call's retry only when it asks the same: else it is
answered RetryMismatch naming exactly the fields that differ, and a true
retry never is. Some calls are made to be that: the fuzzer's own setup
calls again, with a field changed.
After every refused call the store's logical contents (a dump of its
tables, read-only beside the daemon, as ``audit`` reads it) are the same
as before it, but for rows that name only UUIDs the call never sent
(another writer's, counted in ``changed_meanwhile``), and the daemon is
still running.
"""
from __future__ import annotations

import re
import sqlite3
import uuid
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from hypothesis import strategies as st
from oslo_messaging._utils import version_is_compatible

from compute_agent.claims.choice import InstanceSpec
from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind, RequestDigest
from compute_agent.cmd.common import load_config
from compute_agent.compute.resize import ENDING_STEPS
from compute_agent.compute.tracker import claim_request
from compute_agent.exception import (
    AgentError,
    ClaimFailed,
    DevicesInUse,
    InvalidRequest,
    LiveMigrationFailed,
    LiveMigrationRefused,
    MoveInProgress,
    NoSuchInstance,
    RetryMismatch,
    SourceHostUp,
)
from compute_agent.messaging import TOPIC, messaging, transport
from compute_agent.rpc import schemas
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.server import ComputeAgentEndpoint
from compute_agent.rpc.versions import VERSION
from compute_agent.store.queries import all_instances, all_migrations, instance_requests
from tests.functional.helpers import put_allocations
from tests.functional.test_rpc import BROKER, SPEC, AgentDaemon
from tests.reliability.exploring import Outcome
from tests.waiting import wait_for

# The caller's own mistakes, which the agent answers as they are: a live
# migration to where the caller said (a destination that cannot take it),
# an evacuation from a source that is up.
CALLER_ERRORS = (InvalidRequest, NoSuchInstance, ClaimFailed, MoveInProgress,
                 DevicesInUse, LiveMigrationRefused, LiveMigrationFailed, SourceHostUp)
# What oslo.messaging answers before an endpoint is asked.
UNKNOWN_CALL_ERRORS = {"NoSuchMethod", "UnsupportedVersion"}


def served_methods() -> dict[str, dict]:
    """Each RPC method the endpoint serves, with its payload schema."""
    return {name: method.schema for name in dir(ComputeAgentEndpoint)
            if hasattr(method := getattr(ComputeAgentEndpoint, name), "since")}


class VersionKind(str, Enum):
    SERVED = "served"
    UNSERVED = "unserved"
    MALFORMED = "malformed"


def version_kind(version: str) -> VersionKind:
    """As the client (the version against itself) and then the server's
    dispatcher (against the version it serves) judge a version."""
    try:
        version_is_compatible(version, version)
    except (ValueError, IndexError):
        return VersionKind.MALFORMED
    return (VersionKind.SERVED if version_is_compatible(VERSION, version)
            else VersionKind.UNSERVED)


@dataclass(frozen=True)
class Call:
    method: str
    version: str
    payload: dict


# --- payloads ----------------------------------------------------------------

junk_values = st.recursive(
    st.none() | st.booleans() | st.integers(1, 4000).map(lambda n: 10 ** n)
    | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=20)
    | st.integers(1000, 100_000).map(lambda n: "x" * n),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=10), inner, max_size=4),
    max_leaves=10)


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


class PayloadEdit(str, Enum):
    DROP = "drop key"
    ADD = "add key"
    REPLACE = "replace value"


@dataclass(frozen=True)
class Edit:
    kind: PayloadEdit
    where: int     # modulo the payload's objects and their keys
    key: str
    value: object


def _places(payload: dict) -> list[tuple[dict, str | None]]:
    """Every object in the payload, with each of its keys (and None: the
    object itself, for an added key)."""
    out: list[tuple[dict, str | None]] = []
    todo = [payload]
    while todo:
        obj = todo.pop()
        out.append((obj, None))
        for key, value in obj.items():
            out.append((obj, key))
            if isinstance(value, dict):
                todo.append(value)
    return out


def edited(payload: dict, edits: list[Edit]) -> dict:
    payload = _copy(payload)
    for edit in edits:
        places = _places(payload)
        obj, key = places[edit.where % len(places)]
        if edit.kind is PayloadEdit.DROP and key is not None:
            del obj[key]
        elif edit.kind is PayloadEdit.REPLACE and key is not None:
            obj[key] = edit.value
        elif not (obj is payload and edit.key in CALL_OWN_ARGUMENTS):
            obj[edit.key] = edit.value
    return payload


# oslo.messaging's call(ctxt, method, **kwargs) takes these itself: no
# client sends them as arguments of the method.
CALL_OWN_ARGUMENTS = frozenset({"ctxt", "method"})


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


@dataclass
class HostFacts:
    """What the payloads draw on: the host's providers and classes, and
    uuids the agent knows."""
    inventories: dict[str, list[str]]  # provider uuid -> its classes
    instances: list[str]
    migrations: list[str] = field(default_factory=list)
    host: str = ""  # the agent's own [DEFAULT] host
    # The state-changing calls the setup made, which retries repeat.
    made: list[Call] = field(default_factory=list)


def uuids(known: list[str]) -> st.SearchStrategy[str]:
    fresh = st.uuids().map(str)
    pick = st.sampled_from(known) if known else fresh
    return st.one_of(pick, pick.map(str.upper), fresh)


def fitting_allocations(facts: HostFacts) -> st.SearchStrategy[dict]:
    """One of each of some classes a provider has, on some providers:
    what a scheduler would pick, so that some builds and moves are taken."""
    one_provider = st.sampled_from(sorted(facts.inventories)).flatmap(
        lambda rp: st.lists(st.sampled_from(facts.inventories[rp]), min_size=1,
                            max_size=2, unique=True).map(
            lambda classes: (rp, {"resources": dict.fromkeys(classes, 1)})))
    return st.lists(one_provider, min_size=1, max_size=3,
                    unique_by=lambda pair: pair[0]).map(dict)


def fitted(payload: dict) -> dict:
    """``payload`` with its spec asking the vCPUs and memory its
    allocations carry, where they carry both: so that the agent's
    spec-against-allocations check passes and the claim is tried."""
    if "spec" not in payload or "allocations" not in payload:
        return payload
    vcpus = memory_mb = 0
    for body in payload["allocations"].values():
        resources = body["resources"]
        vcpus += resources.get("VCPU", 0) + resources.get("PCPU", 0)
        memory_mb += resources.get("MEMORY_MB", 0)
    if not vcpus or not memory_mb:
        return payload
    return {**payload, "spec": {**payload["spec"], "vcpus": vcpus, "memory_mb": memory_mb}}


def valid_shaped(schema: dict, facts: HostFacts) -> st.SearchStrategy[dict]:
    """A payload that passes ``schema``: the uuids, spec and allocations a
    conductor would send, mostly on this host's providers."""
    fields = {
        "instance_uuid": uuids(facts.instances),
        "migration_uuid": uuids(facts.migrations + facts.instances),
        "spec": st.fixed_dictionaries({
            "name": st.text(min_size=1, max_size=40),
            "vcpus": st.integers(1, 8), "memory_mb": st.integers(1, 4096)}),
        "allocations": fitting_allocations(facts) | st.dictionaries(
            st.sampled_from(sorted(facts.inventories)) | st.uuids().map(str),
            st.fixed_dictionaries({"resources": st.dictionaries(
                st.sampled_from(sorted({rc for classes in facts.inventories.values()
                                        for rc in classes}))
                | st.from_regex(r"\ACUSTOM_[A-Z0-9_]{1,10}\Z"),
                st.integers(1, 4), min_size=1, max_size=3)}),
            min_size=1, max_size=4),
        # live_migrate (1.2): what a destination answered, as it would look.
        "destination": st.fixed_dictionaries({
            "claimed": st.lists(st.dictionaries(st.text(max_size=12), junk_values,
                                                max_size=4), max_size=3),
            "migration_uri": st.text(min_size=1, max_size=60)}),
        # rebuild_instance (1.3): a source that answers its heartbeat at once
        # (a name no agent serves would hold each call for service_down_time),
        # never forced: an accepted rebuild builds after its answer, and the
        # store would change under the next call's comparison.
        "source_host": st.just(facts.host),
        "force": st.just(False),
    }
    # A field added to a schema later is fuzzed with junk until it is named.
    drawn = st.fixed_dictionaries({name: fields.get(name, junk_values)
                                   for name in schema.get("properties", {})})
    return drawn | drawn.map(fitted)


def calls(facts: HostFacts) -> st.SearchStrategy[Call]:
    methods = served_methods()
    versions = st.one_of(
        st.just("1.0"), st.just(VERSION),
        st.sampled_from(["1.2", "1.99", "2.0", "0.9", "1.0.1", "3.0"]),
        st.sampled_from(["", "1", "one", "1.x", "1.0.x", "..", "1.1.1.1"])
        | st.text(max_size=6))
    method_names = st.one_of(
        st.sampled_from(sorted(methods)), st.sampled_from(sorted(methods)),
        st.sampled_from(sorted(methods)),
        st.sampled_from(["_agent", "target", "__init__", "__class__",
                         "no_such_method", "get_host_info "]) | st.text(max_size=20))

    def payloads(method: str) -> st.SearchStrategy[dict]:
        base = valid_shaped(methods.get(method, {}), facts)
        edit = st.builds(Edit, st.sampled_from(PayloadEdit), st.integers(0, 64),
                         st.sampled_from(["extra", "instance_uuid", "spec", "name",
                                          "resources", "VCPU"]) | st.text(max_size=8),
                         junk_values | st.integers(5, 900).map(nested))
        return st.one_of(base, st.builds(edited, base,
                                         st.lists(edit, min_size=1, max_size=4)))

    fuzzed = method_names.flatmap(
        lambda m: st.builds(Call, st.just(m), versions, payloads(m)))
    # About one call in five another move, one a changed retry: the rest
    # stays the fuzzing.
    return st.one_of(fuzzed, fuzzed, fuzzed, another_moves(facts),
                     changed_retries(facts))


class RetryChange(str, Enum):
    NAME = "spec.name"  # another name
    BIGGER = "spec.vcpus, allocations"  # one vCPU more, asked and allocated


def changed(call: Call, change: RetryChange, name: str) -> Call:
    payload = _copy(call.payload)
    if change is RetryChange.NAME:
        payload["spec"]["name"] = name
    else:
        payload["spec"]["vcpus"] += 1
        cpu = next(body["resources"] for body in payload["allocations"].values()
                   if "VCPU" in body["resources"])
        cpu["VCPU"] += 1
    return Call(call.method, call.version, payload)


def changed_retries(facts: HostFacts) -> st.SearchStrategy[Call]:
    """A call the setup made, sent again with a field changed: not a retry
    (unless the fuzzing has since ended what it made)."""
    return st.builds(changed, st.sampled_from(facts.made), st.sampled_from(RetryChange),
                     st.text(min_size=1, max_size=20).filter(str.isprintable))


def another_moves(facts: HostFacts) -> st.SearchStrategy[Call]:
    """A resize of one of the fuzzer's instances under a new migration, as
    a conductor would send it: of the instance in a move, MoveInProgress is
    the answer."""
    return st.builds(Call, st.just("prep_resize"), st.just(VERSION), st.fixed_dictionaries({
        "migration_uuid": st.uuids().map(str),
        "instance_uuid": st.sampled_from(facts.instances),
        "spec": valid_shaped(schemas.MOVE_CLAIM, facts).map(lambda p: p["spec"]),
        "allocations": fitting_allocations(facts)}))


def open_moves(moves: dict[str, Migration]) -> dict[str, set[str]]:
    """Instance uuid -> the uuids of its moves in progress."""
    found: dict[str, set[str]] = {}
    for m in moves.values():
        if m.open:
            found.setdefault(m.instance_uuid, set()).add(m.uuid)
    return found


PREP_RESIZE = schemas.validator(schemas.MOVE_CLAIM)


def another_move_to_refuse(call: Call, moves: dict[str, Migration],
                           instances: set[str]) -> bool:
    """Whether ``call`` (at a served version) must be answered MoveInProgress:
    a prep_resize that passes its schema, of an instance in a move, under a
    migration this host has no record of (a known one is a retry) and that
    is no instance's uuid here (refused as such)."""
    if call.method != "prep_resize":
        return False
    try:
        payload = schemas.checked(PREP_RESIZE, call.payload)
    except InvalidRequest:
        return False
    return payload["migration_uuid"] not in moves \
        and payload["migration_uuid"] not in instances \
        and payload["instance_uuid"] in open_moves(moves)


RETRIED = {"build_instance": schemas.validator(schemas.CLAIM),
           "prep_resize": PREP_RESIZE}
# The steps that end a resize, by the state each leaves the move in: on a
# move ended the other way, each is refused as no retry of that step
# (RetryMismatch naming the method: compute_agent/compute/resize.py).
ENDS_AS = {step: state for state, step in ENDING_STEPS.items()}
ENDING = schemas.validator(schemas.MOVE)


@dataclass(frozen=True)
class Records:
    """What a call's retry is judged against, read from the store."""
    moves: dict[str, Migration]
    instances: set[str]
    built: dict[str, RequestDigest]  # instances with live rows, by their build
    holding: set[str]  # instances with live assignments


def differing_from_record(call: Call, records: Records) -> list[str] | None:
    """For a build_instance or prep_resize that passes its checks and names
    a record an earlier call made, which the agent answers from the record
    only for a retry: the fields it asks other than that call ([] for a
    true retry); for a step that ends a resize ended the other way,
    ["method"]. None when the call is not judged so."""
    if call.method in ENDS_AS:
        return ended_otherwise(call, records)
    if call.method not in RETRIED:
        return None
    try:
        payload = schemas.checked(RETRIED[call.method], call.payload)
    except InvalidRequest:
        return None
    asked = claim_request(InstanceSpec.from_payload(payload["spec"]),
                          payload["allocations"])
    if call.method == "build_instance":
        instance = payload["instance_uuid"]
        recorded = records.built.get(instance)
        if instance in records.moves or instance not in records.holding:
            return None
    else:
        m = records.moves.get(payload["migration_uuid"])
        if m is None or m.instance_uuid != payload["instance_uuid"] \
                or m.kind is not MoveKind.RESIZE or m.role is MigrationRole.SOURCE \
                or m.state is MigrationState.REVERTED:
            return None
        recorded = m.request
    return None if recorded is None else recorded.differing(asked)


def ended_otherwise(call: Call, records: Records) -> list[str] | None:
    """["method"] for a confirm_resize of a move reverted here, or a
    revert_resize of one confirmed; None otherwise."""
    try:
        payload = schemas.checked(ENDING, call.payload)
    except InvalidRequest:
        return None
    m = records.moves.get(payload["migration_uuid"])
    if m is None or m.instance_uuid != payload["instance_uuid"]:
        return None
    ended = m.state in ENDS_AS.values() and m.state is not ENDS_AS[call.method]
    return ["method"] if ended else None


# --- the daemon --------------------------------------------------------------

UUID_IN_ROW = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class FuzzedAgent:
    """One agent daemon (libvirt test driver, the machine's RabbitMQ, a
    real Placement) with two instances built and one resize open, and a
    client that sends any method at any version."""

    def __init__(self, directory: Path, placement_url: str, timeout: float = 30):
        self.daemon = AgentDaemon(directory, placement_url)
        # Reconciliation only at start-up: the fuzzer builds without
        # Placement allocations, which a later pass would settle while a
        # refused call's store is being compared.
        self.daemon.conf = self.daemon.host.write_conf(
            {"transport_url": BROKER, "update_interval": 2,
             "reconcile_interval": 10000})
        self.api = ComputeAgentAPI(_conf(self.daemon.conf), timeout=timeout)
        self.client = messaging.get_rpc_client(
            transport(_conf(self.daemon.conf)), messaging.Target(topic=TOPIC),
            timeout=timeout)
        self.placement_url = placement_url
        self.daemon.start(self.api)
        try:
            self.facts = self._setup()
        except BaseException:
            self.close()
            raise
        self.store = self.store_rows()
        # Store changes seen during refused calls that name none of their
        # UUIDs (another writer's): kept to be shown, not blamed on the call.
        self.changed_meanwhile: list[str] = []

    def _setup(self) -> HostFacts:
        tree = self.daemon.host.tree()
        inventories = {p["uuid"]: sorted(p["inventories"]) for p in tree.values()
                       if p["inventories"]}
        cell = self.daemon.provider("numa_1")
        instances = [str(uuid.uuid4()) for _ in range(2)]
        made = []
        # One instance with a VF and a vGPU, one with CPUs and memory only:
        # a VF stays free for the fuzzed calls to claim.
        small = {"name": "small", "vcpus": 1, "memory_mb": 512}
        for instance, spec, wanted in zip(instances, (SPEC, small), (
                self.daemon.allocations(),
                {cell: {"resources": {"VCPU": 1, "MEMORY_MB": 512}}})):
            put_allocations(self.placement_url, instance, wanted)
            made.append(Call("build_instance", "1.0", {
                "instance_uuid": instance, "spec": spec, "allocations": wanted}))
            self.send(made[-1])
        migration = str(uuid.uuid4())
        made.append(Call("prep_resize", "1.0", {
            "migration_uuid": migration, "instance_uuid": instances[1], "spec": SPEC,
            "allocations": {cell: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}}}))
        self.send(made[-1])
        return HostFacts(inventories, instances, [migration], self.daemon.name, made)

    def records(self) -> Records:
        """The store's records (read beside the daemon, like
        ``store_rows``)."""
        path = Path(self.daemon.host.dir) / "state" / "state.db"
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            holding = {r[0] for r in conn.execute(
                "SELECT DISTINCT instance_uuid FROM assignments WHERE state != 'released'")}
            return Records(all_migrations(conn), set(all_instances(conn)),
                           instance_requests(conn), holding)
        finally:
            conn.close()

    def moves(self) -> dict[str, Migration]:
        return self.records().moves

    def store_rows(self) -> Counter:
        """The store's statements (each row one), counted."""
        return Counter(self.daemon.store_dump().split("\n"))

    @staticmethod
    def may_be_of(call: Call, before: Counter, after: Counter) -> bool:
        """Whether a refused ``call`` may have made the change: unless every
        row that changed names a UUID the call does not (a row of a move or
        an instance the call never mentioned is another writer's), it is
        taken for the call's."""
        sent = str(call.payload).lower()
        changed = list(((before - after) + (after - before)).elements())
        named = [UUID_IN_ROW.findall(row) for row in changed]
        return not all(uuids and not any(u in sent for u in uuids) for uuids in named)

    @staticmethod
    def change(before: Counter, after: Counter) -> str:
        return (f"gone {sorted((before - after).elements())[:5]}, "
                f"new {sorted((after - before).elements())[:5]}")

    def send(self, call: Call):
        prepared = self.client.prepare(server=self.daemon.name, version=call.version)
        return prepared.call({}, call.method, **call.payload)

    def check(self, call: Call) -> Outcome:
        """One call and its verdict; a violation raises AssertionError."""
        kind = version_kind(call.version)
        known = call.method in served_methods()
        records = self.records()
        moves = records.moves
        in_progress = open_moves(moves)
        must_refuse = kind is VersionKind.SERVED and another_move_to_refuse(
            call, moves, records.instances)
        differing = differing_from_record(call, records) \
            if kind is VersionKind.SERVED else None
        try:
            self.send(call)
        except RetryMismatch as error:
            assert differing, f"{call.method}: {error}, yet it asks what was recorded " \
                f"({differing})"
            assert error.fields == differing, f"{call.method}: {error}, not {differing}"
            outcome = Outcome.REFUSED
        except MoveInProgress as error:
            assert known and kind is VersionKind.SERVED, f"{call.method}: {error}"
            assert not differing, f"{call.method}: {error}, not RetryMismatch"
            assert error.instance_uuid == str(call.payload.get("instance_uuid")).lower() \
                and error.migration_uuid in in_progress.get(error.instance_uuid, ()), (
                    f"{call.method}: {error}, but the moves in progress were {in_progress}")
            outcome = Outcome.REFUSED
        except AgentError as error:
            assert not must_refuse, f"{call.method}: {type(error).__name__}: {error}, " \
                f"not MoveInProgress; the moves in progress were {in_progress}"
            assert not differing, f"{call.method}: {type(error).__name__}: {error}, " \
                f"not RetryMismatch naming {differing}"
            assert known and kind is VersionKind.SERVED and isinstance(
                error, CALLER_ERRORS), f"{call.method}: {type(error).__name__}: {error}"
            outcome = Outcome.REFUSED
        except messaging.RemoteError as error:
            assert not (known and kind is VersionKind.SERVED) and \
                error.exc_type in UNKNOWN_CALL_ERRORS, f"{call.method} at {call.version!r}: {error}"
            outcome = Outcome.REFUSED
        except messaging.MessagingException as error:
            # Not sent: the client refuses a version that is not numbers.
            assert kind is VersionKind.MALFORMED, f"{call}: {error}"
            outcome = Outcome.REFUSED
        else:
            assert known and kind is VersionKind.SERVED, call
            assert not must_refuse, f"{call} was taken, not answered MoveInProgress; " \
                f"the moves in progress were {in_progress}"
            assert not differing, f"{call} was answered from the record, though it " \
                f"asks other {differing}"
            outcome = Outcome.RESULT
        assert self.daemon.proc.poll() is None, "the daemon died"
        in_two = {instance: uuids for instance, uuids in open_moves(self.moves()).items()
                  if len(uuids) > 1}
        assert not in_two, f"{call.method}: instances in two moves at once: {in_two}"
        if outcome is Outcome.REFUSED:
            after = self.store_rows()
            if after != self.store:
                assert not self.may_be_of(call, self.store, after), (
                    f"a refused {call.method} changed the store: "
                    f"{self.change(self.store, after)}")
                self.changed_meanwhile.append(self.change(self.store, after))
        else:
            after = self.settled_store_rows()
        self.store = after
        return outcome

    def settled_store_rows(self, quiet: float = 0.1, limit: float = 10) -> Counter:
        """The store's rows once they stopped changing for ``quiet`` seconds.
        A call taken may go on after its answer (an accepted rebuild builds
        its guest and settles its move in the background: two more commits),
        and a refused call that comes next must not be blamed for them."""
        last: list[Counter] = []

        def unchanged_since_the_last_read() -> tuple[Counter] | None:
            now = self.store_rows()
            if last and now == last[0]:
                return (now,)
            last[:] = [now]
            return None
        (rows,) = wait_for(unchanged_since_the_last_read, limit, interval=quiet,
                           message=f"the store kept changing for {limit} s after a call")
        return rows

    def close(self) -> None:
        self.daemon.stop()
        self.api.close()
        self.client.transport.cleanup()


def _conf(path: Path):
    return load_config(["--config-file", str(path)])
