"""The crash loop: a conductor drives real agent daemons through nova's
protocol while it SIGKILLs them, and checks after every operation that
nothing was lost or doubled.

Two hosts, each a `compute-agent` process (python -m compute_agent.cmd.agent) with
its own host name, state directory and hypervisor, the real Placement and a
RabbitMQ broker. The hypervisor outlives the agent process: either the fake
driver with a state file (compute_agent/drivers/fake.py: fast, VFs and vGPUs) or the
libvirt driver on a private libvirtd with QEMU/KVM (real guests; a pinned
CPU and file-backed nvdimms are the devices, as nothing of this machine's
may be given to a guest).

The conductor (this process) runs random operations: build, delete,
same-host and cross-host resize with confirm or revert, live migration that
succeeds (rpcapi.live_migrate_instance) or is rolled back after the
destination's check, evacuation of a host whose agent and guests died
(agent.evacuator, the source forced down), and a host reboot (guests
stopped, a new boot ID, the kernel's VFs forgotten: each PF's VF count is
back once the agent serves again). It writes allocations as nova's
scheduler and conductor do, swaps included (rpcapi.move_allocations).

Kills: before an RPC, with some probability, a timer SIGKILLs the daemon
the call goes to (or the other one) after a random delay, so most land
while the call is outstanding; and after a restart, with some probability,
the new daemon is killed again during its start-up. A call whose daemon
died is sent again, the same call with the same uuids, once the daemon
answers again: every step is idempotent. An operation is finished only
when every step answered.

After every operation (so after every restart and every retry), with
nothing in flight: no device held twice on a host and no instance held by
two hosts; every acknowledged instance is where the conductor was told,
with exactly the assignment ids it was told; nothing else is held; no move
is open; each host's guests are its store's instances; Placement holds each
instance's allocations on its host only and no migration consumer is left;
and the audit (the reconciliation, fixing nothing) finds nothing on either
host -- in this process after every operation, and by
`compute-agent-manage audit --json` every ``command_audit_every``
operations and at the end.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import libvirt
import requests
from keystoneauth1 import adapter, session

from compute_agent.cmd.common import load_config
from compute_agent.cmd.manage import audit_report
from compute_agent.conductor.evacuation import Evacuator
from compute_agent.conductor.live_migration import _write_allocations, live_migrate_instance
from compute_agent.daemon.composition import compose
from compute_agent.drivers.base import PciKind
from compute_agent.drivers.fake import FakeDriver, load_host_file
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.exception import (
    AgentError,
    ClaimFailed,
    InvalidRequest,
    LiveMigrationOutcomeUnknown,
    LiveMigrationRefused,
    PlacementError,
)
from compute_agent.messaging import messaging
from compute_agent.moves.evacuation import evacuation_migration_uuid, spec_from_allocations
from compute_agent.placement.allocations import move_allocations
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.heartbeat import Heartbeat
from tests.functional.claims_world import GPU, MDEV_TYPE, PF, host_dict
from tests.functional.helpers import HEADERS, placement_tree, write_conf
from tests.waiting import wait_for

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
READY = "compute-agent running as host"
# How long a call may take before its daemon is taken for hung (a live
# migration of a QEMU guest takes a few seconds).
CALL_TIMEOUT = 30
# What a live migration (or its rollback) of a guest that does not run is.
NOT_TRIED_STOPPED = "live migration not tried (guest stopped)"


class Violation(AssertionError):
    """An invariant the crash loop checks does not hold."""


# --- one agent process ------------------------------------------------------

class AgentProcess:
    """A compute-agent daemon, started, killed and started again."""

    def __init__(self, name: str, directory: Path, conf: Path):
        self.name = name
        self.dir = directory
        self.conf = conf
        self.log = directory / "agent.log"
        self.proc: subprocess.Popen | None = None
        self._offset = 0

    def spawn(self) -> None:
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "compute_agent.cmd.agent", "--config-file", str(self.conf)],
                stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        """Until it logs that it serves RPC (after start-up reconciliation)."""
        def ready() -> bool:
            with open(self.log, "rb") as f:
                f.seek(self._offset)
                if READY.encode() in f.read():
                    return True
            if self.proc.poll() is not None:
                raise Violation(f"{self.name}: the agent exited "
                                f"({self.proc.returncode}) during start-up: "
                                f"{self.log.read_text()[-3000:]}")
            return False
        wait_for(ready, timeout, interval=0.01, error=Violation,
                 message=f"{self.name}: not ready after {timeout:.0f} s")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> bool:
        """SIGKILL; False when it was dead already."""
        if not self.alive:
            return False
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        return True

    def store(self, sql: str) -> list[tuple]:
        """Read the store beside the agent, read-only."""
        conn = sqlite3.connect(f"file:{self.dir / 'state' / 'state.db'}?mode=ro", uri=True)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def root_uuid(self) -> str:
        return (self.dir / "state" / "compute_id").read_text().strip()


# --- the hypervisors ----------------------------------------------------------

class Hypervisors:
    """How the hosts are made, what an instance of them is allocated, and
    what their hypervisors hold; one subclass per driver."""

    label = ""
    max_instances = 0
    helper_timeout = 5.0  # seconds: a live migration's longest call, and some

    def configure(self, root: Path, placement_url: str) -> list[AgentProcess]:
        raise NotImplementedError

    def mixes(self, host: AgentProcess, tree: dict[str, dict]) -> list[dict]:
        """Allocations an instance may be given on ``host``."""
        raise NotImplementedError

    def guests(self, host: AgentProcess) -> dict[str, bool]:
        """instance uuid -> running, on the host's hypervisor."""
        raise NotImplementedError

    def power_cut(self, host: AgentProcess) -> None:
        """The host's guests stop where they are (its agent is dead)."""
        raise NotImplementedError

    def reboot(self, host: AgentProcess) -> None:
        """The host reboots (its agent is dead): its guests stop, its boot
        ID changes, its kernel forgets every VF and mdev."""
        raise NotImplementedError

    def vf_counts(self, host: AgentProcess) -> dict[str, int]:
        """Each PF's VF count on the host, by address."""
        raise NotImplementedError

    def close(self) -> None:
        pass


FAKE_SPECS = [json.dumps({"vendor_id": "8086", "product_id": "154c",
                          "resource_class": "SRIOV_NET_VF", "live_migratable": "yes"})]


class FakeHypervisors(Hypervisors):
    """The fake driver with a state file: guests outlive the agent, start in
    no time, and hold VFs, vGPUs and pmem namespaces."""

    label = "fake driver, state file"
    max_instances = 8

    def configure(self, root, placement_url):
        hosts = []
        for which in "ab":
            name = f"crash-{which}-{uuid.uuid4().hex[:6]}"
            directory = root / which
            conf = write_conf(
                directory, placement_url, name, host_dict(vfs=6, vgpus=4),
                DEFAULT={"transport_url": BROKER, "update_interval": 2},
                fake={"state_file": str(directory / "hypervisor.json")},
                pci={"device_spec": FAKE_SPECS},
                devices={"enabled_mdev_types": MDEV_TYPE})
            hosts.append(AgentProcess(name, directory, conf))
        return hosts

    def mixes(self, host, tree):
        p = {suffix: tree[f"{host.name}_{suffix}"]["uuid"]
             for suffix in ("numa_0", "numa_1", PF.upper(),
                            "pci_" + GPU.replace(":", "_").replace(".", "_"))}
        gpu = p["pci_" + GPU.replace(":", "_").replace(".", "_")]
        # Each device on its CPUs' NUMA cell, as an evacuation asks for it.
        return [{p["numa_0"]: {"resources": {"VCPU": 1, "MEMORY_MB": 256}},
                 p[PF.upper()]: {"resources": {"SRIOV_NET_VF": 1}}},
                {p["numa_1"]: {"resources": {"VCPU": 2, "MEMORY_MB": 512}},
                 gpu: {"resources": {"VGPU": 1}}},
                {p["numa_0"]: {"resources": {"VCPU": 1, "MEMORY_MB": 256}}}]

    def _driver(self, host: AgentProcess) -> FakeDriver:
        """The host's hypervisor as its agent sees it (a reboot forgets the
        host file's VFs)."""
        return FakeDriver(load_host_file(host.dir / "host.yaml"),
                          state_file=host.dir / "hypervisor.json")

    def guests(self, host):
        return {u: g.running for u, g in self._driver(host).list_guests().items()}

    def power_cut(self, host):
        driver = self._driver(host)
        for instance in driver.list_guests():
            driver.power_off(instance)

    def reboot(self, host):
        self._driver(host).reboot(f"boot-{uuid.uuid4()}")

    def vf_counts(self, host):
        return {d.address: d.num_vfs for d in self._driver(host).get_host_inventory().pci_devices
                if d.kind is PciKind.PF}


PMEM_BYTES = 64 << 20
PMEM_RC = "CUSTOM_PMEM_NAMESPACE_SMALL"


class QemuHypervisors(Hypervisors):
    """The libvirt driver on two private libvirtds with QEMU/KVM: real
    guests, which outlive the agent as on any host. No device of this
    machine may be given to a guest, so each guest holds what QEMU really
    runs: a NUMA cell's shared CPU and memory or the host's dedicated CPU
    (CPU 0 on A, 1 on B), and a 64 MiB nvdimm whose "device" is a file of
    the host's own (three per host)."""

    label = "libvirt driver, QEMU/KVM"
    max_instances = 4
    helper_timeout = 10.0

    def __init__(self, daemons):
        self.daemons = daemons  # tests/functional/private_services.PrivateLibvirtd

    def configure(self, root, placement_url):
        hosts = []
        for cpu, (which, daemon) in enumerate(zip("ab", self.daemons)):
            name = f"crashq-{which}-{uuid.uuid4().hex[:6]}"
            directory = root / which
            SysfsBuilder(directory / "sys").add_numa_node(0, "0-1", 4096)
            namespaces = []
            for i in range(3):
                backing = daemon.root / f"pmem-{name}-{i}"
                backing.write_bytes(b"")
                os.truncate(backing, PMEM_BYTES)
                # The agent makes the device's path /dev/<chardev>.
                namespaces.append({"dev": f"namespace0.{i}", "mode": "devdax",
                                   "size": PMEM_BYTES, "name": f"ns-{name}-{i}",
                                   "numa_node": 0, "chardev": f"..{backing}"})
            ndctl = directory / "ndctl.json"
            ndctl.write_text(json.dumps(namespaces))
            (directory / "boot_id").write_text(f"{uuid.uuid4()}\n")
            conf = write_conf(
                directory, placement_url, name, host_dict=None,
                DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(directory / "sys"),
                         "boot_id_file": str(directory / "boot_id"),
                         "transport_url": BROKER, "update_interval": 2},
                libvirt={"connection_uri": daemon.uri, "live_migration_uri": daemon.uri,
                         "instances_path": str(directory / "instances")},
                compute={"cpu_dedicated_set": str(cpu), "cpu_shared_set": str(1 - cpu)},
                pmem={"namespaces": "SMALL:" + "|".join(n["name"] for n in namespaces),
                      "ndctl_json": str(ndctl)})
            hosts.append(AgentProcess(name, directory, conf))
        self.uris = {h.name: d.uri for h, d in zip(hosts, self.daemons)}
        return hosts

    def mixes(self, host, tree):
        by_class = {rc: node["uuid"] for node in tree.values() for rc in node["inventories"]}
        cell, pmem = by_class["MEMORY_MB"], by_class[PMEM_RC]
        return [{cell: {"resources": {"VCPU": 1, "MEMORY_MB": 64}},
                 pmem: {"resources": {PMEM_RC: 1}}},
                {cell: {"resources": {"PCPU": 1, "MEMORY_MB": 64}},
                 pmem: {"resources": {PMEM_RC: 1}}}]

    def _domains(self, host: AgentProcess) -> list[libvirt.virDomain]:
        conn = libvirt.open(self.uris[host.name])
        return conn, conn.listAllDomains()

    def guests(self, host):
        conn, domains = self._domains(host)
        try:
            return {d.UUIDString(): bool(d.isActive()) for d in domains}
        finally:
            conn.close()

    def power_cut(self, host):
        conn, domains = self._domains(host)
        try:
            for d in domains:
                if d.isActive():
                    d.destroy()
        finally:
            conn.close()

    def reboot(self, host):
        """No device of this machine's is the hosts' (no VF to forget): the
        guests stop and the boot ID changes."""
        self.power_cut(host)
        (host.dir / "boot_id").write_text(f"{uuid.uuid4()}\n")

    def vf_counts(self, host):
        return {}

    def close(self) -> None:
        for name in self.uris:
            conn = libvirt.open(self.uris[name])
            try:
                for d in conn.listAllDomains():
                    if d.isActive():
                        d.destroy()
                    d.undefine()
            finally:
                conn.close()


# --- what the conductor was told ------------------------------------------------

@dataclass
class Held:
    """An acknowledged instance: where it is and the assignment ids its
    host answered with."""

    host: str
    ids: frozenset[str]
    spec: dict
    allocations: dict


def instance_ids(view: dict) -> frozenset[str]:
    return frozenset(a["id"] for a in view["assignments"] if a["owner"] == "instance")


@dataclass
class Figures:
    kills: Counter = field(default_factory=Counter)  # in flight, between calls, start-up
    ops: Counter = field(default_factory=Counter)
    retries: int = 0
    checks: int = 0
    command_audits: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    def line(self) -> str:
        took = time.monotonic() - self.started
        return (f"{self.total_kills} kills ({dict(self.kills)}), {sum(self.ops.values())} "
                f"operations ({dict(self.ops)}), {self.retries} retries, {self.checks} "
                f"checks, {self.command_audits} audit commands, {took:.0f} s, "
                f"{self.total_kills / max(took, 1e-9):.2f} kills/s")


class Interrupted(Exception):
    """The daemon a call went to was killed before it answered."""


# --- the conductor ------------------------------------------------------------------

class CrashLoop:
    def __init__(self, root: Path, placement_url: str, hypervisors: Hypervisors,
                 seed: int, kill_rate: float = 0.35, startup_kill_rate: float = 0.3,
                 command_audit_every: int = 25):
        self.rng = random.Random(seed)
        self.seed = seed
        self.url = placement_url
        self.hv = hypervisors
        self.kill_rate = kill_rate
        self.startup_kill_rate = startup_kill_rate
        self.command_audit_every = command_audit_every
        self.hosts = {h.name: h for h in hypervisors.configure(root, placement_url)}
        self.names = sorted(self.hosts)
        conf = load_config(["--config-file", str(self.hosts[self.names[0]].conf)])
        self.conf = conf
        self.api = ComputeAgentAPI(conf, timeout=CALL_TIMEOUT)
        # For rpcapi's and the evacuator's own calls, which this process
        # cannot send again: a call its daemon's death lost ends soon.
        self.helper_api = ComputeAgentAPI(conf, timeout=hypervisors.helper_timeout)
        self.placement = PlacementClient(adapter.Adapter(
            session.Session(auth=NoAuth2(placement_url)), service_type="placement"))
        self.heartbeat = Heartbeat(conf, down_after=2)
        self.held: dict[str, Held] = {}
        self.project = str(uuid.uuid4())
        self.down: set[str] = set()
        # The last calls, kills and restarts, for the report of a violation.
        self.trace: list[str] = []
        self.figures = Figures()
        self.startup_seconds = 0.6  # measured below: start-up kills land within
        self._mixes: dict[str, list[dict]] = {}

    # --- processes -------------------------------------------------------

    def start(self) -> CrashLoop:
        for h in self.hosts.values():
            began = time.monotonic()
            h.spawn()
            h.wait_ready()
            self.startup_seconds = time.monotonic() - began
        for name, h in self.hosts.items():
            self._mixes[name] = self.hv.mixes(
                h, placement_tree(self.url, h.root_uuid()))
        return self

    def close(self) -> None:
        for h in self.hosts.values():
            h.kill()
        self.api.close()
        self.helper_api.close()
        self.heartbeat.close()
        self.hv.close()

    def restart(self, host: AgentProcess) -> None:
        """Start it again, killed during start-up now and then."""
        host.kill()
        while True:
            host.spawn()
            if self.rng.random() >= self.startup_kill_rate:
                break
            # The kill lands at a random moment of the start-up: what is
            # tested is the agent killed anywhere in it.
            time.sleep(self.rng.uniform(0, self.startup_seconds * 1.2))
            if host.kill():
                self.figures.kills["start-up"] += 1
        host.wait_ready()

    def ensure_up(self) -> None:
        """Every host but one that is down on purpose (a dead source)."""
        for h in self.hosts.values():
            if not h.alive and h.name not in self.down:
                self.restart(h)

    # --- calls ------------------------------------------------------------

    def call(self, host: str, method: str, *args, may_kill: bool = True):
        """One RPC, sent again (the same call) until its daemon answers;
        maybe with a kill of ``host`` (or the other host) timed to land
        while it is outstanding."""
        while True:
            self.ensure_up()
            victim = None
            if may_kill and self.rng.random() < self.kill_rate:
                victim = host if self.rng.random() < 0.8 else self.rng.choice(self.names)
            try:
                return self._send(host, method, args, victim)
            except Interrupted:
                self.figures.retries += 1

    def note(self, line: str) -> None:
        self.trace = self.trace[-60:] + [line]

    def _send(self, host: str, method: str, args: tuple, victim: str | None):
        self.note(f"{method} -> {host[:7]} {[str(a)[:8] for a in args[:2]]}"
                  f"{' kill ' + victim[:7] if victim else ''}")
        done: Future = Future()

        def send() -> None:
            try:
                done.set_result(getattr(self.api, method)(host, *args))
            except BaseException as e:
                done.set_exception(e)

        threading.Thread(target=send, daemon=True).start()
        if victim is not None:
            try:
                done.exception(timeout=self.rng.uniform(0, 0.025))
            except TimeoutError:
                pass
            in_flight = not done.done()
            if self.hosts[victim].kill():
                self.figures.kills["in flight" if in_flight else "between calls"] += 1
                self.note(f"  killed {victim[:7]} {'in flight' if in_flight else 'after'}")

        def answered_or_killed() -> bool:
            if not self.hosts[host].alive and not done.done():
                # Killed: the call may or may not have been carried out; an
                # answer that arrived before the kill still counts.
                raise Interrupted(method)
            return done.done()
        # The call's own timeout ends it first, with an answer or a
        # MessagingTimeout; asked often, as the next call waits for it.
        wait_for(answered_or_killed, CALL_TIMEOUT + 30, interval=0.005, error=Violation,
                 message=f"{method} to {host}: no answer nor timeout in {CALL_TIMEOUT + 30} s")
        error = done.exception()
        self.note(f"  answer: {type(error).__name__ if error else 'ok'}")
        if isinstance(error, messaging.MessagingTimeout):
            raise Violation(f"{method} to {host}: no answer in {CALL_TIMEOUT} s, "
                            "the agent alive")
        return done.result()

    # --- Placement, as a scheduler and a conductor write it ----------------

    def allocations_of(self, consumer: str) -> dict:
        return self.placement.get_consumer_allocations(consumer)["allocations"]

    def schedule(self, instance: str, allocations: dict) -> bool:
        """A new instance's allocations, as a scheduler claims them; False
        when they do not fit (a scheduler would not have picked them)."""
        resp = requests.put(f"{self.url}/allocations/{instance}", headers=HEADERS,
                            timeout=10, json={
                                "allocations": allocations, "project_id": self.project,
                                "user_id": self.project, "consumer_generation": None,
                                "consumer_type": "INSTANCE"})
        if resp.status_code not in (204, 409):
            raise Violation(f"Placement answered {resp.status_code}: {resp.text}")
        return resp.status_code == 204

    def move_to(self, instance: str, migration: str, allocations: dict) -> bool:
        """The swap, then the instance's allocations on the destination;
        False (the swap undone) when they do not fit there."""
        self.swap(instance, migration)
        try:
            _write_allocations(self.placement, instance, migration, allocations)
        except PlacementError:
            self.swap_back(migration, instance)
            return False
        return True

    def forget(self, consumer: str) -> None:
        requests.delete(f"{self.url}/allocations/{consumer}", headers=HEADERS, timeout=10)

    def swap(self, instance: str, migration: str) -> None:
        """The instance's allocations pass to the migration (once: a retry
        finds them moved)."""
        if not self.allocations_of(migration):
            move_allocations(self.placement, instance, migration)

    def swap_back(self, migration: str, instance: str) -> None:
        if self.allocations_of(migration):
            move_allocations(self.placement, migration, instance, "INSTANCE")

    # --- operations ---------------------------------------------------------

    def pick(self) -> str | None:
        return self.rng.choice(sorted(self.held)) if self.held else None

    def other(self, host: str) -> str:
        return next(n for n in self.names if n != host)

    def like(self, held: Held, dest: str) -> dict:
        """Allocations on ``dest`` of the classes ``held`` has: a live
        migration moves each device to one of its kind."""
        classes = sorted(rc for a in held.allocations.values() for rc in a["resources"])
        return next(m for m in self._mixes[dest]
                    if sorted(rc for a in m.values() for rc in a["resources"]) == classes)

    def new_spec(self, allocations: dict) -> dict:
        vcpus = sum(r["resources"].get("VCPU", 0) + r["resources"].get("PCPU", 0)
                    for r in allocations.values())
        memory = sum(r["resources"].get("MEMORY_MB", 0) for r in allocations.values())
        return {"name": f"crash-{uuid.uuid4().hex[:6]}", "vcpus": max(vcpus, 1),
                "memory_mb": max(memory, 64)}

    def op_build(self) -> str:
        host = self.rng.choice(self.names)
        allocations = self.rng.choice(self._mixes[host])
        instance = str(uuid.uuid4())
        spec = self.new_spec(allocations)
        if not self.schedule(instance, allocations):
            return "build refused (no room in Placement)"
        try:
            view = self.call(host, "build_instance", instance, spec, allocations)
        except ClaimFailed:
            self.forget(instance)
            return "build refused (full)"
        self.held[instance] = Held(host, instance_ids(view), spec, allocations)
        return "build"

    def op_delete(self) -> str:
        instance = self.pick()
        held = self.held[instance]
        self.call(held.host, "delete_instance", instance)
        del self.held[instance]
        self.forget(instance)
        return "delete"

    def op_resize(self, cross_host: bool) -> str:
        instance = self.pick()
        held = self.held[instance]
        source = held.host
        dest = self.other(source) if cross_host else source
        migration = str(uuid.uuid4())
        allocations = self.rng.choice(self._mixes[dest])
        spec = {**self.new_spec(allocations), "name": held.spec["name"]}
        if not self.move_to(instance, migration, allocations):
            return "resize refused (no room in Placement)"
        try:
            self.call(dest, "prep_resize", migration, instance, spec, allocations)
        except ClaimFailed:
            self.swap_back(migration, instance)
            return "resize refused (full)"
        self.call(source, "resize_instance", migration, instance)
        view = self.call(dest, "finish_resize", migration, instance)
        kind = "cross-host" if cross_host else "same-host"
        if self.rng.random() < 0.5:
            self.call(source, "confirm_resize", migration, instance)
            self.forget(migration)
            self.held[instance] = Held(dest, instance_ids(view), spec, allocations)
            return f"{kind} resize confirmed"
        self.call(dest, "revert_resize", migration, instance)
        if cross_host:
            self.call(source, "revert_resize", migration, instance)
        self.swap_back(migration, instance)
        view = self.call(source, "get_instance", instance, may_kill=False)
        if instance_ids(view) != held.ids:
            raise Violation(f"{instance}: the revert of {migration} did not give back "
                            f"exactly its devices: {sorted(held.ids)} before, "
                            f"{sorted(instance_ids(view))} after")
        return f"{kind} resize reverted"

    def op_live_migrate(self) -> str:
        """Through rpcapi's helper, with a kill of either side aimed at it;
        when a kill interrupted it, the conductor runs the same migration
        again until it ends."""
        instance = self.pick()
        held = self.held[instance]
        source, dest = held.host, self.other(held.host)
        if not self.runs(instance, source):
            return NOT_TRIED_STOPPED
        migration = str(uuid.uuid4())
        allocations = self.like(held, dest)
        victim = (self.rng.choice(self.names) if self.rng.random() < self.kill_rate
                  else None)
        done: Future = Future()

        def migrate() -> None:
            try:
                done.set_result(live_migrate_instance(
                    self.helper_api, self.placement, instance, source, dest, held.spec,
                    allocations, migration_uuid=migration, outcome_wait=60))
            except BaseException as e:
                done.set_exception(e)

        self.ensure_up()
        threading.Thread(target=migrate, daemon=True).start()
        if victim is not None:
            try:
                done.exception(timeout=self.rng.uniform(0, 0.3))
            except TimeoutError:
                pass
            in_flight = not done.done()
            if self.hosts[victim].kill():
                self.figures.kills["in flight" if in_flight else "between calls"] += 1
                self.note(f"  live migration {migration[:8]}: killed {victim[:7]}")
                self.restart(self.hosts[victim])
        error = done.exception()  # the helper's own calls time out if lost
        self.note(f"  live_migrate_instance {instance[:8]} {source[:7]} -> {dest[:7]}: "
                  f"{type(error).__name__ if error else 'ok'} {str(error)[:150] if error else ''}")
        if error is None:
            self.held[instance] = Held(dest, instance_ids(done.result()), held.spec,
                                       allocations)
            return "live migration"
        if isinstance(error, ClaimFailed):
            return "live migration refused (full)"
        if isinstance(error, PlacementError) and "Unable to" in str(error):
            return "live migration refused (no room in Placement)"
        if not isinstance(error, (messaging.MessagingTimeout, AgentError)) or victim is None:
            raise error
        self.figures.retries += 1
        return self._resume_live_migration(instance, held, source, dest, migration,
                                           allocations)

    def runs(self, instance: str, source: str) -> bool:
        """Whether the instance's guest runs on its host. An evacuation that
        found no room leaves an instance on its dead source, its guest
        stopped: a conductor live-migrates running guests only (the source
        refuses the others, rightly)."""
        return self.call(source, "get_instance", instance, may_kill=False)["running"]

    def _resume_live_migration(self, instance, held, source, dest, migration,
                               allocations) -> str:
        """As a conductor (or ``ctl live-migrate --migration``) does after a
        run that ended without a verdict: the same migration run again,
        until it ends one way or the other. A rerun resumes: it settles a
        move the source has done, asks after one under way, and undoes
        what an earlier run left of one the source rolled back (then says
        so with the source's refusal)."""
        for _ in range(20):
            self.ensure_up()
            try:
                view = live_migrate_instance(self.helper_api, self.placement, instance,
                                             source, dest, held.spec, allocations,
                                             migration_uuid=migration, outcome_wait=60)
            except (messaging.MessagingTimeout, LiveMigrationOutcomeUnknown) as e:
                self.note(f"  live migration {migration[:8]} run again: "
                          f"{type(e).__name__}")
                self.figures.retries += 1
                continue
            except (InvalidRequest, LiveMigrationRefused, ClaimFailed) as e:
                self.note(f"  live migration {migration[:8]} ended: {type(e).__name__} "
                          f"{str(e)[:150]}")
                return self._rolled_back(instance, held, source, migration,
                                         "live migration rolled back (after a kill)")
            except PlacementError as e:
                if "Unable to" not in str(e):
                    raise
                # The rerun's own allocation write found no room (the swap
                # undone by the helper): rolled back like a refusal.
                return self._rolled_back(instance, held, source, migration,
                                         "live migration refused (no room in Placement)")
            self.held[instance] = Held(dest, instance_ids(view), held.spec, allocations)
            return "live migration (resumed)"
        raise Violation(f"{instance}: live migration {migration} had no outcome after "
                        "20 runs")

    def _rolled_back(self, instance, held, source, migration, outcome: str) -> str:
        """The move ended without moving: the guest runs on at the source
        with the devices it had, the migration holds nothing."""
        view = self.call(source, "get_instance", instance, may_kill=False)
        if instance_ids(view) != held.ids:
            raise Violation(f"{instance}: a rolled-back live migration changed its "
                            f"devices on the source: {view}")
        if not view["running"]:
            raise Violation(f"{instance}: its guest ran on the source before a live "
                            f"migration that was rolled back, and runs no more: {view}")
        if self.allocations_of(migration):
            raise Violation(f"{instance}: rolled-back live migration {migration} "
                            "still holds allocations")
        return outcome

    def op_live_migration_rollback(self) -> str:
        """The destination claims, then the conductor gives up (as nova does
        when the source's own pre-check fails): the destination rolls back,
        the allocations return."""
        instance = self.pick()
        held = self.held[instance]
        source, dest = held.host, self.other(held.host)
        if not self.runs(instance, source):
            return NOT_TRIED_STOPPED
        migration = str(uuid.uuid4())
        allocations = self.rng.choice(self._mixes[dest])
        if not self.move_to(instance, migration, allocations):
            return "live migration refused (no room in Placement)"
        try:
            self.call(dest, "check_can_live_migrate_destination", migration, instance,
                      held.spec, allocations)
        except ClaimFailed:
            pass
        else:
            self.call(dest, "rollback_live_migration_at_destination", migration, instance)
        self.swap_back(migration, instance)
        return self._rolled_back(instance, held, source, migration,
                                 "live migration rolled back")

    def op_evacuate(self) -> str:
        """The source dies (agent killed, guests stopped); its instances are
        evacuated to the other host, which may be killed meanwhile; then the
        source returns and gives them up."""
        source = self.rng.choice(self.names)
        mine = [i for i, h in self.held.items() if h.host == source]
        if not mine:
            return "evacuation (nothing to evacuate)"
        dest = self.other(source)
        self.ensure_up()
        self.down.add(source)
        if self.hosts[source].kill():
            self.figures.kills["host death"] += 1
        self.hv.power_cut(self.hosts[source])
        root = self.hosts[source].root_uuid()
        evacuator = Evacuator(self.placement, self.helper_api, self.heartbeat)
        victim = self.rng.random() < self.kill_rate
        done: Future = Future()

        def evacuate() -> None:
            try:
                done.set_result(evacuator.evacuate(source, dest, force=True,
                                                   deadline=time.monotonic() + 60))
            except BaseException as e:
                done.set_exception(e)

        threading.Thread(target=evacuate, daemon=True).start()
        if victim:
            try:
                done.exception(timeout=self.rng.uniform(0, 0.5))
            except TimeoutError:
                pass
            if self.hosts[dest].kill():
                self.figures.kills["in flight" if not done.done() else "between calls"] += 1
                self.restart(self.hosts[dest])
        done.result()
        # Whatever got no answer is sent again: the same rebuild, the same
        # (derived) migration uuid, the allocations the swap gave it.
        # Those whose allocations the swap gave to the migration are the
        # destination's to rebuild; the others (refused, no room) stay on
        # the source, stopped.
        mine = [i for i in mine
                if self.allocations_of(evacuation_migration_uuid(i, root))]
        for instance in mine:
            migration = evacuation_migration_uuid(instance, root)
            wanted = {rp: {"resources": a["resources"]}
                      for rp, a in self.allocations_of(instance).items()}
            # As the evacuator derived it, from the source's allocations.
            spec = spec_from_allocations(instance, {
                rp: a["resources"] for rp, a in self.held[instance].allocations.items()})
            self.call(dest, "rebuild_instance", migration, instance, spec, wanted,
                      source, True)
        for instance in mine:
            migration = evacuation_migration_uuid(instance, root)
            last: list[dict] = [{}]

            def settled_there() -> dict | None:
                view = last[0] = self.call(dest, "get_instance", instance, may_kill=False)
                return view if view["running"] and all(
                    m["state"] == "confirmed" for m in view["migrations"]
                    if m["uuid"] == migration) else None
            view = wait_for(settled_there, 60, interval=0.05, error=Violation,
                            message=lambda: f"{instance}: not running on {dest} 60 s after "
                                            f"its evacuation: {last[0]}")
            held = self.held[instance]
            self.held[instance] = Held(dest, instance_ids(view), held.spec,
                                       {rp: {"resources": a["resources"]} for rp, a in
                                        self.allocations_of(instance).items()})
        self.down.discard(source)
        self.restart(self.hosts[source])  # the source returns
        for instance in mine:
            self.forget(evacuation_migration_uuid(instance, root))
        return f"evacuation of {len(mine)}"

    def op_reboot(self) -> str:
        """A host reboots: its agent dies with it, its guests stop, its
        kernel forgets its VFs; the agent starts in the new boot (killed
        during start-up now and then, its restore then starts over) and
        every PF has its VF count back before it serves a call."""
        name = self.rng.choice(self.names)
        host = self.hosts[name]
        self.ensure_up()
        before = self.hv.vf_counts(host)
        if host.kill():
            self.figures.kills["reboot"] += 1
        self.hv.reboot(host)
        self.note(f"  rebooted {name[:7]}")
        self.restart(host)
        after = self.hv.vf_counts(host)
        if after != before:
            raise Violation(f"{name}: VF counts {before} before the reboot, {after} once "
                            "its agent serves again")
        return "reboot"

    def step(self) -> str:
        full = len(self.held) >= self.hv.max_instances
        choices = {"build": 0 if full else 5, "delete": 2 if self.held else 0,
                   "resize same": 2 if self.held else 0, "resize cross": 2 if self.held else 0,
                   "live": 2 if self.held else 0, "live rollback": 1 if self.held else 0,
                   "evacuate": 0.5 if self.held else 0, "reboot": 0.5}
        op = self.rng.choices(list(choices), list(choices.values()))[0]
        return {"build": self.op_build, "delete": self.op_delete,
                "resize same": lambda: self.op_resize(False),
                "resize cross": lambda: self.op_resize(True),
                "live": self.op_live_migrate,
                "live rollback": self.op_live_migration_rollback,
                "evacuate": self.op_evacuate, "reboot": self.op_reboot}[op]()

    # --- checks -------------------------------------------------------------

    def check(self, command_audit: bool = False) -> None:
        """Every invariant, with nothing in flight. Raises Violation."""
        self.ensure_up()
        self.figures.checks += 1
        held_by: dict[str, set[str]] = {}
        for name, h in self.hosts.items():
            rows = h.store("SELECT id, instance_uuid, owner, provider_uuid, "
                           "resource_class, kind, device_id, state FROM assignments "
                           "WHERE state != 'released'")
            devices = Counter((r[3], r[4], r[6]) for r in rows
                              if r[5] not in ("numa", "host_resources"))
            twice = [d for d, n in devices.items() if n > 1]
            if twice:
                raise Violation(f"{name}: devices held twice: {twice}")
            odd = [r for r in rows if r[2] != "instance" or r[7] != "claimed"]
            if odd:
                raise Violation(f"{name}: assignments in a move or a claim with nothing "
                                f"in flight: {odd}")
            ids: dict[str, set[str]] = {}
            for r in rows:
                ids.setdefault(r[1], set()).add(r[0])
            instances = {r[0] for r in h.store("SELECT uuid FROM instances")}
            for instance in instances | set(ids):
                held_by.setdefault(instance, set()).add(name)
            for instance, held in self.held.items():
                if held.host != name:
                    continue
                if instance not in instances or frozenset(ids.get(instance, ())) != held.ids:
                    raise Violation(f"{name}: acknowledged {instance} lost or changed: "
                                    f"told {sorted(held.ids)}, store has "
                                    f"{sorted(ids.get(instance, ()))}")
            # Open as Migration.open says: a destination whose guest runs on
            # its new devices is settled.
            moving = h.store("SELECT uuid, kind, role, state FROM migrations WHERE "
                             "state = 'active' OR (state = 'finished' "
                             "AND role != 'destination')")
            if moving:
                raise Violation(f"{name}: moves open with nothing in flight: {moving}")
            # Instances an evacuation could not place stay on their host,
            # stopped (nothing restarts a guest but its user).
            guests = self.hv.guests(h)
            if set(guests) != instances:
                raise Violation(f"{name}: guests {guests} but instances {sorted(instances)}")
            root = h.root_uuid()
            ours = {p["uuid"] for p in self.placement.get_tree(root)}
            for rp in ours:
                for consumer in self.placement.get_provider_allocations(rp):
                    if consumer not in instances:
                        raise Violation(f"{name}: {consumer} holds allocations on its "
                                        f"provider {rp} but is no instance of it")
            for instance in instances:
                where = set(self.allocations_of(instance))
                if not where or not where <= ours:
                    raise Violation(f"{name}: {instance}'s allocations are on {where}, "
                                    "not (only) on its providers")
            self.audit(h, command_audit)
        for instance, names in held_by.items():
            if len(names) > 1 or instance not in self.held:
                raise Violation(f"{instance} is held by {sorted(names)}; the conductor "
                                f"knows it on {self.held.get(instance)}")

    def audit(self, h: AgentProcess, command: bool) -> None:
        """The reconciliation, fixing nothing, beside the running agent."""
        if command:
            done = subprocess.run([sys.executable, "-m", "compute_agent.cmd.manage", "--config-file",
                                   str(h.conf), "audit", "--json"],
                                  capture_output=True, text=True, timeout=120)
            self.figures.command_audits += 1
            found = json.loads(done.stdout) if done.stdout else {"error": done.stderr}
            if done.returncode != 0 or found.get("consistent") is not True \
                    or found.get("findings"):
                raise Violation(f"{h.name}: compute-agent-manage audit: {found}")
            return
        agent = compose(load_config(["--config-file", str(h.conf)]), holder=False)
        try:
            agent.driver.init_host()
            report = audit_report(agent)
        finally:
            agent.driver.cleanup()
            agent.manager.tracker.store.close()
        if report.unknown or not report.consistent or report.findings:
            raise Violation(f"{h.name}: audit: {report.as_dict()}")

    # --- the loop -------------------------------------------------------------

    def run(self, seconds: float | None = None, operations: int | None = None,
            log: Callable[[str], None] = lambda line: None) -> Figures:
        """Operations until the time or the count is reached; a check after
        each, the audit command every ``command_audit_every``."""
        began = time.monotonic()
        done = 0
        while (seconds is None or time.monotonic() - began < seconds) and \
                (operations is None or done < operations):
            try:
                what = self.step()
                self.note(f"= {what}")
                self.figures.ops[what] += 1
                done += 1
                self.check(command_audit=done % self.command_audit_every == 0)
            except Exception as e:
                raise Violation(f"seed {self.seed}, operation {done + 1}: {e}\n"
                                + "\n".join(self.trace)) from e
            log(f"{done}: {what}; {self.figures.total_kills} kills")
        self.check(command_audit=True)
        return self.figures
