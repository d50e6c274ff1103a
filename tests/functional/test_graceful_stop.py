"""SIGTERM with a call in flight: the real compute-agent daemon (libvirt
test driver, the real Placement, the machine's RabbitMQ) stops taking
calls, answers the ones it took, then exits 0; a call that comes after
the stop began is served by the next start; a call longer than
graceful_shutdown_timeout is cut, and the next start rolls it back.

A call is held in flight by a hook put on the daemon's PYTHONPATH
(HOLD_A_METHOD): one method of the agent, mid-way through the call (the
claim recorded, the guest not yet defined, say), waits until the test
says go."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from keystoneauth1 import adapter, session

from compute_agent.cmd.common import load_config
from compute_agent.exception import NoSuchInstance
from compute_agent.placement.allocations import move_allocations
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.heartbeat import Heartbeat
from tests.functional.helpers import put_allocations, wait_for
from tests.functional.test_rpc import BIGGER, BROKER, SPEC, AgentDaemon

CHECKOUT = Path(__file__).resolve().parents[2]

# sitecustomize.py on the daemon's PYTHONPATH: HOLD_AT's method
# (module:Class.method) waits, each time it is called, until the file
# HOLD_GO exists; HOLD_MARK is made when it begins to wait.
HOLD_A_METHOD = """
import importlib.abc, importlib.util, os, sys, time

MODULE, _, ATTRIBUTE = os.environ["HOLD_AT"].partition(":")
CLASS, METHOD = ATTRIBUTE.split(".")

def held(original):
    def wait_then_go(*args, **kwargs):
        open(os.environ["HOLD_MARK"], "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.environ["HOLD_GO"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return original(*args, **kwargs)
    return wait_then_go

class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def run_then_hold(module):
            run(module)
            cls = getattr(module, CLASS)
            setattr(cls, METHOD, held(getattr(cls, METHOD)))
        spec.loader.exec_module = run_then_hold
        return spec

sys.meta_path.insert(0, Hold())
"""

# Where each call is held: mid-way, once it has recorded what it does.
SPAWN = "compute_agent.drivers.libvirt.driver:LibvirtDriver.spawn"
HOLD_POINTS = {
    # The claim on disk, the guest not yet defined.
    "build_instance": SPAWN,
    # The move known, its claim about to be made.
    "prep_resize": "compute_agent.compute.host:Host.claim_move",
    # The migration holds the devices, the guest not yet stopped.
    "resize_instance": "compute_agent.drivers.libvirt.driver:LibvirtDriver.power_off",
    # The move's devices claimed, the guest not yet on them.
    "finish_resize": "compute_agent.compute.host:Host.run_with_store_devices",
    # The new devices in use, the old ones about to be given back.
    "confirm_resize": "compute_agent.compute.tracker:Tracker.confirm_move",
    # The guest off the new devices, the old ones about to be its own again.
    "revert_resize": "compute_agent.compute.tracker:Tracker.revert_move",
    # The guest checked, the move about to be announced.
    "check_can_live_migrate_source":
        "compute_agent.compute.tracker:Tracker.announce_move_source",
    # The move known here, its claim about to be made.
    "check_can_live_migrate_destination": "compute_agent.compute.tracker:Tracker.claim_move",
}
# A bound the held calls outlive.
SHORT_BOUND = 3


class HeldAgent(AgentDaemon):
    """An agent daemon whose HOLD_AT method waits for the test."""

    def __init__(self, tmp_path: Path, placement_url: str, bound: int = 60) -> None:
        super().__init__(tmp_path, placement_url)
        self.conf = self.host.write_conf({"transport_url": BROKER, "update_interval": 2,
                                          "graceful_shutdown_timeout": bound})
        self.hook = tmp_path / "hook"
        self.hook.mkdir()
        (self.hook / "sitecustomize.py").write_text(HOLD_A_METHOD)
        self.mark, self.go = tmp_path / "holding", tmp_path / "go"

    def start_holding(self, api: ComputeAgentAPI, hold_at: str) -> HeldAgent:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.hook), str(CHECKOUT)]),
               "HOLD_AT": hold_at, "HOLD_MARK": str(self.mark), "HOLD_GO": str(self.go)}
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "compute-agent"), "--config-file",
             str(self.conf)], stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: self._answers(api), timeout=60)
        return self

    def text(self) -> str:
        return self.log.read_text()


class InFlight:
    """A call made in a thread of its own: its answer, or what it raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.answer: Any = None
        self.error: BaseException | None = None
        self.answered_at: float | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.answer = call()
        except BaseException as e:  # the test looks at it
            self.error = e
        self.answered_at = time.monotonic()

    def outcome(self, timeout: float) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "no answer"
        if self.error is not None:
            raise self.error
        return self.answer


@pytest.fixture
def world(tmp_path, placement, services):
    agent = HeldAgent(tmp_path / "a", placement.url)
    conf = load_config(["--config-file", str(agent.conf)])
    api = ComputeAgentAPI(conf, timeout=90)
    heartbeat = Heartbeat(conf, down_after=5)
    yield agent, api, heartbeat, placement
    agent.go.touch()
    agent.stop()
    heartbeat.close()
    api.close()


def schedule(placement, agent: AgentDaemon, consumer: str, **resources: int) -> dict:
    allocations = agent.allocations(**resources)
    put_allocations(placement.url, consumer, allocations)
    return allocations


def sigterm_while_held(agent: HeldAgent) -> None:
    """SIGTERM once the call is held; returns once the stop says it waits."""
    wait_for(agent.mark.exists, 60)
    agent.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "stopping: 1 calls in flight" in agent.text(), 30)


def test_a_build_in_flight_at_sigterm_is_answered_the_host_up_meanwhile_then_exit_0(world):
    agent, api, heartbeat, placement = world
    agent.start_holding(api, SPAWN)
    instance = str(uuid.uuid4())
    allocations = schedule(placement, agent, instance)
    build = InFlight(lambda: api.build_instance(agent.name, instance, SPEC, allocations))
    sigterm_while_held(agent)
    # A host that drains is up: an evacuation's fence finds it so.
    assert heartbeat.check(agent.name).up
    assert agent.proc.poll() is None
    agent.go.touch()
    assert build.outcome(60)["running"] is True
    assert agent.proc.wait(60) == 0
    text = agent.text()
    assert "compute-agent stopped" in text and " cut by " not in text


def test_a_call_after_sigterm_is_not_taken_and_the_next_start_serves_it(world):
    agent, api, heartbeat, placement = world
    agent.start_holding(api, SPAWN)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    first_allocations = schedule(placement, agent, first)
    second_allocations = schedule(placement, agent, second)
    held = InFlight(lambda: api.build_instance(agent.name, first, SPEC, first_allocations))
    sigterm_while_held(agent)
    late = InFlight(lambda: api.build_instance(agent.name, second, SPEC, second_allocations))
    time.sleep(2)  # delivered to the stopping daemon by now, were it consuming
    agent.go.touch()
    held.outcome(60)
    assert agent.proc.wait(60) == 0
    stopped_at = time.monotonic()
    assert late.answered_at is None
    # The next start (no hold) serves the request the stopping one left.
    agent.proc = None
    agent.start(api)
    assert late.outcome(60)["running"] is True
    assert late.answered_at is not None and late.answered_at > stopped_at


def test_a_call_longer_than_the_bound_is_cut_and_the_next_start_rolls_it_back(
        tmp_path, placement, services):
    agent = HeldAgent(tmp_path / "a", placement.url, bound=SHORT_BOUND)
    conf = load_config(["--config-file", str(agent.conf)])
    api = ComputeAgentAPI(conf, timeout=90)
    try:
        agent.start_holding(api, SPAWN)
        instance = str(uuid.uuid4())
        allocations = schedule(placement, agent, instance)
        build = InFlight(lambda: api.build_instance(agent.name, instance, SPEC, allocations))
        sigterm_while_held(agent)
        started = time.monotonic()
        assert agent.proc.wait(30) == 0
        # Exited at the bound (the drain began before ``started``).
        assert time.monotonic() - started < SHORT_BOUND + 2
        assert (f"Call build_instance of instance {instance} cut by "
                f"graceful_shutdown_timeout ({SHORT_BOUND} s)") in agent.text()
        # The next start finds the claim with no guest: rolled back.
        agent.proc = None
        agent.start(api)
        with pytest.raises(NoSuchInstance):
            api.get_instance(agent.name, instance)
        # The build, cut, got no answer: the caller's retry builds it.
        assert build.answered_at is None
        assert api.build_instance(agent.name, instance, SPEC, allocations)["running"] is True
    finally:
        agent.go.touch()
        agent.stop()
        api.close()


def placement_client(placement) -> PlacementClient:
    return PlacementClient(adapter.Adapter(session.Session(auth=NoAuth2(placement.url)),
                                           service_type="placement"))


def resize_up_to(method: str, api: ComputeAgentAPI, agent: AgentDaemon, placement
                 ) -> tuple[str, str, Callable[[], Any]]:
    """A same-host resize of an instance built here, its steps made up to
    ``method``: (instance, migration, the call of ``method``)."""
    instance = str(uuid.uuid4())
    allocations = schedule(placement, agent, instance)
    api.build_instance(agent.name, instance, SPEC, allocations)
    migration = str(uuid.uuid4())
    move_allocations(placement_client(placement), instance, migration)
    bigger = schedule(placement, agent, instance, vcpus=4, memory_mb=2048)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("prep_resize", lambda: api.prep_resize(agent.name, migration, instance, BIGGER,
                                                bigger)),
        ("resize_instance", lambda: api.resize_instance(agent.name, migration, instance)),
        ("finish_resize", lambda: api.finish_resize(agent.name, migration, instance))]
    ends = {"confirm_resize": lambda: api.confirm_resize(agent.name, migration, instance),
            "revert_resize": lambda: api.revert_resize(agent.name, migration, instance)}
    for name, call in steps:
        if name == method:
            return instance, migration, call
        call()
    return instance, migration, ends[method]


@pytest.mark.parametrize("method", ["prep_resize", "resize_instance", "finish_resize",
                                    "confirm_resize", "revert_resize"])
def test_a_move_step_in_flight_at_sigterm_is_answered_then_exit_0(world, method):
    agent, api, heartbeat, placement = world
    agent.start_holding(api, HOLD_POINTS[method])
    instance, migration, step = resize_up_to(method, api, agent, placement)
    answered = InFlight(step)
    sigterm_while_held(agent)
    assert heartbeat.check(agent.name).up
    agent.go.touch()
    answer = answered.outcome(60)
    if method == "finish_resize":  # the instance, running on its new devices
        assert answer["uuid"] == instance and answer["running"] is True
    else:
        assert answer["migration_uuid"] == migration
    assert agent.proc.wait(60) == 0
    assert " cut by " not in agent.text()


def cpus_and_memory(agent: AgentDaemon) -> dict:
    """SPEC's allocations without devices: a VF not marked
    live_migratable would be refused."""
    return {agent.provider("numa_1"): {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}}


@pytest.mark.parametrize("method", ["check_can_live_migrate_source",
                                    "check_can_live_migrate_destination"])
def test_a_live_migration_step_in_flight_at_sigterm_is_answered_then_exit_0(world, method):
    agent, api, heartbeat, placement = world
    agent.start_holding(api, HOLD_POINTS[method])
    instance, migration = str(uuid.uuid4()), str(uuid.uuid4())
    allocations = cpus_and_memory(agent)
    put_allocations(placement.url, instance, allocations)
    if method == "check_can_live_migrate_source":
        api.build_instance(agent.name, instance, SPEC, allocations)
        answered = InFlight(lambda: api.check_can_live_migrate_source(
            agent.name, migration, instance, "elsewhere"))
    else:  # this host the destination; the source is not asked
        answered = InFlight(lambda: api.check_can_live_migrate_destination(
            agent.name, migration, instance, SPEC, allocations))
    sigterm_while_held(agent)
    assert heartbeat.check(agent.name).up
    agent.go.touch()
    assert answered.outcome(60)["migration_uuid"] == migration
    assert agent.proc.wait(60) == 0
    assert " cut by " not in agent.text()
