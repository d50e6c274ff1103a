"""The RPC layer without a broker: payload checks, the endpoint's calls and
errors, the version ledger and the client's version cap. (Through the real
RabbitMQ: tests/functional/test_rpc.py.)"""
from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import time
import uuid

import pytest

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
)
from compute_agent.cmd.common import load_config
from compute_agent.drivers.base import DeviceKind
from compute_agent.exception import (
    InternalError,
    InvalidRequest,
    LiveMigrationRefused,
    NoSuchInstance,
    StoreUnavailable,
    VersionCapped,
)
from compute_agent.messaging import messaging
from compute_agent.rpc import schemas
from compute_agent.rpc import versions as rpc_versions
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.server import ComputeAgentEndpoint, UnservedCallsAsWarnings, listed_instances
from compute_agent.store.errors import StoreError

SPEC = {"name": "guest", "vcpus": 2, "memory_mb": 1024}
INSTANCE = "3f1c2a44-5b6d-4e7f-8a9b-0c1d2e3f4a5b"
MIGRATION = "9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4"
PROVIDER = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"
# What SPEC's vcpus and memory_mb are allocated as.
RESOURCES = {"VCPU": 2, "MEMORY_MB": 1024}
ALLOCATIONS = {PROVIDER: {"resources": RESOURCES}}


def refusal(schema: dict, payload: dict) -> str:
    with pytest.raises(InvalidRequest) as caught:
        schemas.checked(schemas.validator(schema), payload)
    return str(caught.value)


# --- payloads -------------------------------------------------------------

@pytest.mark.parametrize("schema, payload, field", [
    (schemas.INSTANCE, {"instance_uuid": INSTANCE + "\n"}, "instance_uuid"),
    (schemas.MOVE, {"migration_uuid": MIGRATION + "\n", "instance_uuid": INSTANCE},
     "migration_uuid"),
    (schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                     "allocations": {PROVIDER + "\n": {"resources": {"VCPU": 1}}}},
     "allocations"),
    (schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                     "allocations": {PROVIDER: {"resources": {"VCPU\n": 1}}}},
     f"allocations.{PROVIDER}.resources"),
])
def test_a_trailing_newline_is_refused_naming_the_field(schema, payload, field):
    assert refusal(schema, payload).startswith(f"{field}: ")


def test_upper_case_uuids_are_accepted_and_made_lower_case():
    payload = {"migration_uuid": MIGRATION.upper(), "instance_uuid": INSTANCE.upper(),
               "spec": SPEC, "allocations": {PROVIDER.upper(): {"resources": RESOURCES}}}
    assert schemas.checked(schemas.validator(schemas.MOVE_CLAIM), payload) == {
        "migration_uuid": MIGRATION, "instance_uuid": INSTANCE, "spec": SPEC,
        "allocations": ALLOCATIONS}


def test_a_provider_named_in_two_cases_is_refused():
    allocations = {PROVIDER: {"resources": {"VCPU": 1}},
                   PROVIDER.upper(): {"resources": {"MEMORY_MB": 1}}}
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                                      "allocations": allocations})
    assert message.startswith(f"allocations.{PROVIDER.upper()}: names a provider "
                              "already named")


def test_a_move_named_after_its_instance_is_refused():
    message = refusal(schemas.MOVE, {"migration_uuid": INSTANCE.upper(),
                                     "instance_uuid": INSTANCE})
    assert message.startswith("migration_uuid: is the instance's own uuid")


def test_a_spec_name_the_claim_would_refuse_is_refused_here():
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE,
                                      "spec": {**SPEC, "name": "a\x00b"},
                                      "allocations": ALLOCATIONS})
    assert message.startswith("spec.name: must be 1 to 255 printable characters")


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_deeply_nested_payload_is_refused_by_its_depth():
    payload = {"instance_uuid": INSTANCE, "spec": nested(5000), "allocations": ALLOCATIONS}
    assert refusal(schemas.CLAIM, payload) == (
        "spec.a.a.a.a.a: nested deeper than 6 levels (value: an object)")


def test_the_deepest_payload_a_call_takes_is_accepted():
    payload = {"instance_uuid": INSTANCE, "spec": SPEC, "allocations": ALLOCATIONS}
    assert schemas.checked(schemas.validator(schemas.CLAIM), payload) == payload


def test_the_deepest_payload_live_migrate_takes_is_accepted():
    device = {"resource_class": "VGPU", "device": {
        "assignment_id": "a1", "kind": "mdev", "device_id": str(uuid.uuid4()),
        "amount": 1, "cpus": [], "detail": {"numa_node": 0, "mdev_type": "nvidia-35"}}}
    payload = {"migration_uuid": str(uuid.uuid4()), "instance_uuid": INSTANCE,
               "destination": {"claimed": [device], "migration_uri": "qemu+tcp://b/system"}}
    checker = schemas.validator(schemas.LIVE_MIGRATE)
    assert schemas.checked(checker, payload) == payload
    # 1.0's form, without the destination, passes the schema (the manager
    # refuses it, naming the field).
    del payload["destination"]
    assert schemas.checked(checker, payload) == payload


def test_a_map_of_200000_keys_is_refused_by_its_size_at_once():
    huge = {str(uuid.uuid4()): {"resources": {"VCPU": 1}} for _ in range(200_000)}
    began = time.perf_counter()
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                                      "allocations": huge})
    assert time.perf_counter() - began < 0.5
    assert message == "allocations: has 200000 entries, at most 64 (value: an object)"


def test_too_many_resource_classes_are_refused_by_the_schema():
    resources = {f"CUSTOM_R{i}": 1 for i in range(33)}
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                                      "allocations": {PROVIDER: {"resources": resources}}})
    assert message == (f"allocations.{PROVIDER}.resources: has 33 entries, at most 32 "
                       "(value: an object)")


# --- the endpoint ---------------------------------------------------------

class RecordingManager:
    """Records each call; raises ``error`` when one is set."""

    def __init__(self, error: BaseException | None = None):
        self.calls: list[tuple] = []
        self.error = error
        # Notified at each call: a call made in another thread is waited for.
        self.called = threading.Condition()

    def __getattr__(self, name):
        def call(*args):
            with self.called:
                self.calls.append((name, *args))
                self.called.notify_all()
            if self.error is not None:
                raise self.error
            return {"called": name}
        return call


class AgentWith:
    def __init__(self, manager):
        self.manager = manager


class Served:
    """An endpoint's calls as the dispatcher makes them: an error marked
    expected is unwrapped, as it is before it is sent to the caller."""

    def __init__(self, error: BaseException | None = None):
        self.endpoint = ComputeAgentEndpoint(AgentWith(RecordingManager(error)))
        self.calls = self.endpoint._agent.manager.calls

    def __getattr__(self, name):
        def call(*args, **kwargs):
            try:
                return getattr(self.endpoint, name)(*args, **kwargs)
            except messaging.ExpectedException as e:
                raise e.exc_info[1] from None
        return call


def endpoint(error: BaseException | None = None) -> Served:
    return Served(error)


def test_each_call_reaches_the_manager_with_canonical_uuids():
    e = endpoint()
    e.build_instance({}, instance_uuid=INSTANCE.upper(), spec=SPEC,
                     allocations={PROVIDER.upper(): {"resources": RESOURCES}})
    e.confirm_resize({}, migration_uuid=MIGRATION.upper(), instance_uuid=INSTANCE)
    assert e.calls == [("build_instance", INSTANCE, SPEC, ALLOCATIONS),
                                      ("confirm_resize", MIGRATION, INSTANCE)]


class Fence:
    def __init__(self):
        self.asked: list[str] = []

    def require_down(self, host: str) -> None:
        self.asked.append(host)


def test_a_rebuild_naming_its_source_is_fenced_accepted_then_built():
    fence = Fence()
    e = endpoint()
    e.endpoint._fence = fence
    assert e.rebuild_instance({}, migration_uuid=MIGRATION, instance_uuid=INSTANCE,
                              spec=SPEC, allocations=ALLOCATIONS,
                              source_host="down-host") == {"called": "accept_rebuild"}
    name, *args, check = e.calls[0]
    assert (name, args) == ("accept_rebuild", [MIGRATION, INSTANCE, SPEC, ALLOCATIONS])
    check()
    assert fence.asked == ["down-host"]
    # The guest is built after the answer, in a thread of its own.
    manager = e.endpoint._agent.manager
    with manager.called:
        assert manager.called.wait_for(lambda: ("finish_rebuild", MIGRATION) in e.calls, 5)

    forced = endpoint()
    forced.endpoint._fence = fence
    forced.rebuild_instance({}, migration_uuid=MIGRATION, instance_uuid=INSTANCE,
                            spec=SPEC, allocations=ALLOCATIONS, source_host="up-host",
                            force=True)
    assert forced.calls[0][-1] is None  # no fence: forced
    # API 1.0's form: claim, build and settle in the call, no fence.
    old = endpoint()
    old.rebuild_instance({}, migration_uuid=MIGRATION, instance_uuid=INSTANCE,
                         spec=SPEC, allocations=ALLOCATIONS)
    assert old.calls == [("rebuild_instance", MIGRATION, INSTANCE, SPEC, ALLOCATIONS)]
    with pytest.raises(InvalidRequest, match="force"):
        old.rebuild_instance({}, migration_uuid=MIGRATION, instance_uuid=INSTANCE,
                             spec=SPEC, allocations=ALLOCATIONS, force="yes")


def test_a_refused_payload_never_reaches_the_manager():
    e = endpoint()
    with pytest.raises(InvalidRequest):
        e.finish_resize({}, migration_uuid=INSTANCE, instance_uuid=INSTANCE)
    with pytest.raises(InvalidRequest):
        e.get_instance({}, instance_uuid=INSTANCE + "\n")
    assert e.calls == []


def test_the_callers_errors_pass_as_they_are(caplog):
    with pytest.raises(NoSuchInstance), caplog.at_level(logging.DEBUG, "compute_agent.rpc.server"):
        endpoint(NoSuchInstance(INSTANCE)).get_instance({}, instance_uuid=INSTANCE)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("error", [StoreError("/x/state.db: the store is closed"),
                                   sqlite3.OperationalError("disk I/O error")])
def test_a_store_failure_is_store_unavailable_logged_in_one_line(error, caplog):
    with pytest.raises(StoreUnavailable) as caught:
        endpoint(error).delete_instance({}, instance_uuid=INSTANCE)
    assert str(caught.value) == f"delete_instance: the agent's store failed: {error}"
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.exc_info is None and "delete_instance" in record.getMessage()


def dispatch_failure(error: Exception) -> logging.LogRecord:
    """The record oslo.messaging's server makes of a call its dispatcher
    failed with ``error``, passed through the filter."""
    try:
        raise error
    except Exception:
        record = logging.getLogger("oslo_messaging.rpc.server").makeRecord(
            "oslo_messaging.rpc.server", logging.ERROR, __file__, 1,
            "Exception during message handling", (), sys.exc_info())
    assert UnservedCallsAsWarnings().filter(record)
    return record


def test_an_unserved_method_or_version_is_a_warning_without_a_traceback():
    for error in (messaging.NoSuchMethod("no_such_method"),
                  messaging.UnsupportedVersion("9.0", "get_host_info")):
        record = dispatch_failure(error)
        assert (record.levelname, record.exc_info) == ("WARNING", None)
        assert record.getMessage() == "RPC call refused: this agent does not serve it"
    # Any other failure is left as it was, traceback and all.
    record = dispatch_failure(RuntimeError("boom"))
    assert record.levelname == "ERROR" and record.exc_info[0] is RuntimeError


def test_an_unexpected_error_is_internal_error_logged_once_with_its_traceback(caplog):
    with pytest.raises(InternalError) as caught:
        endpoint(KeyError("numa_node")).build_instance(
            {}, instance_uuid=INSTANCE, spec=SPEC, allocations=ALLOCATIONS)
    assert str(caught.value) == "build_instance: internal error in the agent: 'numa_node'"
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.exc_info is not None


def exposed(e: ComputeAgentEndpoint) -> dict[str, str]:
    """The calls the server serves, each with its version."""
    policy = messaging.ExplicitRPCAccessPolicy()
    return {name: getattr(e, name).since for name in dir(e) if policy.is_allowed(e, name)}


def test_only_the_declared_calls_are_served():
    e = endpoint().endpoint
    calls = exposed(e)
    assert "target" not in calls and "_agent" not in calls
    assert set(calls) == {name for name, value in vars(ComputeAgentEndpoint).items()
                          if hasattr(value, "since")}
    assert calls["list_instances"] == "1.1"


def test_each_call_notes_its_version_in_its_docstring_and_the_ledger():
    e = endpoint().endpoint
    for name, since in exposed(e).items():
        assert since in {v.number for v in rpc_versions.VERSIONS}, name
        assert getattr(e, name).__doc__.startswith(f"Since {since}. "), name


def test_the_ledger_is_in_order_and_the_endpoint_serves_its_newest():
    numbers = [tuple(map(int, v.number.split("."))) for v in rpc_versions.VERSIONS]
    assert numbers == sorted(set(numbers))
    assert all(v.added for v in rpc_versions.VERSIONS)
    assert ComputeAgentEndpoint.target.version == rpc_versions.VERSIONS[-1].number
    with pytest.raises(ValueError):
        rpc_versions.known("1.99")


def test_instances_are_listed_with_their_state():
    building, active, moving = sorted(str(uuid.uuid4()) for _ in range(3))
    instances = {u: {"name": n} for u, n in [(building, "b"), (active, "a"), (moving, "m")]}

    def row(instance, state, migration=None):
        return Assignment(str(uuid.uuid4()), instance, instance, Owner.INSTANCE, migration,
                          "VCPU", PROVIDER, DeviceKind.NUMA, "0", 1, state, "boot")

    live = [row(building, AssignmentState.CLAIMING), row(active, AssignmentState.CLAIMED),
            row(moving, AssignmentState.CLAIMED),
            row(moving, AssignmentState.CLAIMING, MIGRATION)]
    migrations = {MIGRATION: Migration(MIGRATION, moving, MoveKind.RESIZE, MigrationRole.BOTH,
                                       MigrationState.ACTIVE),
                  INSTANCE: Migration(INSTANCE, active, MoveKind.RESIZE, MigrationRole.BOTH,
                                      MigrationState.CONFIRMED)}
    assert listed_instances(instances, live, migrations) == [
        {"uuid": building, "name": "b", "state": "building", "migration_uuid": None},
        {"uuid": active, "name": "a", "state": "active", "migration_uuid": None},
        {"uuid": moving, "name": "m", "state": "moving", "migration_uuid": MIGRATION}]


# --- the client's version cap ---------------------------------------------

class RecordingClient:
    """Stands in for oslo's RPCClient: records what would be sent."""

    def __init__(self, real):
        self.real = real
        self.version_cap = real.version_cap
        self.sent: list[tuple[str, str]] = []

    def can_send_version(self, version):
        return self.real.can_send_version(version)

    def prepare(self, version, **_):
        client = self

        class Prepared:
            def call(self, ctxt, method, **payload):
                client.sent.append((method, version))
                return {}
        return Prepared()


def client(cap: str | None) -> ComputeAgentAPI:
    conf = load_config([])
    conf.set_override("transport_url", "fake:/")
    conf.set_override("compute_agent", cap, group="upgrade_levels")
    api = ComputeAgentAPI(conf)
    api.client = RecordingClient(api.client)
    return api


def test_the_client_sends_each_call_at_the_version_it_appeared_in():
    api = client(None)
    calls = exposed(endpoint().endpoint)
    for name in calls:
        method = getattr(api, name)
        # The arguments the call appeared with; optional ones came later.
        required = method.__code__.co_argcount - 1 - len(method.__defaults__ or ())
        method(*["x"] * required)
    assert dict(api.client.sent) == calls


def test_a_rebuild_that_names_its_source_is_sent_at_1_3_and_capped_below():
    api = client(None)
    api.rebuild_instance("h", MIGRATION, INSTANCE, SPEC, ALLOCATIONS, source_host="s")
    assert api.client.sent == [("rebuild_instance", "1.3")]
    capped = client("1.1")
    with pytest.raises(VersionCapped, match="rebuild_instance needs RPC API 1.3"):
        capped.rebuild_instance("h", MIGRATION, INSTANCE, SPEC, ALLOCATIONS,
                                source_host="s")
    assert capped.client.sent == []


def test_a_client_capped_below_a_call_refuses_it_before_sending():
    api = client(rpc_versions.OLDEST)
    with pytest.raises(VersionCapped) as caught:
        api.list_instances("host-1")
    assert str(caught.value) == ("list_instances needs RPC API 1.1, but [upgrade_levels] "
                                 "compute_agent caps this client at 1.0")
    api.get_host_info("host-1")
    assert api.client.sent == [("get_host_info", "1.0")]


def test_a_refusal_naming_its_side_by_role_crosses_rpc_as_before():
    # The side goes over the wire as the plain string it always was, so
    # older callers rebuild the same error with the same message.
    from oslo_messaging._drivers import common as wire

    from compute_agent.messaging import ALLOWED_EXMODS
    message = "live migration of instance inst refused on the destination: vf 0000:81:00.1"
    try:
        raise LiveMigrationRefused("inst", MigrationRole.DESTINATION, ["vf 0000:81:00.1"])
    except LiveMigrationRefused as e:
        assert str(e) == message and type(e.side) is str
        sent = wire.serialize_remote_exception(sys.exc_info())
    assert '"args": ["inst", "destination", ["vf 0000:81:00.1"]]' in sent
    rebuilt = wire.deserialize_remote_exception(sent, ALLOWED_EXMODS)
    assert type(rebuilt).__name__ == "LiveMigrationRefused_Remote"
    assert isinstance(rebuilt, LiveMigrationRefused)
    assert rebuilt.side == "destination"
    assert str(rebuilt).startswith(message)
