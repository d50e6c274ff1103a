"""The fleet driven from outside: agents in worker processes, whether each
host is in step, and the figures drawn from Placement's request log."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tools.fleet_sim.placement import Request

if TYPE_CHECKING:
    from compute_agent.rpc.client import ComputeAgentAPI
    from compute_agent.rpc.heartbeat import Heartbeat

TOP = Path(__file__).resolve().parents[2]
AGENTS_NICENESS = 19
# The cgroup-v1 cpu controller, and the weight of the agents' group
# against the 1,024 of each other task: the least it takes.
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
AGENTS_CPU_SHARES = 2


class AgentsCpuGroup:
    """A cpu cgroup for the fleet's worker processes, weighing
    AGENTS_CPU_SHARES against 1,024 for each task outside it: together they
    get what Placement, its database and the broker leave. Niceness alone
    weighs each thread (15 at nice 19 against 1,024 at nice 0): at 1,000
    agents, 1,500 runnable agent threads outweighed the broker's two
    schedulers, and rabbitmqctl took a minute to reach the node. None
    where the controller is not there or not ours to write (nice alone
    then)."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def make(cls, name: str) -> AgentsCpuGroup | None:
        path = CPU_CGROUPS / name
        try:
            path.mkdir()
            (path / "cpu.shares").write_text(str(AGENTS_CPU_SHARES))
        except OSError:
            return None
        return cls(path)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Once its processes are gone."""
        try:
            self.path.rmdir()
        except OSError:
            pass


def worktree_env() -> dict[str, str]:
    """This environment with this checkout first on PYTHONPATH: a child
    runs this tree's agent and tools."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TOP)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}


class ProcessFleet:
    """The agents of ``confs`` spread over ``processes`` worker processes
    (tools/fleet_sim/worker.py), at the lowest CPU priority: they stand in
    for as many machines, each with CPUs of its own, so here they take
    only what Placement, its database and the broker (whose cost the run
    measures) leave. At the same priority, 1,000 agents starting at once
    starved Placement to 6 requests a second. Each process leads a session
    of its own, as a daemon does: with use_queue_manager, oslo.messaging
    reads its process group leader's start time for each reply queue's
    name, and in the run's group, whose leader (the shell that started
    the run) may have exited, every one failed."""

    def __init__(self, confs: list[Path], processes: int, log_dir: Path):
        env = worktree_env()
        shares = [confs[i::processes] for i in range(processes)]
        self.procs = [subprocess.Popen(
            ["nice", "-n", str(AGENTS_NICENESS), sys.executable, "-m",
             "tools.fleet_sim.worker", *map(str, share)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            stderr=open(log_dir / f"worker-{i}.log", "a"), start_new_session=True)
            for i, share in enumerate(shares) if share]
        self.cpu_group = AgentsCpuGroup.make(f"fleet-{os.getpid()}")
        if self.cpu_group is not None:
            for p in self.procs:
                self.cpu_group.add(p.pid)

    def _all(self, command: dict) -> list[dict]:
        line = json.dumps(command) + "\n"
        for p in self.procs:
            p.stdin.write(line)
            p.stdin.flush()
        answers = []
        for p in self.procs:
            reply = p.stdout.readline()
            if not reply:
                raise RuntimeError(f"a fleet worker exited ({p.poll()}); see its log")
            answers.append(json.loads(reply))
        return answers

    def start(self) -> None:
        self._all({"cmd": "start"})

    def restart(self) -> None:
        self._all({"cmd": "restart"})

    def wait(self) -> None:
        self._all({"cmd": "wait"})

    def status(self) -> tuple[list[dict], list[dict]]:
        """Every host's status, and each process's figures."""
        answers = self._all({"cmd": "status"})
        return [h for a in answers for h in a["hosts"]], [a["process"] for a in answers]

    def build_half(self, placement_url: str) -> int:
        return sum(a["providers"] for a in
                   self._all({"cmd": "build_half", "placement_url": placement_url}))

    def _one(self, command: dict) -> dict:
        """``command`` for one host: the answer of the process that has it."""
        here = [a for a in self._all(command) if a["here"]]
        if not here:
            raise RuntimeError(f"no fleet worker has host {command['host']}")
        return here[0]

    def stop_host(self, host: str) -> None:
        self._one({"cmd": "stop_host", "host": host})

    def start_host(self, host: str) -> None:
        error = self._one({"cmd": "start_host", "host": host})["error"]
        if error:
            raise RuntimeError(f"{host} did not start again: {error}")

    def build_small(self, host: str, placement_url: str, count: int) -> list[str]:
        return self._one({"cmd": "build_small", "host": host,
                          "placement_url": placement_url, "count": count})["instances"]

    def close(self, timeout: float = 120) -> None:
        """Every process told to stop its agents, all at once; those not
        gone within ``timeout`` killed."""
        for p in self.procs:
            try:
                p.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                p.stdin.flush()
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.cpu_group is not None:
            self.cpu_group.remove()


def out_of_step(hosts: list[dict], trees: dict[str, str],
                since: float | None = None) -> list[str]:
    """The hosts not in step: no successful cycle (since ``since``, wall
    clock), RPC not served, or Placement's tree not the one the agent
    reports (``trees``: root uuid -> digest, read from Placement's
    database)."""
    late = []
    for h in hosts:
        ok = (h.get("host") and h["cycle_ok"] and h["serving"]
              and trees.get(h["root_uuid"]) == h["expected"]
              and (since is None or (h["last_success_at"] or 0) >= since))
        if not ok:
            late.append(h.get("host") or h.get("error") or "?")
    return late


@dataclass(frozen=True)
class BusClients:
    """The run's own clients on the bus, which ask whether agents answer:
    the API's and the heartbeat's, each on a transport of its own."""
    api: ComputeAgentAPI
    heartbeat: Heartbeat

    def unanswered(self, hosts: list[str], timeout: float = 10) -> list[str]:
        """The hosts whose agent does not answer both get_host_info (its
        RPC server) and its heartbeat (the heartbeat's server). Each
        server's first answer opens the connection its answers go out on:
        asked here, one host after another, not by the next scenario's
        operator all at once."""
        def asks(host: str) -> str | None:
            try:
                self.api._call(host, "get_host_info", timeout=timeout)
                return None if self.heartbeat.check(host).up else host
            except Exception:  # noqa: BLE001 - any failure: the host is not serving
                return host

        with ThreadPoolExecutor(max_workers=16) as pool:
            return [h for h in pool.map(asks, hosts) if h is not None]

    def close(self) -> None:
        self.api.close()
        self.heartbeat.close()


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered) / 100) - 1)]


def latency(requests: list[Request]) -> dict:
    """Placement's p50/p99 in milliseconds, and its peak requests per
    second, over ``requests``."""
    times = [r.seconds * 1000 for r in requests if r.seconds is not None]
    per_second = Counter(int(r.at) for r in requests if r.at is not None)
    return {"requests": len(requests),
            "p50_ms": round(percentile(times, 50), 1) if times else None,
            "p99_ms": round(percentile(times, 99), 1) if times else None,
            "peak_rps": max(per_second.values()) if per_second else None}


def kind(request: Request) -> str:
    """The request's part of an idle cycle."""
    if request.method == "GET" and "?in_tree=" in request.path:
        return "tree"
    if request.method == "GET" and request.path.endswith("/allocations"):
        return "allocations"
    return "other"


@dataclass(frozen=True)
class IdleCost:
    host_cycles: int
    host_reconciles: int
    reconcile_interval: int
    requests: Counter

    @property
    def per_host_cycle(self) -> float:
        """Every request of an idle host per cycle: the tree read and any
        other request per cycle, and the allocation reads over their own
        period (a reconciliation every reconcile_interval cycles)."""
        per_cycle = (self.requests["tree"] + self.requests["other"]) / max(self.host_cycles, 1)
        reads = self.requests["allocations"] / max(self.host_reconciles, 1)
        return per_cycle + reads / self.reconcile_interval

    def as_dict(self) -> dict:
        return {"host_cycles": self.host_cycles, "host_reconciles": self.host_reconciles,
                "reconcile_interval": self.reconcile_interval,
                "requests": dict(self.requests),
                "allocation_reads_per_host_reconcile":
                    round(self.requests["allocations"] / max(self.host_reconciles, 1), 2),
                "per_host_cycle": round(self.per_host_cycle, 3)}


def agent_cpu_ms_per_host_cycle(before: list[dict], after: list[dict],
                                host_cycles: int) -> float:
    """The agents' processes' CPU (user and system) between two of their
    figures (ProcessFleet.status), per host cycle run meanwhile."""
    spent = sum(a["cpu_seconds"] - b["cpu_seconds"] for b, a in zip(before, after))
    return round(spent * 1000 / max(host_cycles, 1), 2)


def idle_cost(before: list[dict], after: list[dict], requests: list[Request]) -> IdleCost:
    """From the hosts' cycle counters at both ends of a window and the
    agents' requests Placement logged in it."""
    interval = after[0]["reconcile_interval"]
    cycles = reconciles = 0
    for b, a in zip(before, after):
        cycles += a["cycles"] - b["cycles"]
        reconciles += a["cycles"] // interval - b["cycles"] // interval
    return IdleCost(cycles, reconciles, interval,
                    Counter(kind(r) for r in requests if r.from_agent))


def processes_figures(processes: list[dict], hosts: int) -> dict:
    """Memory per host beyond each process's empty base, threads and
    descriptors."""
    beyond = sum(p["rss"] - p["base_rss"] for p in processes)
    return {"agent_rss_mib_per_host": round(beyond / hosts / 2**20, 2),
            "threads": sum(p["threads"] for p in processes),
            "threads_per_host": round(sum(p["threads"] for p in processes) / hosts, 1),
            "fds": sum(p["fds"] for p in processes),
            "fds_per_host": round(sum(p["fds"] for p in processes) / hosts, 1)}


def wait_in_step(statuses, placement, since: float | None, timeout: float,
                 bus: BusClients | None = None, progress=None
                 ) -> tuple[float | None, list[str]]:
    """Seconds from now until every host is in step (out_of_step, then,
    with ``bus``, answering it: BusClients.unanswered), or None at
    ``timeout`` with those late. ``statuses``: every host's status, now."""
    started = time.monotonic()
    answered: set[str] = set()
    late: list[str] = []
    while time.monotonic() - started < timeout:
        hosts = statuses()
        failed = [h["error"] for h in hosts if h["host"] is None and h["error"] != "not started"]
        if failed:
            raise RuntimeError(f"{len(failed)} agents failed to start; the first: {failed[0]}")
        late = out_of_step(hosts, placement.trees(), since)
        if not late and bus is not None:
            waiting = [h["host"] for h in hosts if h["host"] not in answered]
            silent = bus.unanswered(waiting)
            answered |= set(waiting) - set(silent)
            late = silent
        if progress:
            progress(f"{len(hosts) - len(late)}/{len(hosts)} in step")
        if not late:
            return time.monotonic() - started, []
        time.sleep(1)
    return None, late
