"""Evacuation, killed mid-way, on real QEMU: two compute-agent daemons, each
on a private libvirtd of its own (tests/functional/private_services.py),
with its own host name, state directory and sysfs root, the real Placement
and the real RabbitMQ; compute-agent-ctl and compute-agent-manage run as
an operator runs them.

Real QEMU because the test restarts agents: a QEMU guest outlives the
agent process that started it, as on a real host, where the libvirt test
driver's guests and the fake driver's die with it. No host device may be
given to a guest here, so each guest holds what QEMU really runs: its NUMA
cell, memory and vCPUs (the device refusals are in test_evacuation_refusals).

A host's death is staged as a fence does it: its agent SIGKILLed and its
guests destroyed (powered off, still defined, as after a power cut).
"""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import libvirt
import pytest

from compute_agent.cmd.common import load_config
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.moves.evacuation import evacuation_migration_uuid
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.helpers import get, put_allocations, wait_for, write_conf

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
SPEC = {"name": "evac", "vcpus": 1, "memory_mb": 64}
DOWN_AFTER = 2


def command(module: str, conf: Path, *args, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"compute_agent.cmd.{module}",
                           "--config-file", str(conf), *args],
                          capture_output=True, text=True, timeout=timeout)


class QemuAgent:
    """A compute-agent daemon on a private libvirtd."""

    def __init__(self, directory: Path, placement_url: str, daemon):
        self.name = f"evac-{uuid.uuid4().hex[:8]}"
        self.dir = directory
        self.daemon = daemon
        self.url = placement_url
        # Its own sysfs tree: one NUMA cell with the machine's two CPUs.
        SysfsBuilder(directory / "sys").add_numa_node(0, "0-1", 4096)
        self.conf = write_conf(
            directory, placement_url, self.name, host_dict=None,
            DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(directory / "sys"),
                     "transport_url": BROKER, "service_down_time": DOWN_AFTER},
            libvirt={"connection_uri": daemon.uri, "live_migration_uri": daemon.uri,
                     "instances_path": str(directory / "instances")})
        self.log = directory / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self, api: ComputeAgentAPI) -> QemuAgent:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compute_agent.cmd.agent", "--config-file", str(self.conf)],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        wait_for(lambda: self._answers(api), timeout=60)
        return self

    def _answers(self, api) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            api._call(self.name, "get_host_info", timeout=2)
            return True
        except Exception:
            return False

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """After the test: its stores are durable, so SIGKILL (a SIGTERM
        waits up to 5 s for each RPC server's idle poll)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()

    def root(self) -> str:
        return (self.dir / "state" / "compute_id").read_text().strip()

    def cell(self) -> str:
        return next(p["uuid"] for p in get(
            self.url, f"/resource_providers?in_tree={self.root()}")["resource_providers"]
            if p["name"] == f"{self.name}_numa_0")

    def store(self, sql: str) -> list[tuple]:
        conn = sqlite3.connect(f"file:{self.dir / 'state' / 'state.db'}?mode=ro",
                               uri=True)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def domains(self, active_only: bool = False) -> dict[str, bool]:
        """The guests this host's libvirtd has: uuid -> running."""
        conn = libvirt.open(self.daemon.uri)
        try:
            return {d.UUIDString(): bool(d.isActive()) for d in conn.listAllDomains()
                    if d.isActive() or not active_only}
        finally:
            conn.close()

    def power_cut(self) -> None:
        """The fence: the agent dies, its guests stop where they are."""
        self.kill()
        conn = libvirt.open(self.daemon.uri)
        try:
            for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                d.destroy()
        finally:
            conn.close()


@pytest.fixture
def hosts(tmp_path, placement, services, two_private_libvirtds):
    a = QemuAgent(tmp_path / "a", placement.url, two_private_libvirtds[0])
    b = QemuAgent(tmp_path / "b", placement.url, two_private_libvirtds[1])
    api = ComputeAgentAPI(load_config(["--config-file", str(a.conf)]), timeout=30)
    yield a.start(api), b.start(api), api
    # Both agents stopped before any guest is touched: a failed test may
    # leave a guest moving between the two, gone by the time it is undefined.
    for agent in (a, b):
        agent.stop()
    api.close()
    for agent in (a, b):
        conn = libvirt.open(agent.daemon.uri)
        try:
            for d in conn.listAllDomains():
                try:
                    if d.isActive():
                        d.destroy()
                    d.undefine()
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                        raise
        finally:
            conn.close()


def allocations_of(url: str, consumer: str) -> set[str]:
    return set(get(url, f"/allocations/{consumer}")["allocations"])


def providers_of(url: str, root: str) -> set[str]:
    return {p["uuid"] for p in get(url, f"/resource_providers?in_tree={root}")[
        "resource_providers"]}


def test_a_destination_killed_mid_evacuation_resumes_each_guest_once_and_the_source_gives_them_up(
        hosts, placement):
    a, b, api = hosts
    url = placement.url
    instances = []
    for _ in range(5):
        instance = str(uuid.uuid4())
        wanted = {a.cell(): {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}
        put_allocations(url, instance, wanted)
        assert api.build_instance(a.name, instance, SPEC, wanted)["running"]
        instances.append(instance)
    assert set(a.domains(active_only=True)) >= set(instances)

    a.power_cut()
    listed = json.loads(command("ctl", a.conf, "hosts", "--json").stdout)
    by_host = {h["host"]: h for h in listed}
    assert by_host[a.name]["state"] == "down" and by_host[a.name]["last_seen"] is None
    assert by_host[a.name]["instances"] == 5
    assert by_host[b.name]["state"] == "up" and by_host[b.name]["last_seen"] > 0

    # Evacuate; the destination is SIGKILLed as soon as it has accepted all
    # five (the move and the claim on its disk), while it builds them.
    ctl = subprocess.Popen([sys.executable, "-m", "compute_agent.cmd.ctl", "--config-file",
                            str(a.conf), "--timeout", "8", "evacuate", a.name,
                            "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    accepted_sql = "SELECT uuid FROM migrations WHERE kind = 'evacuation'"
    wait_for(lambda: (b.dir / "state" / "state.db").exists()
             and len(b.store(accepted_sql)) == 5, timeout=90, interval=0.01)
    b.kill()
    unfinished = b.store("SELECT uuid FROM migrations WHERE state != 'confirmed'")
    assert unfinished, "every rebuild had finished before the kill: nothing resumed"
    out, err = ctl.communicate(timeout=60)
    assert ctl.returncode == 1 and out, (out, err)
    evacuation = json.loads(out)
    assert {o["instance"] for o in evacuation["instances"]} == set(instances)
    assert {o["destination"] for o in evacuation["instances"]} == {b.name}
    assert {o["migration"] for o in evacuation["instances"]} == {
        evacuation_migration_uuid(i, a.root()) for i in instances}

    # The destination restarts, and resumes what it accepted.
    b.start(api)
    for instance in instances:
        view = api.get_instance(b.name, instance)
        assert view["running"], view
        assert {m["state"] for m in view["migrations"]} == {"confirmed"}
        assert {(x["owner"], x["state"]) for x in view["assignments"]} == {
            ("instance", "claimed")}
        assert {x["provider_uuid"] for x in view["assignments"]} == {b.cell()}
    assert set(b.domains(active_only=True)) == set(instances)  # each once
    assert not set(a.domains(active_only=True)) & set(instances)
    for instance in instances:
        assert allocations_of(url, instance) <= providers_of(url, b.root())
        assert allocations_of(url, evacuation_migration_uuid(instance, a.root())) \
            <= providers_of(url, a.root())
    # Resumed at start-up, before RPC was served: exactly the unfinished ones.
    assert b.log.read_text().count("reconcile: evacuation_interrupted") == len(unfinished)

    # Run again: nothing is evacuated twice.
    again = command("ctl", a.conf, "evacuate", a.name, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["instances"] == []

    # The source returns: it gives all five up, and keeps nothing.
    a.start(api)
    assert api.get_host_info(a.name)["instances"] == 0
    assert not set(a.domains()) & set(instances)
    assert a.log.read_text().count("evacuated_elsewhere") == 5
    for instance in instances:
        assert allocations_of(url, evacuation_migration_uuid(instance, a.root())) == set()
        assert api.get_instance(b.name, instance)["running"]
    for agent in (a, b):
        audit = command("manage", agent.conf, "audit", "--json")
        assert audit.returncode == 0, (audit.stdout, audit.stderr)
        assert json.loads(audit.stdout) == {"consistent": True, "findings": [],
                                            "unknown": []}
