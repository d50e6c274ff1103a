"""The daemon under Placement faults: the scenario that
tests/reliability/test_placement_faults.py runs for seconds and
tools/reliability for minutes.

The real daemon (a subprocess, libvirt test driver over a fake sysfs tree)
talks to a real Placement through the FaultProxy, with a short
update_interval, while the host changes under it: NUMA memory and vGPU
counts change in sysfs, providers are deleted behind its back with direct
DELETEs, and SIGHUP drops its cache. Then the faults stop, and within three
cycles Placement's tree for it must equal, field by field, the tree that an
agent never faulted registers for the same host (``compute-agent --once``
as another host name on the same sysfs tree).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.store import node_identity
from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault
from tests.functional.helpers import HEADERS, get
from tests.waiting import wait_for

NUMA_CELLS = {0: "0-7", 1: "8-15"}
PF = "0000:3b:00.0"
GPU = "0000:af:00.0"
MDEV_TYPES = {"nvidia-222": "GRID T4-1B", "nvidia-223": "GRID T4-2B"}
PLACEMENT_TIMEOUT = 2  # seconds: how long a black hole holds a request
TOP = Path(__file__).resolve().parents[2]


def spread(total: float) -> dict[PlacementFault, float]:
    """``total`` split over every kind of fault, twice as much for 409s,
    which Placement really answers often."""
    weights = {f: 2 if f is PlacementFault.CONFLICT else 1 for f in PlacementFault}
    scale = total / sum(weights.values())
    return {f: w * scale for f, w in weights.items()}


class Host:
    """A sysfs tree and the test driver's host file for it; memory and
    vGPU counts change by rewriting sysfs files, as the kernel's change."""

    def __init__(self, root: Path):
        self.root = root
        builder = SysfsBuilder(root / "sys")
        for node, cpus in NUMA_CELLS.items():
            builder.add_numa_node(node, cpus, 16384)
        builder.add_pf(PF, "8086", "1572", "154c", 0, 8, 8)
        builder.add_mdev_parent(GPU, 1, {t: (name, 8) for t, name in MDEV_TYPES.items()},
                                "10de", "1eb8")
        self.builder = builder
        self.uri = builder.write_test_driver_host_xml(root / "host.xml")

    def set_memory(self, node: int, memory_mb: int) -> None:
        path = self.root / "sys/devices/system/node" / f"node{node}" / "meminfo"
        _replace(path, f"Node {node} MemTotal:       {memory_mb * 1024} kB\n"
                       f"Node {node} MemFree:        {memory_mb * 512} kB\n")

    def set_available_vgpus(self, type_id: str, count: int) -> None:
        path = (self.builder.device_dir(GPU) / "mdev_supported_types" / type_id /
                "available_instances")
        _replace(path, f"{count}\n")


def _replace(path: Path, text: str) -> None:
    """Whole or not at all, as a reader must see a sysfs file."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_conf(directory: Path, host: Host, name: str, placement_url: str,
               interval: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "agent.conf"
    conf.write_text(f"""\
[DEFAULT]
host = {name}
state_path = {directory / 'state'}
compute_driver = libvirt
sysfs_root = {host.root / 'sys'}
update_interval = {interval}
update_jitter = 0

[libvirt]
connection_uri = {host.uri}
instances_path = {host.root / 'instances'}

[pci]
device_spec = {{"vendor_id": "8086", "product_id": "154c", "physical_network": "physnet1"}}

[devices]
enabled_mdev_types = {",".join(MDEV_TYPES)}

[placement]
auth_type = placement_noauth2
endpoint = {placement_url}
timeout = {PLACEMENT_TIMEOUT}
""")
    return conf


def agent_command(conf: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "compute_agent.cmd.agent", "--config-file", str(conf), *args]


def this_checkout() -> dict[str, str]:
    """The environment in which a child runs this checkout's code."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{TOP}:{path}" if path else str(TOP)}


def named_tree(url: str, root_uuid: str, host: str) -> dict[str, dict]:
    """Placement's tree of ``root_uuid``, by provider name without the host
    name: parent (likewise), inventories with every field, traits and
    aggregates. UUIDs and generations are left out: they differ between
    two hosts that are the same."""
    def short(name: str | None) -> str | None:
        return None if name is None else name.removeprefix(host)

    rows = get(url, f"/resource_providers?in_tree={root_uuid}")["resource_providers"]
    names = {r["uuid"]: r["name"] for r in rows}
    out = {}
    for r in rows:
        base = f"/resource_providers/{r['uuid']}"
        out[short(r["name"])] = {
            "parent": short(names.get(r["parent_provider_uuid"])),
            "inventories": get(url, base + "/inventories")["inventories"],
            "traits": sorted(get(url, base + "/traits")["traits"]),
            "aggregates": sorted(get(url, base + "/aggregates")["aggregates"]),
        }
    return out


def tree_differences(got: dict[str, dict], want: dict[str, dict]) -> list[str]:
    """One line per provider or field that differs."""
    lines = [f"provider {n!r}: missing" for n in sorted(set(want) - set(got))]
    lines += [f"provider {n!r}: not expected" for n in sorted(set(got) - set(want))]
    for name in sorted(set(got) & set(want)):
        for key in want[name]:
            if got[name][key] != want[name][key]:
                lines.append(f"provider {name!r} {key}: {got[name][key]!r}, "
                             f"expected {want[name][key]!r}")
    return lines


@dataclass
class Outcome:
    seconds: float
    cycles: int                  # update cycles the faulted daemon ran
    changes: int                 # host changes, deletions and SIGHUPs
    injected: dict[str, int]
    problems: list[str] = field(default_factory=list)

    @property
    def faults(self) -> int:
        return sum(self.injected.values())


class Scenario:
    def __init__(self, workdir: Path, placement_url: str, fault_rate: float,
                 seed: int = 0, interval: float = 1):
        self.workdir = workdir
        self.placement_url = placement_url
        self.interval = interval
        self.rng = random.Random(seed)
        self.host = Host(workdir / "host")
        self.name = f"faulted-{uuid.uuid4().hex[:8]}"
        self.proxy = FaultProxy(placement_url, spread(fault_rate), seed=seed, delay=0.3)
        self.conf = write_conf(workdir / "faulted", self.host, self.name,
                               self.proxy.url, interval)
        self.log = workdir / "faulted" / "agent.log"
        self.proc: subprocess.Popen | None = None
        self.changes = 0

    # --- the run --------------------------------------------------------

    def run(self, seconds: float, fault_kinds: int = 0, longest: float = 0) -> Outcome:
        """Changes the host for ``seconds``, and on, up to ``longest``
        seconds in all, until faults of ``fault_kinds`` kinds were injected
        (a loaded machine runs fewer cycles, so meets fewer faults, in a
        given time)."""
        started = time.monotonic()
        self.proxy.start()
        try:
            self.proc = subprocess.Popen(agent_command(self.conf),
                                         stdout=open(self.log, "w"),
                                         stderr=subprocess.STDOUT, env=this_checkout())
            root = self._wait_for_root()
            deadline, last = started + seconds, started + max(seconds, longest)
            while self.proc.poll() is None and (
                    time.monotonic() < deadline
                    or (len(self.proxy.injected) < fault_kinds and time.monotonic() < last)):
                self._change_something(root)
                # The host's own pace of change: one every 0.2 to 1 s.
                time.sleep(self.rng.uniform(0.2, 1.0))
            # The host has stopped changing: what it should show.
            want = self._fault_free_tree()
            self.proxy.set_rates({})
            problems = self._check(root, want)
        finally:
            self.proxy.set_rates({})
            self._stop_daemon()
            self.proxy.stop()
        return Outcome(time.monotonic() - started, self._cycles(),
                       self.changes, {f.value: n for f, n in self.proxy.injected.items()},
                       problems)

    def _wait_for_root(self, timeout: float = 60) -> str:
        """The daemon's root provider UUID, once it runs. Not sooner: until
        then SIGHUP has its default action and ends it (under systemd, a
        reload waits for the start to finish)."""
        state = self.workdir / "faulted" / "state"

        def running() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the daemon exited {self.proc.returncode}: "
                                     f"{self.log.read_text()[-2000:]}")
            return "compute-agent running as host" in self.log.read_text()
        wait_for(running, timeout, interval=0.05, message="the daemon made no compute_id")
        return node_identity.load(str(state))

    def _change_something(self, root: str) -> None:
        what = self.rng.choice(("memory", "vgpus", "delete", "sighup"))
        if what == "memory":
            self.host.set_memory(self.rng.choice(list(NUMA_CELLS)),
                                 self.rng.choice((8192, 12288, 16384, 20480)))
        elif what == "vgpus":
            self.host.set_available_vgpus(self.rng.choice(list(MDEV_TYPES)),
                                          self.rng.randint(0, 16))
        elif what == "delete":
            self._delete_a_leaf(root)
        else:
            self.proc.send_signal(signal.SIGHUP)
        self.changes += 1

    def _delete_a_leaf(self, root: str) -> None:
        """Delete one of the daemon's providers that has no children
        directly in Placement, behind its back."""
        rows = get(self.placement_url,
                   f"/resource_providers?in_tree={root}")["resource_providers"]
        parents = {r["parent_provider_uuid"] for r in rows}
        leaves = [r["uuid"] for r in rows if r["uuid"] not in parents]
        if leaves:
            requests.delete(f"{self.placement_url}/resource_providers/"
                            f"{self.rng.choice(sorted(leaves))}",
                            headers=HEADERS, timeout=10)

    # --- the checks -----------------------------------------------------

    def _check(self, root: str, want: dict[str, dict]) -> list[str]:
        problems = []
        if self.proc.poll() is not None:
            problems.append(f"the daemon died (exit {self.proc.returncode})")
        mark = self._cycles()

        # A cycle may be in flight when the faults stop (a black-holed
        # request holds it for the timeout): three more must converge.
        def converged_or_three_cycles_on() -> tuple[list[str]] | None:
            # Counted before the tree is read: once the fourth cycle has
            # begun, the three before it have ended.
            begun = self._cycles() - mark
            differences = tree_differences(
                named_tree(self.placement_url, root, self.name), want)
            if differences and begun < 4 and self.proc.poll() is None:
                return None
            return (differences,)
        (differences,) = wait_for(converged_or_three_cycles_on,
                                  timeout=4 * (self.interval + 10 * PLACEMENT_TIMEOUT),
                                  message="the daemon's cycles stopped turning")
        if differences:
            problems += ["not the fault-free tree 3 cycles after the faults stopped:",
                         *differences]
        text = self.log.read_text()
        if "Traceback" in text:
            problems.append(f"{text.count('Traceback')} tracebacks in {self.log}")
        return problems

    def _fault_free_tree(self) -> dict[str, dict]:
        """What an agent never faulted registers for the same host."""
        name = f"reference-{uuid.uuid4().hex[:8]}"
        directory = self.workdir / name
        conf = write_conf(directory, self.host, name, self.placement_url, self.interval)
        # Placement on SQLite answers 500 "database is locked" now and
        # then while the faulted daemon writes too; a cycle is idempotent.
        for _ in range(3):
            done = subprocess.run(agent_command(conf, "--once"), capture_output=True,
                                  text=True, timeout=120, env=this_checkout())
            if done.returncode == 0:
                break
        else:
            raise AssertionError(f"the reference agent failed: {done.stderr[-2000:]}")
        root = node_identity.load(str(directory / "state"))
        return named_tree(self.placement_url, root, name)

    def _cycles(self) -> int:
        """Update cycles the daemon has begun: each begins with one read
        of its tree (a reshape reads it once more, which only makes the
        count generous)."""
        root = node_identity.load(str(self.workdir / "faulted" / "state"))
        return sum(1 for method, path, _ in self.proxy.seen
                   if (method, path) == ("GET", f"/resource_providers?in_tree={root}"))

    def _stop_daemon(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
