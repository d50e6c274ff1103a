"""Load: many concurrent RPC callers building and deleting instances
against one agent daemon for a set time. Measured: calls, throughput,
p50 and p99 latency of the calls, every error, and the daemon's memory
(RSS), threads and file descriptors from /proc/<pid> when idle, after a
warm-up, half-way and at the end.

The callers write no allocations to Placement: build_instance reads none
(the claim checks the payload's allocations against the host's tree),
and the test Placement, one process on SQLite, answers 64 concurrent
writers with "database is locked"; the figures are the agent's.

The daemon runs the libvirt driver on libvirt's test driver, over a host
with room for every caller's instance at once: 64 CPUs on two NUMA
nodes, 128 GiB, two PFs with 64 VFs each. The broker is the machine's
RabbitMQ; the daemon reports its tree to the real Placement.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from compute_agent.cmd.common import load_config
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.libvirt_host import DEVICE_SPECS, Host
from tests.functional.test_rpc import BROKER, AgentDaemon

PFS = ("0000:81:00.0", "0000:82:00.0")
SPEC = {"name": "load", "vcpus": 1, "memory_mb": 256}


@dataclass(frozen=True)
class ProcessFigures:
    """One look at a process in /proc."""
    rss_kib: int
    threads: int
    fds: int

    @classmethod
    def of(cls, pid: int) -> ProcessFigures:
        status = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines())
        return cls(rss_kib=int(status["VmRSS"].split()[0]),
                   threads=int(status["Threads"]),
                   fds=len(os.listdir(f"/proc/{pid}/fd")))


class LoadDaemon(AgentDaemon):
    """An agent daemon on a host with room for many instances."""

    def __init__(self, directory: Path, placement_url: str):
        self.host = Host(directory, placement_url)
        b = self.host.sys
        b.add_numa_node(0, "0-31", 65536)
        b.add_numa_node(1, "32-63", 65536)
        for node, pf in enumerate(PFS):
            b.add_pf(pf, "8086", "10fb", "10ed", numa_node=node, total_vfs=64,
                     num_vfs=64, driver="ixgbe", vf_driver="ixgbevf")
        self.conf = self.host.write_conf(
            {"transport_url": BROKER, "update_interval": 2},
            pci={"device_spec": DEVICE_SPECS})
        self.log = directory / "agent.log"
        self.proc = None

    def slots(self) -> list[dict]:
        """Allocations for one instance on each NUMA node: a CPU, memory
        and a VF of that node's PF."""
        tree = self.host.tree()
        return [{tree[self.host.p(f"numa_{node}")]["uuid"]:
                 {"resources": {"VCPU": 1, "MEMORY_MB": SPEC["memory_mb"]}},
                 tree[self.host.p(pf.upper())]["uuid"]:
                 {"resources": {"SRIOV_NET_VF": 1}}}
                for node, pf in enumerate(PFS)]


@dataclass
class LoadFigures:
    callers: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, each call
    errors: list[str] = field(default_factory=list)
    idle: ProcessFigures | None = None
    warm: ProcessFigures | None = None
    half: ProcessFigures | None = None  # between the two halves of the run
    end: ProcessFigures | None = None
    alive: bool = True

    @property
    def calls(self) -> int:
        return len(self.latencies)

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] \
            if ordered else 0.0

    def as_dict(self) -> dict:
        return {"callers": self.callers, "seconds": round(self.seconds, 1),
                "calls": self.calls,
                "calls_per_second": round(self.calls / self.seconds, 1)
                if self.seconds else 0.0,
                "p50_ms": round(self.percentile(50) * 1000, 1),
                "p99_ms": round(self.percentile(99) * 1000, 1),
                "errors": len(self.errors), "daemon_alive": self.alive,
                **{f"{when}_{name}": value
                   for when in ("idle", "warm", "half", "end")
                   if (figures := getattr(self, when)) is not None
                   for name, value in vars(figures).items()}}

    def growth(self, since: str = "warm") -> ProcessFigures:
        """From ``since`` (after the warm-up, or half-way) to the end. A
        pool that fills slowly grows in the first half and stops; a leak
        grows in the second half too."""
        start = getattr(self, since)
        return ProcessFigures(self.end.rss_kib - start.rss_kib,
                              self.end.threads - start.threads,
                              self.end.fds - start.fds)

    def row(self) -> dict:
        """One row of tools/reliability's table."""
        growth, second_half = self.growth(), self.growth("half")
        return {"scenario": f"load {self.callers} callers", "seconds": self.seconds,
                "ops": self.calls, "faults": 0,
                "violations": len(self.errors) + (not self.alive),
                "notes": f"{self.calls / self.seconds:.0f} calls/s, "
                         f"p50 {self.percentile(50) * 1000:.0f} ms, "
                         f"p99 {self.percentile(99) * 1000:.0f} ms; growth: rss "
                         f"{growth.rss_kib / 1024:+.1f} MiB, threads "
                         f"{growth.threads:+d}, fds {growth.fds:+d}; in the second "
                         f"half: rss {second_half.rss_kib / 1024:+.1f} MiB, threads "
                         f"{second_half.threads:+d}, fds {second_half.fds:+d}",
                "problems": self.errors[:20], "figures": self.as_dict()}


def _caller(api: ComputeAgentAPI, daemon: LoadDaemon, slot: dict, until: float,
            figures: LoadFigures, lock: threading.Lock) -> None:
    while time.monotonic() < until:
        instance = str(uuid.uuid4())
        try:
            for call, args in (("build_instance", (instance, SPEC, slot)),
                               ("delete_instance", (instance,))):
                began = time.monotonic()
                getattr(api, call)(daemon.name, *args)
                took = time.monotonic() - began
                with lock:
                    figures.latencies.append(took)
        except Exception as error:
            with lock:
                figures.errors.append(f"{instance}: {type(error).__name__}: "
                                      f"{' '.join(str(error).split())[:200]}")


def run_load(directory: Path, placement_url: str, seconds: float,
             callers: int = 64, warmup: float = 3.0) -> LoadFigures:
    """``callers`` threads for ``seconds`` (after ``warmup`` seconds of the
    same load, whose calls are not counted)."""
    daemon = LoadDaemon(directory, placement_url)
    conf = load_config(["--config-file", str(daemon.conf)])
    # A connection for each caller, as many conductors would have.
    conf.set_override("rpc_conn_pool_size", callers, group="oslo_messaging_rabbit")
    api = ComputeAgentAPI(conf, timeout=60)
    figures = LoadFigures(callers)
    try:
        daemon.start(api)
        figures.idle = ProcessFigures.of(daemon.proc.pid)
        slots = daemon.slots()
        lock = threading.Lock()
        discarded = LoadFigures(callers)
        for phase, length in ((discarded, warmup), (figures, seconds / 2),
                              (figures, seconds / 2)):
            began = time.monotonic()
            until = began + length
            threads = [threading.Thread(
                target=_caller, args=(api, daemon, slots[i % len(slots)],
                                      until, phase, lock)) for i in range(callers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            phase.seconds += time.monotonic() - began
            if phase is discarded:
                figures.errors += discarded.errors
                figures.warm = ProcessFigures.of(daemon.proc.pid)
            elif figures.half is None:
                figures.half = ProcessFigures.of(daemon.proc.pid)
        figures.end = ProcessFigures.of(daemon.proc.pid)
        figures.alive = daemon.proc.poll() is None
        left = api.get_host_info(daemon.name)
        if left["instances"] or left["assignments"]:
            figures.errors.append(f"the host still holds {left}")
    finally:
        daemon.stop()
        api.close()
    return figures
