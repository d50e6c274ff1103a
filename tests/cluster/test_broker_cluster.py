"""Agents on a cluster of three RabbitMQ nodes with the queue settings
operators use (docs/operations.md: quorum queues, transient ones too,
stream fanout, the queue manager), and the cluster's faults: the node an
agent's RPC server is connected to stopped and started again, the leader
of an agent's queue likewise, a node paused (SIGSTOP) and resumed, reply
queues and an agent's own queues deleted under them.

While each fault lasts, a conductor builds and deletes instances on both
hosts, repeating each call with its uuids until it is answered (every call
is idempotent on them). Afterwards every agent answers and takes a build
within a bound measured here (the times are printed: run with -s), and
the audit finds each acknowledged build once and each acknowledged delete
gone, in the store, the guests and Placement, and every host up to
compute-agent-ctl hosts.

The cluster and the two agents (fake driver) are started once for the
module: three Erlang nodes are heavy on a 2-core machine."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.messaging import messaging
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.helpers import get, put_allocations, unallocate, used, write_conf
from tests.functional.private_services import (
    CLUSTER_HEARTBEAT_TIMEOUT_THRESHOLD,
    CLUSTER_RABBIT_OPTIONS,
    PrivateRabbitCluster,
)
from tests.functional.test_daemon import HOST, run, start_daemon
from tests.waiting import wait_for

# Short, so that the evacuation fence's question to a paused agent ends soon.
SERVICE_DOWN_TIME = 5
SPEC = {"name": "bus", "vcpus": 1, "memory_mb": 64}
RESOURCES = {"VCPU": 1, "MEMORY_MB": 64}
# A build claims one VCPU and MEMORY_MB on the host's one cell.
ASSIGNMENTS_PER_INSTANCE = 2
# How many instances the load keeps on each host before it deletes one.
LIVE_PER_HOST = 3
# A call's own timeout, and how long one operation is repeated before the
# load gives up on it (an operation never acknowledged fails the test).
CALL_TIMEOUT = 5
OPERATION_DEADLINE = 180
# The bound on the time from a fault (a node stopped, a node resumed, a
# queue deleted) until every agent answers and takes a build. Measured on
# the 2-core machine under the other tests' load: a stop, 1 to 3 s after
# the node is gone; a start, ...; a pause, ... after the resume.
RECOVERY_BOUND = 30
# The cluster's Erlang net_ticktime: a node that does not answer for 15 to
# 19 s is down to the others. A pause shorter is a stall; longer, a
# partition. Not lower: on this loaded machine a node starved of CPU
# would be taken for down.
NET_TICKTIME = 15
STALL_SECONDS = 5
PARTITION_SECONDS = 60
# An agent connected to a node that hangs sees it gone when the node's AMQP
# heartbeats stop, 3 to 4 times heartbeat_timeout_threshold (seen: 30 s at
# 10, 175 s at oslo.messaging's 60), then connects to another: served
# again 37 s into the pause at 10, 64 s at 15.
HUNG_NODE_BOUND = 4 * CLUSTER_HEARTBEAT_TIMEOUT_THRESHOLD + RECOVERY_BOUND


@dataclass
class ClusterAgent:
    """A compute-agent daemon (fake driver, its guests in a file) whose
    transport_url names the three nodes."""

    name: str
    directory: Path
    conf: Path
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.directory / "agent.log"

    @property
    def root(self) -> str:
        return (self.directory / "state" / "compute_id").read_text().strip()

    def guests(self) -> set[str]:
        """The instances the (fake) hypervisor runs."""
        return set(json.loads((self.directory / "hypervisor.json").read_text())["guests"])

    def start(self) -> None:
        self.proc = start_daemon(self.conf, self.log)
        wait_for(lambda: "compute-agent running as host" in self.log.read_text()
                 or self.proc.poll() is not None, timeout=120)
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateRabbitCluster]:
    nodes = PrivateRabbitCluster(net_ticktime=NET_TICKTIME)
    try:
        yield nodes.start_all()
    finally:
        nodes.close()


@pytest.fixture(scope="module")
def agents(cluster, placement, tmp_path_factory) -> Iterator[list[ClusterAgent]]:
    root = tmp_path_factory.mktemp("cluster-agents")
    made = []
    for letter in "ab":
        name = f"bus-{letter}-{uuid.uuid4().hex[:6]}"
        conf = write_conf(root / name, placement.url, name, HOST,
                          DEFAULT={"transport_url": cluster.url,
                                   "service_down_time": SERVICE_DOWN_TIME},
                          fake={"state_file": str(root / name / "hypervisor.json")},
                          oslo_messaging_rabbit=CLUSTER_RABBIT_OPTIONS)
        made.append(ClusterAgent(name, root / name, conf))
    try:
        for agent in made:
            agent.start()
        yield made
    finally:
        for agent in made:
            agent.stop()


@pytest.fixture(scope="module")
def conductor(agents) -> Iterator[ComputeAgentAPI]:
    """The test's conductor, with the agents' config (so their bus)."""
    api = ComputeAgentAPI(load_config(["--config-file", str(agents[0].conf)]),
                          timeout=CALL_TIMEOUT)
    try:
        yield api
    finally:
        api.close()


@dataclass
class Ledger:
    """What the conductor was told: the instances each host acknowledged
    building and has not acknowledged deleting; the deleted ones."""

    live: dict[str, list[str]]
    deleted: set[str] = field(default_factory=set)
    builds: int = 0
    deletes: int = 0
    # Sends of a call after its first went unanswered (the same uuids).
    repeats: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture(scope="module")
def ledger(agents) -> Ledger:
    return Ledger({agent.name: [] for agent in agents})


def acknowledged(ledger: Ledger, call: Callable[[], Any]) -> Any:
    """``call``'s answer, the call sent again (the same uuids) for as long as
    no answer comes, up to OPERATION_DEADLINE."""
    deadline = time.monotonic() + OPERATION_DEADLINE
    while True:
        try:
            return call()
        except messaging.MessagingTimeout:
            if time.monotonic() > deadline:
                raise
            with ledger.lock:
                ledger.repeats += 1


def in_placement(write: Callable[[], None]) -> None:
    """``write`` (a helper asserting Placement's answer), asked again while
    it fails: the test's Placement, on SQLite, answers 500 (database is
    locked) now and then under the agents' writes, and a conductor asks
    again."""
    refusals: list[str] = []

    def written() -> bool:
        try:
            write()
            return True
        except AssertionError as e:
            refusals.append(str(e))
            return False
    try:
        wait_for(written, timeout=30, interval=0.5)
    except AssertionError:
        raise AssertionError(f"Placement refused {len(refusals)} times: "
                             f"{refusals[0]} ... {refusals[-1]}") from None


def build(api: ComputeAgentAPI, ledger: Ledger, url: str, host: str) -> None:
    """A conductor's build: allocations in Placement, then the agent's."""
    instance = str(uuid.uuid4())
    cell = get(url, f"/resource_providers?name={host}_numa_0")["resource_providers"][0]["uuid"]
    allocations = {cell: {"resources": RESOURCES}}
    in_placement(lambda: put_allocations(url, instance, allocations))
    answer = acknowledged(ledger, lambda: api.build_instance(host, instance, SPEC, allocations))
    assert answer["running"], answer
    with ledger.lock:
        ledger.live[host].append(instance)
        ledger.builds += 1


def delete(api: ComputeAgentAPI, ledger: Ledger, url: str, host: str) -> None:
    """A conductor's delete of the host's oldest instance: the agent's, then
    its allocations in Placement."""
    with ledger.lock:
        instance = ledger.live[host][0]
    assert acknowledged(ledger, lambda: api.delete_instance(host, instance))["deleted"]
    in_placement(lambda: unallocate(url, instance))
    with ledger.lock:
        ledger.live[host].remove(instance)
        ledger.deleted.add(instance)
        ledger.deletes += 1


@contextmanager
def load(api: ComputeAgentAPI, ledger: Ledger, url: str, hosts: list[str]) -> Iterator[None]:
    """Builds and deletes on every host, one after the other, for as long as
    the block runs; an operation the load could not get acknowledged fails
    the test at the block's end."""
    stop = threading.Event()
    failed: list[BaseException] = []

    def operate() -> None:
        while not stop.is_set():
            for host in hosts:
                try:
                    if len(ledger.live[host]) >= LIVE_PER_HOST:
                        delete(api, ledger, url, host)
                    else:
                        build(api, ledger, url, host)
                except BaseException as e:
                    failed.append(e)
                    return
            stop.wait(0.2)

    worker = threading.Thread(target=operate, name="conductor-load", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(OPERATION_DEADLINE + 30)
    assert not worker.is_alive(), "an operation still waits for its answer"
    assert not failed, failed


def answers(api: ComputeAgentAPI, host: str) -> bool:
    try:
        api._call(host, "get_host_info", timeout=2)
        return True
    except messaging.MessagingTimeout:
        return False


def serving_again(api: ComputeAgentAPI, ledger: Ledger, url: str, hosts: list[str],
                  since: float) -> float:
    """Seconds from ``since`` until every host answers and takes a build."""
    for host in hosts:
        wait_for(lambda: answers(api, host), timeout=OPERATION_DEADLINE,
                 interval=0.2)
        build(api, ledger, url, host)
    return round(time.monotonic() - since, 1)


def audit(api: ComputeAgentAPI, ledger: Ledger, url: str, agents: list[ClusterAgent]) -> dict:
    """Each acknowledged build there once and each acknowledged delete gone:
    in the agent's store (over RPC, and compute-agent-manage audit), its
    guests and Placement; every host up to compute-agent-ctl hosts. The
    counts."""
    for agent in agents:
        live = set(ledger.live[agent.name])
        assert {i["uuid"] for i in api.list_instances(agent.name)} == live
        info = api.get_host_info(agent.name)
        assert (info["instances"], info["assignments"]) == (
            len(live), ASSIGNMENTS_PER_INSTANCE * len(live)), info
        assert agent.guests() == live
        assert used(url, agent.root) == (
            {rc: n * len(live) for rc, n in RESOURCES.items()} if live else {})
        done = run("compute-agent-manage", agent.conf, "audit", "--json")
        assert json.loads(done.stdout) == {"consistent": True, "findings": [],
                                           "unknown": []}, done.stderr
    for instance in ledger.deleted:
        assert get(url, f"/allocations/{instance}")["allocations"] == {}
        assert all(instance not in agent.guests() for agent in agents)
    hosts = run("compute-agent-ctl", agents[0].conf, "hosts", "--json")
    assert hosts.returncode == 0, hosts.stderr
    assert {h["host"]: h["state"] for h in json.loads(hosts.stdout)
            if h["host"] in ledger.live} == {agent.name: "up" for agent in agents}
    return {"builds": ledger.builds, "deletes": ledger.deletes, "repeats": ledger.repeats,
            "live": sum(len(v) for v in ledger.live.values())}


def said(what: str, **figures: Any) -> None:
    print(f"\n{what}: " + ", ".join(f"{k} {v}" for k, v in figures.items()), file=sys.stderr)


def test_agents_serve_on_quorum_queues_that_a_restart_reuses(
        cluster, agents, conductor, ledger, placement):
    a, b = agents
    build(conductor, ledger, placement.url, b.name)
    queues = cluster.queues()
    nodes = sorted(node.node for node in cluster.nodes)
    for agent in agents:
        for name in (f"compute-agent.{agent.name}", f"compute-agent-heartbeat.{agent.name}"):
            assert (queues[name]["type"], sorted(queues[name]["members"])) == ("quorum", nodes)
    # The agents' one server declares no fanout, stream or queue (host_server.py).
    assert not [name for name in queues if "_fanout" in name]

    # A restart declares the same queues again: none is left behind.
    a.stop()
    a.start()
    build(conductor, ledger, placement.url, a.name)
    assert set(cluster.queues()) == set(queues)
    said("counts", **audit(conductor, ledger, placement.url, agents))


def test_the_node_an_agents_rpc_server_is_connected_to_stopped_and_started(
        cluster, agents, conductor, ledger, placement):
    hosts = [agent.name for agent in agents]
    [node] = cluster.consumer_nodes(f"compute-agent.{agents[0].name}")
    with load(conductor, ledger, placement.url, hosts):
        started = time.monotonic()
        cluster.stop(node)
        stopped = serving_again(conductor, ledger, placement.url, hosts, started)
        started = time.monotonic()
        cluster.start(node)
        back = serving_again(conductor, ledger, placement.url, hosts, started)
    assert cluster.running() == [0, 1, 2]
    said("node of an RPC server stopped", serving_after_stop_s=stopped,
         serving_after_start_s=back)
    said("counts", **audit(conductor, ledger, placement.url, agents))
    assert stopped < RECOVERY_BOUND and back < RECOVERY_BOUND


def test_the_leader_of_an_agents_queue_stopped_and_started(
        cluster, agents, conductor, ledger, placement):
    """The leader on another node than the agent's consumer: the agent
    keeps its connection, and its queue elects another leader."""
    hosts = [agent.name for agent in agents]
    queue = f"compute-agent.{agents[1].name}"
    [consumer] = cluster.consumer_nodes(queue)
    if cluster.leader(queue) == consumer:
        cluster.move_leader(queue, away_from=consumer)
    leader = cluster.leader(queue)
    assert leader != consumer
    with load(conductor, ledger, placement.url, hosts):
        started = time.monotonic()
        cluster.stop(leader)
        stopped = serving_again(conductor, ledger, placement.url, hosts, started)
        started = time.monotonic()
        cluster.start(leader)
        back = serving_again(conductor, ledger, placement.url, hosts, started)
    assert cluster.running() == [0, 1, 2]
    said("leader stopped", serving_after_stop_s=stopped, serving_after_start_s=back)
    said("counts", **audit(conductor, ledger, placement.url, agents))
    assert stopped < RECOVERY_BOUND and back < RECOVERY_BOUND
