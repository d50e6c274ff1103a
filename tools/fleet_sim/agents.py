"""The fleet's agents in one process: each as the daemon runs it
(compute_agent/cmd/daemon.py: the state directory's lock, the one-agent check, the
update loop with its store, the heartbeat and RPC servers), on the fake
driver, with its own config and state directory."""
from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.one_agent_run import check_one_agent_per_host
from compute_agent.daemon.probes import Phase
from compute_agent.daemon.service import Agent
from compute_agent.rpc import broker, host_server
from compute_agent.store import lock
from compute_agent.tree.provider_tree import ProviderTree
from tools.fleet_sim.placement import digest

HEADERS = {"X-Auth-Token": "admin", "X-Roles": "admin,service",
           "OpenStack-API-Version": "placement 1.39", "User-Agent": "fleet-scheduler"}
# Classes the scheduler's instance takes half of, where a provider has them.
DEVICE_CLASSES_PREFIX = ("CUSTOM_", "VGPU")


def tree_digest(tree: ProviderTree) -> str:
    """What "in step" compares (tools/fleet_sim/placement.py digests
    Placement's side alike): each provider's parent's name, its
    inventories (total and reserved) and traits, by provider name."""
    names = {p.uuid: p.name for p in tree}
    return digest({p.name: [names.get(p.parent_uuid),
                            {rc: [inv["total"], inv.get("reserved", 0)]
                             for rc, inv in p.inventories.items()},
                            sorted(p.traits)] for p in tree})


class FleetHost:
    """One agent, started and stopped as the daemon does."""

    def __init__(self, conf_path: Path):
        self.conf_path = conf_path
        self.agent: Agent | None = None
        self._server: host_server.HostServer | None = None
        self._lock: lock.StateLock | None = None
        self.expected = ""
        self.error = ""
        self.cycles_before = 0
        self.name: str | None = None  # its host name, once started
        # The Placement requests its last start sent, until its loop began
        # (the one-agent check, the first cycle, the start's reconciliation).
        self.start_requests: int | None = None

    def start(self) -> None:
        conf = load_config(["--config-file", str(self.conf_path)], placement_required=True)
        self.conf = conf
        self.name = conf.host
        self._lock = lock.acquire(conf.state_path)
        agent = compose(conf, start=check_one_agent_per_host(conf, ask_the_bus=True))
        agent.start()
        self.start_requests = agent.sync.client.requests_sent
        self.agent = agent
        self._server = host_server.make_server(conf, agent)
        self._server.start()
        if agent.broker_watch is not None:
            agent.broker_watch.serving(self._server)
        agent.move_to(Phase.SERVING)
        self.expected = tree_digest(agent.build_model(agent.driver.get_host_inventory()).tree)

    def start_safely(self) -> None:
        try:
            self.error = ""
            self.start()
        except Exception as e:  # noqa: BLE001 - one host's failure is reported, not fatal
            self.error = f"{type(e).__name__}: {e}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server.wait()
            # The daemon's process ends here, and its connections with it;
            # an agent of the fleet lives on in its process: closed, or
            # each restart would leave its server's connections open.
            self._server.transport.cleanup()
            self._server = None
        if self.agent is not None:
            self.agent.stop()
            self.cycles_before += self.agent._cycles
            self.agent = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def status(self) -> dict:
        agent = self.agent
        if agent is None:
            return {"host": None, "error": self.error or "not started"}
        return {"host": agent.policy.host, "root_uuid": agent.sync.root_uuid,
                "cycle_ok": agent._cycle_succeeded, "last_success_at": agent.recorder.last_success_at,
                "cycles": self.cycles_before + agent._cycles,
                "reconcile_interval": agent.settings.reconcile_interval,
                "serving": self._server is not None and self._server._started,
                "expected": self.expected, "error": self.error,
                "start_requests": self.start_requests}

    def build_half(self, placement_url: str) -> int:
        """As a scheduler and conductor would: one instance holding half
        of each device class on each provider that has one, and some VCPU
        and MEMORY_MB, its allocations written in Placement, then built
        here. Returns the providers it holds."""
        return len(self._build(placement_url, lambda total: total // 2 if total >= 2 else 0))

    def build_small(self, placement_url: str, count: int) -> list[str]:
        """``count`` instances each holding one VF and one vGPU (a pmem
        namespace is one provider's whole inventory: none), built as
        build_half's. Returns them."""
        instances = []
        for _ in range(count):
            instance = str(uuid.uuid4())
            self._build(placement_url, lambda total: 1 if total >= 2 else 0, instance)
            instances.append(instance)
        return instances

    def _build(self, placement_url: str, device_share, instance: str | None = None
               ) -> dict[str, dict]:
        """One instance taking ``device_share(total)`` of each device class
        on each provider that has one, and 2 VCPU and 2048 MEMORY_MB from
        the first provider with VCPU. Returns its allocations."""
        agent = self.agent
        allocations: dict[str, dict] = {}
        for p in agent.sync.cache:
            take = {rc: device_share(inv["total"]) for rc, inv in p.inventories.items()
                    if rc.startswith(DEVICE_CLASSES_PREFIX) and device_share(inv["total"])}
            if "VCPU" in p.inventories and "VCPU" not in {
                    rc for a in allocations.values() for rc in a["resources"]}:
                take.update({"VCPU": 2, "MEMORY_MB": 2048})
            if take:
                allocations[p.uuid] = {"resources": take}
        instance = instance or str(uuid.uuid4())
        resp = requests.put(f"{placement_url}/allocations/{instance}", headers=HEADERS,
                            timeout=60, json={
                                "allocations": allocations, "project_id": str(uuid.uuid4()),
                                "user_id": str(uuid.uuid4()), "consumer_generation": None,
                                "consumer_type": "INSTANCE"})
        resp.raise_for_status()
        agent.manager.build_instance(instance, {"name": "fleet-vm", "vcpus": 2,
                                                "memory_mb": 2048}, allocations)
        return allocations


@dataclass
class Fleet:
    """Many agents in this process."""

    hosts: list[FleetHost]
    # How many agents start at a time; None: all at once.
    starting_at_once: int | None = None

    def _each(self, method, at_once: int | None = None) -> None:
        """``method`` on every host at once (or ``at_once`` at a time): a
        thread each, as so many daemons would start or stop together."""
        if not self.hosts:
            return
        with ThreadPoolExecutor(max_workers=at_once or len(self.hosts)) as pool:
            list(pool.map(method, self.hosts))

    def start(self) -> None:
        broker.quiet_reconnect_lines()
        self._each(FleetHost.start_safely, self.starting_at_once)

    def stop(self) -> None:
        self._each(FleetHost.stop)

    def restart(self) -> None:
        self.stop()
        self.start()

    def status(self) -> list[dict]:
        return [h.status() for h in self.hosts]

    def named(self, host: str) -> FleetHost | None:
        """This process's agent of ``host``, if it is here."""
        return next((h for h in self.hosts if h.name == host), None)

    def build_half(self, placement_url: str) -> int:
        counts: list[int] = []
        counting = threading.Lock()

        def one(host: FleetHost) -> None:
            n = host.build_half(placement_url)
            with counting:
                counts.append(n)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(one, self.hosts))
        return sum(counts)


def wait_until(predicate, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
