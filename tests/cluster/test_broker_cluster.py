"""Agents on a cluster of three RabbitMQ nodes with the queue settings
operators use (docs/operations.md: quorum queues, transient ones too,
stream fanout, the queue manager), and the cluster's faults: the node an
agent's RPC server is connected to stopped and started again, the leader
of an agent's queue likewise, a node paused (SIGSTOP) and resumed, briefly
and past net_ticktime (a partition), reply queues and an agent's own
queues deleted under them, and its queues' bindings lost.

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
import os
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
import requests

from compute_agent.cmd.common import load_config
from compute_agent.exception import BrokerUnavailable, SourceHostUp
from compute_agent.messaging import messaging
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.errors import NoAnswer
from compute_agent.rpc.host_server import DEAF, host_queues
from tests.functional.helpers import get, put_allocations, unallocate, used, write_conf
from tests.functional.private_services import (
    CLUSTER_HEARTBEAT_TIMEOUT_THRESHOLD,
    CLUSTER_RABBIT_OPTIONS,
    PrivateRabbitCluster,
    paused,
)
from tests.functional.test_daemon import HOST, run, start_daemon
from tests.waiting import wait_for

# The evacuation fence's wait for an answer: long enough for the test to
# find and delete the fence's reply queue while its question is in flight.
SERVICE_DOWN_TIME = 15
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
PLACEMENT_DEADLINE = 90
# The bound on the time from a fault (a node stopped, a node resumed, a
# queue deleted) until every agent answers and takes a build. Measured on
# the 2-core machine under other tests' load (3 runs): a stop, 4.6 to 6.4
# s; a start, 7.3 to 12.9 s; a pause, 0.4 to 6.9 s after the resume; a
# queue deleted or unbound, 1.2 to 4.7 s.
RECOVERY_BOUND = 30
# The cluster's Erlang net_ticktime: a node that does not answer for 11 to
# 19 s (0.75 to 1.25 times it) is down to the others. A pause shorter is a
# stall; longer, a partition. Not lower: on this loaded machine a node
# starved of CPU would be taken for down.
NET_TICKTIME = 15
STALL_SECONDS = 5
PARTITION_SECONDS = 2 * NET_TICKTIME
# The driver sees a node that hangs gone when its AMQP heartbeats stop, 2
# to 4 times heartbeat_timeout_threshold (seen: 30 s at 10, 175 s at
# oslo.messaging's 60), then connects to another: calls answered again 37
# s into the pause at 10; at 15, by the agents 23 to 61 s, by a caller 28
# to 66 s.
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


@contextmanager
def caller(conf: Path, transport_url: str | None = None) -> Iterator[ComputeAgentAPI]:
    """A conductor's client with ``conf`` (an agent's config, so its bus),
    on ``transport_url`` if given."""
    loaded = load_config(["--config-file", str(conf)])
    if transport_url is not None:
        loaded.set_override("transport_url", transport_url)
    api = ComputeAgentAPI(loaded, timeout=CALL_TIMEOUT)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="module")
def conductor(agents) -> Iterator[ComputeAgentAPI]:
    """The test's conductor, on the three nodes."""
    with caller(agents[0].conf) as api:
        yield api


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
    it fails, for up to PLACEMENT_DEADLINE: the test's Placement, on
    SQLite, answers 500 (database is locked) now and then under the
    agents' writes (for 30 s on end, seen with other tests' load on the
    machine), and a conductor asks again."""
    refusals: list[str] = []

    def written() -> bool:
        try:
            write()
            return True
        except AssertionError as e:
            refusals.append(str(e))
            return False
    try:
        wait_for(written, timeout=PLACEMENT_DEADLINE, interval=0.5)
    except AssertionError:
        raise AssertionError(f"Placement refused {len(refusals)} times: "
                             f"{refusals[0]} ... {refusals[-1]}") from None


def unallocated(url: str, instance: str) -> None:
    """The instance's allocations deleted, unless already gone: a try that
    answered 500 may have deleted them (seen under the machine's load),
    and the next then answers 404."""
    try:
        held = get(url, f"/allocations/{instance}")["allocations"]
    except requests.HTTPError as e:
        raise AssertionError(str(e)) from None  # asked again (in_placement)
    if held:
        unallocate(url, instance)


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
    in_placement(lambda: unallocated(url, instance))
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


def stopped_and_started(cluster: PrivateRabbitCluster, node: int, conductor: ComputeAgentAPI,
                        ledger: Ledger, placement_url: str, hosts: list[str]
                        ) -> tuple[float, float]:
    """``node`` stopped, then started again, under the load: the seconds
    until every host serves after each."""
    with load(conductor, ledger, placement_url, hosts):
        started = time.monotonic()
        cluster.stop(node)
        stopped = serving_again(conductor, ledger, placement_url, hosts, started)
        started = time.monotonic()
        cluster.start(node)
        back = serving_again(conductor, ledger, placement_url, hosts, started)
    return stopped, back


def test_the_node_an_agents_rpc_server_is_connected_to_stopped_and_started(
        cluster, agents, conductor, ledger, placement):
    hosts = [agent.name for agent in agents]
    [node] = cluster.consumer_nodes(f"compute-agent.{agents[0].name}")
    stopped, back = stopped_and_started(cluster, node, conductor, ledger, placement.url, hosts)
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
    stopped, back = stopped_and_started(cluster, leader, conductor, ledger, placement.url, hosts)
    assert cluster.running() == [0, 1, 2]
    said("leader stopped", serving_after_stop_s=stopped, serving_after_start_s=back)
    said("counts", **audit(conductor, ledger, placement.url, agents))
    assert stopped < RECOVERY_BOUND and back < RECOVERY_BOUND


def reply_queues(cluster: PrivateRabbitCluster, host: str, process: str) -> list[str]:
    """The queue manager's reply queues of ``process`` (its processname)
    for ``host``."""
    return [q for q in cluster.queues() if q.startswith(f"reply_{host}:{process}:")]


@contextmanager
def stopped(agent: ClusterAgent) -> Iterator[None]:
    """The agent's process stopped (SIGSTOP): what it was sent waits."""
    assert agent.proc is not None
    os.kill(agent.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)


class InFlight(threading.Thread):
    """``call`` in a thread of its own: its answer, or what it raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._call = call
        self.answer: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.answer = self._call()
        except BaseException as e:  # the test reads it
            self.error = e

    def outcome(self, timeout: float) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "the call is still waiting"
        if self.error is not None:
            raise self.error
        return self.answer


def test_reply_queues_deleted_under_a_caller_and_under_an_agent_are_declared_again(
        cluster, agents, conductor, ledger, placement):
    """The caller's reply queue deleted between two calls and while a call
    waits for its answer; the agent's, the evacuation fence's, deleted
    while its question waits. Each is declared again: by the driver, told
    of the deletion, or, when it missed it, by the caller after a call
    unanswered (compute_agent/rpc/replies.py). The next call is answered,
    and the fence never takes silence for down. Between calls an agent
    holds no reply queue (it deletes the fence's as it closes): the
    fence's is the one an agent can lose."""
    a, b = agents
    hosts = [agent.name for agent in agents]
    conductor.get_host_info(a.name)
    caller = load_config(["--config-file", str(a.conf)]).oslo_messaging_rabbit
    [ours] = reply_queues(cluster, caller.hostname, caller.processname)
    assert not reply_queues(cluster, a.name, "compute-agent")
    assert not reply_queues(cluster, b.name, "compute-agent")

    # The caller's, between two calls.
    cluster.delete_queue(ours)
    started = time.monotonic()
    between_calls = serving_again(conductor, ledger, placement.url, hosts, started)

    # The caller's, while b (stopped) holds the call: b's answer, once it
    # runs again, waits for the queue (a reply is sent with the mandatory
    # flag, and sent again while no queue takes it). When the driver
    # missed the deletion, the queue is declared again only after the
    # call goes unanswered (compute_agent/rpc/replies.py): the next is.
    with stopped(b):
        asking = InFlight(lambda: conductor._call(b.name, "get_host_info",
                                                  timeout=CALL_TIMEOUT + RECOVERY_BOUND))
        asking.start()
        cluster.delete_queue(ours)
        started = time.monotonic()
    try:
        in_flight_answered = asking.outcome(CALL_TIMEOUT + RECOVERY_BOUND + 30)["host"] == b.name
    except NoAnswer:
        in_flight_answered = False
        serving_again(conductor, ledger, placement.url, hosts, started)
    in_flight = round(time.monotonic() - started, 1)

    # The agent's: b rebuilds an instance of a's, and its fence asks a
    # (stopped) whether it is up. The fence's reply queue deleted, a
    # answers: the fence hears it, and refuses the rebuild; or, when its
    # driver missed the deletion (compute_agent/rpc/replies.py), knows the
    # answer lost and refuses it too. Never: a taken for down, and an
    # instance it runs rebuilt on b.
    cell = get(placement.url, f"/resource_providers?name={b.name}_numa_0")[
        "resource_providers"][0]["uuid"]

    def rebuild_on_b() -> Any:
        return conductor._call(
            b.name, "rebuild_instance", version="1.3", timeout=CALL_TIMEOUT + SERVICE_DOWN_TIME,
            migration_uuid=str(uuid.uuid4()), instance_uuid=str(uuid.uuid4()), spec=SPEC,
            allocations={cell: {"resources": RESOURCES}}, source_host=a.name, force=False)

    with stopped(a):
        rebuild = InFlight(rebuild_on_b)
        rebuild.start()
        [fence] = wait_for(lambda: reply_queues(cluster, b.name, "compute-agent"),
                           timeout=SERVICE_DOWN_TIME, interval=0.2)
        cluster.delete_queue(fence)
        started = time.monotonic()
    with pytest.raises((SourceHostUp, BrokerUnavailable)) as verdict:
        rebuild.outcome(CALL_TIMEOUT + SERVICE_DOWN_TIME + 30)
    fence_verdict = round(time.monotonic() - started, 1)
    # Closed, the fence deleted its queue; the next one is answered.
    wait_for(lambda: not reply_queues(cluster, b.name, "compute-agent"), timeout=30)
    with pytest.raises(SourceHostUp):
        rebuild_on_b()

    said("reply queues deleted", caller_between_calls_s=between_calls,
         caller_in_flight_s=in_flight, in_flight_call_answered=in_flight_answered,
         agents_fence_verdict_s=fence_verdict,
         fence=("heard a" if isinstance(verdict.value, SourceHostUp)
                else "knew a's answer lost"))
    said("counts", **audit(conductor, ledger, placement.url, agents))
    assert max(between_calls, fence_verdict) < RECOVERY_BOUND
    assert in_flight < CALL_TIMEOUT + 2 * RECOVERY_BOUND


def test_an_agents_own_queues_deleted_or_unbound_under_it_serve_again_without_a_restart(
        cluster, agents, conductor, ledger, placement):
    """Deleted: the broker cancels the agent's consumers, and the driver
    makes its connection again and declares its queues. Unbound (a
    binding lost, the consumers told nothing): the agent's watch finds
    it deaf, and has it connect again, which declares its queues and
    their bindings."""
    a = agents[0]
    hosts = [agent.name for agent in agents]
    with load(conductor, ledger, placement.url, hosts):
        for queue in host_queues(a.name):
            cluster.delete_queue(queue)
        started = time.monotonic()
        deleted = serving_again(conductor, ledger, placement.url, hosts, started)
        seen = len(a.log.read_text())
        for queue in host_queues(a.name):
            cluster.unbind(queue, "openstack")
        started = time.monotonic()
        unbound = serving_again(conductor, ledger, placement.url, hosts, started)
    # Said, and the watch's next look found it served.
    wait_for(lambda: "is back after" in a.log.read_text()[seen:].partition(DEAF)[2],
             timeout=30)
    said("an agent's queues", serving_after_deleted_s=deleted, serving_after_unbound_s=unbound)
    said("counts", **audit(conductor, ledger, placement.url, agents))
    assert deleted < RECOVERY_BOUND and unbound < RECOVERY_BOUND


def test_a_node_paused_briefly_stalls_the_cluster_until_it_resumes(
        cluster, agents, conductor, ledger, placement):
    """SIGSTOP on the Erlang VM of the node an agent is connected to: its
    sockets still take connections, in the kernel, and nothing answers on
    them. Shorter than net_ticktime and the AMQP heartbeat's timeout, the
    other nodes and the agent wait for it."""
    hosts = [agent.name for agent in agents]
    [node] = cluster.consumer_nodes(f"compute-agent.{agents[0].name}")
    with load(conductor, ledger, placement.url, hosts):
        with paused(cluster.nodes[node]):
            time.sleep(STALL_SECONDS)  # the fault's length, not a wait for something
        started = time.monotonic()
        back = serving_again(conductor, ledger, placement.url, hosts, started)
    assert cluster.running() == [0, 1, 2]
    said("node paused", pause_s=STALL_SECONDS, serving_after_resume_s=back)
    said("counts", **audit(conductor, ledger, placement.url, agents))
    assert back < RECOVERY_BOUND


def test_a_node_paused_past_net_ticktime_is_a_partition_that_heals(
        cluster, agents, conductor, ledger, placement):
    """The other two take the paused node for down and serve on. An agent
    connected to it is found deaf by its watch, or gone by the driver's
    AMQP heartbeats, and connects to another node (a first try may be the
    paused node again, which takes its timeout); a caller connected to it,
    by the heartbeats. Resumed, the paused node finds the others took it
    for down (a partition), and autoheal restarts it: it rejoins them. The
    agents' time is measured by a caller on the other two nodes, the
    caller's by the conductor on all three."""
    hosts = [agent.name for agent in agents]
    [node] = cluster.consumer_nodes(f"compute-agent.{agents[0].name}")
    others = cluster.url_of(i for i in range(cluster.SIZE) if i != node)
    with load(conductor, ledger, placement.url, hosts):
        with paused(cluster.nodes[node]):
            started = time.monotonic()
            with caller(agents[0].conf, others) as beside:
                agents_during = serving_again(beside, ledger, placement.url, hosts, started)
            caller_during = serving_again(conductor, ledger, placement.url, hosts, started)
            # The fault's length, not a wait for something: past net_ticktime.
            time.sleep(max(PARTITION_SECONDS - (time.monotonic() - started), 0))
            paused_for = round(time.monotonic() - started, 1)
        started = time.monotonic()
        back = serving_again(conductor, ledger, placement.url, hosts, started)
        wait_for(lambda: cluster.running() == [0, 1, 2], timeout=180, interval=2)
        healed = round(time.monotonic() - started, 1)
    assert any("Autoheal" in cluster.log(i) for i in range(cluster.SIZE)), "no partition"
    said("partition", pause_s=paused_for, agents_serving_during_pause_s=agents_during,
         conductor_served_during_pause_s=caller_during, serving_after_resume_s=back,
         cluster_whole_after_resume_s=healed)
    said("counts", **audit(conductor, ledger, placement.url, agents))
    assert max(agents_during, caller_during) < HUNG_NODE_BOUND and back < RECOVERY_BOUND
