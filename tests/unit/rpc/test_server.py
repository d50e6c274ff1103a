"""The RPC endpoint without a broker: each call's payload checked before
the manager is asked, its errors as the caller gets them, the calls served
and their versions, the instances listed. (Through the real RabbitMQ:
tests/functional/test_rpc.py.)"""
from __future__ import annotations

import logging
import sqlite3
import sys
import uuid
from types import SimpleNamespace

import pytest

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    DeviceUse,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    UseState,
)
from compute_agent.drivers.base import DeviceKind
from compute_agent.exception import InternalError, InvalidRequest, NoSuchInstance, StoreUnavailable
from compute_agent.messaging import messaging
from compute_agent.rpc import versions as rpc_versions
from compute_agent.rpc.server import (
    DISPATCH_LOGGER,
    REASON_LENGTH,
    ComputeAgentEndpoint,
    UnservedCallsAsWarnings,
    listed_instances,
    short,
    warn_of_unserved_calls,
)
from compute_agent.store.errors import StoreError
from compute_agent.tree.provider_tree import Provider, ProviderTree, inventory
from tests.unit.rpc.calls import (
    ALLOCATIONS,
    INSTANCE,
    MIGRATION,
    PROVIDER,
    RESOURCES,
    SPEC,
    AgentWith,
    RecordingManager,
    endpoint,
    exposed,
)


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


def test_the_endpoint_serves_the_ledgers_newest_version():
    assert ComputeAgentEndpoint.target.version == rpc_versions.VERSIONS[-1].number


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


# --- the views, one-time-use devices, the agent's own checks ---------------------

class Tracker:
    def __init__(self, instances: dict, live: list, uses: list[tuple[DeviceUse, bool]]):
        self.instances, self.live, self.uses = instances, live, uses

    def snapshot(self) -> tuple[dict, list, dict]:
        return self.instances, self.live, {}

    def device_uses(self) -> list[tuple[DeviceUse, bool]]:
        return self.uses


class Cleaner:
    def __init__(self, running: set[str]):
        self.cleaning = running
        self.asked: list[tuple[str, str]] = []

    def running(self, address: str) -> bool:
        return address in self.cleaning

    def clean_again(self, address: str) -> None:
        self.asked.append(("clean_again", address))

    def give_back(self, address: str) -> None:
        self.asked.append(("give_back", address))


class Agent(AgentWith):
    """The agent as the endpoint sees it (compute_agent/rpc/served.py)."""

    def __init__(self, tracker: Tracker, cleaner: Cleaner, last_tree: ProviderTree):
        manager = RecordingManager()
        manager.tracker = tracker
        super().__init__(manager)
        self.policy = SimpleNamespace(host="host-1", root_uuid=PROVIDER)
        self.cleaner = cleaner
        self.last_tree = last_tree
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


USED, FAILED = "0000:81:00.1", "0000:81:00.2"


@pytest.fixture
def agent() -> Agent:
    uses = [(DeviceUse(USED), True),
            (DeviceUse(FAILED, UseState.CLEANING_FAILED, "exit status 1"), False)]
    tree = ProviderTree([Provider(PROVIDER, "host-1", None, {"VCPU": inventory(8)},
                                  frozenset({"COMPUTE_NODE"}), None, 3),
                         Provider(MIGRATION, "host-1_numa_0", PROVIDER, generation=1)])
    return Agent(Tracker({INSTANCE: {"name": "a"}}, ["row-1", "row-2"], uses),
                 Cleaner({USED}), tree)


def served(agent: Agent) -> ComputeAgentEndpoint:
    return ComputeAgentEndpoint(agent)  # type: ignore[arg-type]


def test_the_host_info_counts_what_the_agent_holds(agent):
    assert served(agent).get_host_info({}) == {
        "host": "host-1", "root_uuid": PROVIDER, "rpc_version": rpc_versions.VERSION,
        "instances": 1, "assignments": 2, "providers": 2}


def test_the_provider_tree_keeps_the_name_1_0_gave_the_parent(agent):
    tree = served(agent).get_provider_tree({})
    assert [(p["uuid"], p["parent_uuid"], p["parent_provider_uuid"]) for p in tree] == [
        (PROVIDER, None, None), (MIGRATION, PROVIDER, PROVIDER)]
    assert tree[0]["traits"] == ["COMPUTE_NODE"] and tree[0]["generation"] == 3


def test_device_uses_say_whether_held_and_whether_cleaning_now(agent):
    assert served(agent).list_device_uses({}) == [
        {"address": USED, "state": "used", "reason": "", "held": True, "cleaning": True},
        {"address": FAILED, "state": "cleaning_failed", "reason": "exit status 1",
         "held": False, "cleaning": False}]


def test_a_cleaning_asked_again_answers_the_devices_entry_or_clean(agent):
    e = served(agent)
    assert e.clean_device({}, address=FAILED.upper()) == {
        "address": FAILED, "state": "cleaning_failed", "reason": "exit status 1",
        "held": False, "cleaning": False}
    assert e.clean_device({}, address="0000:81:00.3") == {"address": "0000:81:00.3",
                                                          "state": "clean"}
    assert agent.cleaner.asked == [("clean_again", FAILED), ("clean_again", "0000:81:00.3")]


def test_a_device_given_back_by_hand_wakes_the_update_loop(agent):
    assert served(agent).release_device({}, address=FAILED) == {"address": FAILED,
                                                               "state": "clean"}
    assert agent.cleaner.asked == [("give_back", FAILED)] and agent.woken == 1


def test_a_live_migration_to_this_same_host_is_refused_before_the_manager_is_asked(agent):
    with pytest.raises(messaging.ExpectedException) as raised:
        served(agent).check_can_live_migrate_source(
            {}, migration_uuid=MIGRATION, instance_uuid=INSTANCE, destination_host="host-1")
    refused = raised.value.exc_info[1]
    assert isinstance(refused, InvalidRequest)
    assert str(refused) == ("destination_host: is this host; a live migration moves the "
                            "instance to another (value: 'host-1')")
    assert agent.manager.calls == []


def test_a_rebuild_that_fails_after_its_answer_is_one_warning_for_the_loop_to_resume(caplog):
    e = endpoint(RuntimeError("libvirt:\n  domain not defined"))
    e.endpoint._rebuild(MIGRATION)
    (record,) = caplog.records
    assert (record.levelno, record.getMessage()) == (
        logging.WARNING, f"Evacuation {MIGRATION}: the rebuild failed, resumed at the next "
                         "cycle: libvirt: domain not defined")


def test_what_a_caller_is_told_of_an_error_is_one_short_line():
    assert short(RuntimeError("a\n  b")) == "a b"
    assert short(RuntimeError()) == "RuntimeError"
    told = short(RuntimeError("x" * 500))
    assert len(told) == REASON_LENGTH and told.endswith("...")


def test_the_warning_filter_is_installed_once_per_process():
    warn_of_unserved_calls()
    warn_of_unserved_calls()
    filters = logging.getLogger(DISPATCH_LOGGER).filters
    assert sum(isinstance(f, UnservedCallsAsWarnings) for f in filters) == 1
