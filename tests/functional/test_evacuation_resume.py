"""compute-agent-ctl evacuate interrupted, and run in parallel: two
compute-agent daemons on the fake driver (durable stores, VFs from their
own host files), the real Placement and the real RabbitMQ.

- ctl SIGKILLed between its allocation write and its call to the
  destination: the next run finds the instance on the destination's
  providers with no record there, and calls again; an instance the
  destination had accepted before the kill is not called again. Each
  instance ends on the destination exactly once.
- Workers that pick the same capacity at once: Placement refuses all but
  one allocation write, and the others ask for candidates again.

The fake driver's guests die with their agent, which is all a down source
needs here (the real-QEMU evacuation with restarts is test_evacuation)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.conductor.evacuation import Evacuator
from compute_agent.conductor.live_migration import live_migrate_instance
from compute_agent.exception import NoSuchInstance
from compute_agent.moves.evacuation import evacuation_migration_uuid
from compute_agent.placement.client import PlacementClient, adapter_from_conf
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.heartbeat import Heartbeat
from tests.functional.helpers import get, put_allocations, wait_for, write_conf

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
SPEC = {"name": "evac", "vcpus": 1, "memory_mb": 256}
# Marked live-migratable, so that an instance can also go back by a live
# migration (test_bug_second_evacuation_...).
VF_SPEC = ('{"vendor_id": "8086", "product_id": "154c", "resource_class": "SRIOV_NET_VF", '
           '"live_migratable": "yes"}')
DOWN_AFTER = 2


def fake_host(pfs: int, vfs_per_pf: int) -> dict:
    """One NUMA cell, ``pfs`` PFs on it with ``vfs_per_pf`` VFs each."""
    return {"disk_gb": 100,
            "numa_cells": [{"id": 0, "cpus": "0-15", "memory_mb": 65536}],
            "pci_devices": [{"address": f"0000:{0x20 + i:02x}:00.0", "vendor_id": "8086",
                             "product_id": "1572", "numa_node": 0,
                             "vfs": {"count": vfs_per_pf, "product_id": "154c"}}
                            for i in range(pfs)]}


class FakeAgent:
    """A compute-agent daemon on the fake driver."""

    def __init__(self, directory: Path, url: str, pfs: int, vfs_per_pf: int,
                 hypervisor_file: bool = False):
        """``hypervisor_file``: its guests live in a file (``[fake]
        state_file``), as live migrations between two fake hosts need."""
        self.name = f"evres-{uuid.uuid4().hex[:8]}"
        self.url = url
        fake = {"state_file": str(directory / "hypervisor.json")} if hypervisor_file else {}
        self.conf = write_conf(directory, url, self.name, fake_host(pfs, vfs_per_pf),
                               pci={"device_spec": VF_SPEC}, fake=fake,
                               DEFAULT={"transport_url": BROKER,
                                        "service_down_time": DOWN_AFTER})
        self.log = directory / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self, api: ComputeAgentAPI) -> FakeAgent:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compute_agent.cmd.agent", "--config-file", str(self.conf)],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        wait_for(lambda: self._answers(api), timeout=60)
        return self

    def _answers(self, api: ComputeAgentAPI) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return bool(api._call(self.name, "get_host_info", timeout=2)["providers"])
        except Exception:
            return False

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def root(self) -> str:
        return get(self.url, f"/resource_providers?name={self.name}"
                   )["resource_providers"][0]["uuid"]

    def provider(self, suffix: str) -> str:
        return get(self.url, f"/resource_providers?name={self.name}_{suffix}"
                   )["resource_providers"][0]["uuid"]

    def allocations(self, pf: int) -> dict:
        return {self.provider("numa_0"): {"resources": {"VCPU": 1, "MEMORY_MB": 256}},
                self.provider(f"0000:{0x20 + pf:02x}:00.0"):
                    {"resources": {"SRIOV_NET_VF": 1}}}

    def providers(self) -> set[str]:
        return {p["uuid"] for p in get(
            self.url, f"/resource_providers?in_tree={self.root()}")["resource_providers"]}


@pytest.fixture
def pair(tmp_path, placement, services):
    """A (down, with the instances) and B (up); the test says how big B is."""
    made: list[FakeAgent] = []
    apis: list[ComputeAgentAPI] = []

    def make(instances: int, b_pfs: int, b_vfs: int, hypervisor_files: bool = False):
        a = FakeAgent(tmp_path / "a", placement.url, 1, instances, hypervisor_files)
        b = FakeAgent(tmp_path / "b", placement.url, b_pfs, b_vfs, hypervisor_files)
        made.extend((a, b))
        api = ComputeAgentAPI(load_config(["--config-file", str(a.conf)]), timeout=30)
        apis.append(api)
        a.start(api)
        b.start(api)
        built = []
        for _ in range(instances):
            instance = str(uuid.uuid4())
            put_allocations(placement.url, instance, a.allocations(0))
            assert api.build_instance(a.name, instance, SPEC, a.allocations(0))["running"]
            built.append(instance)
        a.kill()  # A is down
        return a, b, api, sorted(built)

    yield make
    for agent in made:
        agent.kill()
    for api in apis:
        api.close()


def held_by(url: str, consumer: str) -> set[str]:
    return set(get(url, f"/allocations/{consumer}")["allocations"])


def ctl(conf: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compute_agent.cmd.ctl", "--config-file",
                           str(conf), "--timeout", "30", *args],
                          capture_output=True, text=True, timeout=90)


# ctl, with one difference: its first rebuild_instance goes through, and its
# second stops before the call, names its instance in MARK and waits to be
# killed. The allocation write before it is the real one.
CTL_STOPPED_BEFORE_SECOND_CALL = """
import sys, threading, time
from compute_agent.cmd import ctl
from compute_agent.conductor.live_migration import live_migrate_instance
from compute_agent.rpc.client import ComputeAgentAPI
mark = sys.argv[1]
calls = []
real = ComputeAgentAPI.rebuild_instance
def rebuild_instance(self, host, migration, instance, *args, **kwargs):
    calls.append(instance)
    if len(calls) == 1:
        return real(self, host, migration, instance, *args, **kwargs)
    with open(mark, "w") as f:
        f.write(instance)
    threading.Event().wait()
ComputeAgentAPI.rebuild_instance = rebuild_instance
sys.exit(ctl.main(sys.argv[2:]))
"""


def test_ctl_killed_between_the_allocation_write_and_the_call_then_run_again(
        pair, placement, tmp_path):
    a, b, api, instances = pair(instances=3, b_pfs=1, b_vfs=4)
    url = placement.url
    a_root = a.root()
    mark = tmp_path / "stopped-before-call"
    stopped = subprocess.Popen(
        [sys.executable, "-c", CTL_STOPPED_BEFORE_SECOND_CALL, str(mark),
         "--config-file", str(a.conf), "--timeout", "30", "evacuate", a.name,
         "--parallel", "1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: mark.exists() and mark.read_text(), timeout=60, interval=0.05)
    stopped.send_signal(signal.SIGKILL)
    stopped.communicate(timeout=30)
    # One at a time, in uuid order: the first was called, the second's
    # allocations written and never called, the third untouched.
    first, orphan, untouched = instances
    assert mark.read_text() == orphan
    orphan_move = evacuation_migration_uuid(orphan, a_root)
    assert held_by(url, orphan) <= b.providers() and held_by(url, orphan)
    assert held_by(url, orphan_move) <= a.providers() and held_by(url, orphan_move)
    with pytest.raises(NoSuchInstance):
        api.get_instance(b.name, orphan)
    assert held_by(url, untouched) <= a.providers()
    wait_for(lambda: api.get_instance(b.name, first)["running"], timeout=30)

    again = ctl(a.conf, "evacuate", a.name, "--json")
    assert again.returncode == 0, (again.stdout, again.stderr)
    outcomes = {o["instance"]: o for o in json.loads(again.stdout)["instances"]}
    # The one B had accepted is done there: not listed, not called again.
    assert set(outcomes) == {orphan, untouched}
    assert {(o["state"], o["destination"]) for o in outcomes.values()} == {
        ("running", b.name)}

    listed = api.list_instances(b.name)
    assert sorted(i["uuid"] for i in listed) == instances  # each once
    for instance in instances:
        view = api.get_instance(b.name, instance)
        assert view["running"], view
        assert [(m["uuid"], m["state"]) for m in view["migrations"]] == [
            (evacuation_migration_uuid(instance, a_root), "confirmed")]
        assert held_by(url, instance) <= b.providers()
        assert held_by(url, evacuation_migration_uuid(instance, a_root)) \
            <= a.providers()

    # A third run: nothing left to do, nothing called.
    third = ctl(a.conf, "evacuate", a.name, "--json")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["instances"] == []

    # A's tree holds only the moves' share now: no instance of its own.
    hosts = ctl(a.conf, "hosts")
    assert hosts.returncode == 0, hosts.stderr
    assert f"{a.name}  down  last seen unknown  instances 0" in hosts.stdout.splitlines()
    assert any(line.startswith(f"{b.name}  up  last seen 20")
               and line.endswith("instances 3") for line in hosts.stdout.splitlines())


class CandidatesAtOnce:
    """Placement's candidates, given to the workers' first asks together:
    each first ask waits until all of them have their answer, so they all
    choose from the same picture of B's capacity."""

    def __init__(self, placement: PlacementClient, workers: int):
        self._ask = placement.get_allocation_candidates
        self._barrier = threading.Barrier(workers, timeout=30)
        self._first: set[str] = set()
        self._lock = threading.Lock()
        self.asked = 0

    def __call__(self, query):
        answer = self._ask(query)
        with self._lock:
            self.asked += 1
            first = threading.get_ident() not in self._first
            self._first.add(threading.get_ident())
        if first:
            self._barrier.wait()
        return answer


def test_parallel_workers_that_pick_the_same_vf_ask_for_candidates_again(
        pair, placement):
    workers = 4
    a, b, api, instances = pair(instances=workers, b_pfs=workers, b_vfs=1)
    conf = load_config(["--config-file", str(a.conf)])
    client = PlacementClient(adapter_from_conf(conf))
    evacuator = Evacuator(client, api, Heartbeat(conf), parallel=workers)
    asked = CandidatesAtOnce(client, workers)
    client.get_allocation_candidates = asked
    try:
        result = evacuator.evacuate(a.name)
    finally:
        evacuator.heartbeat.close()

    assert result.ok, result.as_dict()
    assert [o.instance for o in result.outcomes] == instances
    assert {(o.state, o.destination) for o in result.outcomes} == {("running", b.name)}
    # B had one VF per PF: every instance on a PF of its own, after those
    # that lost the race asked again.
    pfs = [held_by(placement.url, i) - {b.provider("numa_0")} for i in instances]
    assert all(len(p) == 1 for p in pfs) and len(set.union(*pfs)) == workers
    assert asked.asked > workers
    assert sorted(i["uuid"] for i in api.list_instances(b.name)) == instances


def evacuate_to_the_other(source: FakeAgent, destination: FakeAgent, instance: str,
                          api: ComputeAgentAPI) -> None:
    """ctl evacuate SOURCE (down); the instance then runs on the destination."""
    done = ctl(source.conf, "evacuate", source.name, "--target", destination.name,
               "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert [(o["instance"], o["state"], o["destination"])
            for o in json.loads(done.stdout)["instances"]] == [
        (instance, "running", destination.name)]


def test_bug_second_evacuation_from_the_same_source_taken_for_a_retry(
        pair, placement):
    """An evacuation's name is a function of the instance and the source.
    Evacuated A -> B, live-migrated back B -> A (B keeps its record of the
    evacuation: a move's record stays when its instance only leaves), and
    evacuated A -> B again, the third move carries the first one's name:
    B answered it as a retry of the settled first (the instance confirmed,
    no devices) and built nothing, so the instance ran nowhere with its
    allocations on B. Found by the crash loop."""
    a, b, api, [instance] = pair(instances=1, b_pfs=1, b_vfs=1, hypervisor_files=True)
    url = placement.url
    a_root = a.root()
    evacuate_to_the_other(a, b, instance, api)
    a.start(api)  # A returns and gives the instance up
    wait_for(lambda: not held_by(url, evacuation_migration_uuid(instance, a_root)),
             timeout=30)
    conductor = PlacementClient(adapter_from_conf(
        load_config(["--config-file", str(a.conf)])))
    live_migrate_instance(api, conductor, instance, b.name, a.name, SPEC, a.allocations(0))
    assert api.get_instance(a.name, instance)["running"]
    with pytest.raises(NoSuchInstance):  # gone from B, whose store keeps its moves
        api.get_instance(b.name, instance)

    a.kill()
    evacuate_to_the_other(a, b, instance, api)  # the first one's name again

    view = api.get_instance(b.name, instance)
    assert view["running"], view
    assert (evacuation_migration_uuid(instance, a_root), "confirmed") in [
        (m["uuid"], m["state"]) for m in view["migrations"]]
    assert sorted(d["resource_class"] for d in view["assignments"]
                  if d["owner"] == "instance") == ["MEMORY_MB", "SRIOV_NET_VF", "VCPU"], view
    assert held_by(url, instance) == set(b.allocations(0))
    assert [i["uuid"] for i in api.list_instances(b.name)] == [instance]
