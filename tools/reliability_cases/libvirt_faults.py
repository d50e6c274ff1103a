"""libvirt faults, long: an agent on a libvirtd of the case's own
(QEMU/KVM), its update loop every second, in rounds of: a small real
guest built; libvirtd restarted under the update loop (the guests built
before must still be ours and running, one line each way); a build during
which libvirtd stops (it fails, its claim stays, the retry with the same
uuid builds it on the same claim); the oldest guest deleted. One row per
fault; violations: wrong lines, a guest lost or not running, a retry on
other devices, an audit not consistent, and anything left at the end."""
from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.helpers import unallocate
from tests.functional.private_services import PrivateLibvirtd
from tests.reliability.libvirt_faults import (
    build,
    build_with_libvirtd_stopping,
    held,
    libvirt_agent,
    restart_under_the_loop,
    schedule,
)

NAME = "libvirt_faults"
CYCLES = "libvirtd restarted under the update loop"
BUILD = "libvirtd stopped during a build"
# Guests kept running across restarts; the oldest is deleted beyond this.
KEPT = 3


class Lines(logging.Handler):
    """The lines the agent says about its dependencies."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "compute_agent.dependencies":
            self.lines.append(record.getMessage())


def run(minutes: float, workdir: Path) -> list[dict]:
    placement = LocalPlacement(workdir / "placement").start()
    libvirtd = PrivateLibvirtd(workdir / "libvirtd").start()
    lines = Lines()
    said = logging.getLogger("compute_agent.dependencies")
    level = said.level
    said.setLevel(logging.INFO)  # the back line is INFO
    said.addHandler(lines)
    try:
        return _run(minutes, workdir, placement.url, libvirtd, lines)
    finally:
        said.removeHandler(lines)
        said.setLevel(level)
        libvirtd.close()
        placement.stop()


def _run(minutes: float, workdir: Path, placement_url: str, libvirtd: PrivateLibvirtd,
         lines: Lines) -> list[dict]:
    agent = libvirt_agent(workdir / "agent", placement_url, libvirtd)
    rows = {kind: {"scenario": kind, "seconds": 0.0, "ops": 0, "faults": 0,
                   "violations": 0, "problems": []} for kind in (CYCLES, BUILD)}
    running: list[str] = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < minutes * 60:
            instance = str(uuid.uuid4())
            build(agent, instance, schedule(agent, placement_url, instance))
            running.append(instance)

            row, began, said = rows[CYCLES], time.monotonic(), len(lines.lines)
            restart_under_the_loop(agent, libvirtd)
            new = lines.lines[said:]
            if len(new) != 2 or "is back after" not in new[1]:
                row["problems"].append(f"restart {row['faults']}: lines {new}")
            for guest in running:
                if not agent.manager.get_instance(guest)["running"]:
                    row["problems"].append(f"guest {guest} not running after a restart")
            row["ops"] += len(running)  # guests that lived through it
            row["faults"] += 1
            row["seconds"] += time.monotonic() - began

            row, began = rows[BUILD], time.monotonic()
            instance = str(uuid.uuid4())
            wanted = schedule(agent, placement_url, instance)
            error = build_with_libvirtd_stopping(agent, libvirtd, instance, wanted)
            claimed = held(agent.manager.get_instance(instance))
            if not isinstance(error, DriverUnavailable):
                row["problems"].append(f"build {instance}: {error!r}, a DriverUnavailable "
                                       "expected")
            if held(build(agent, instance, wanted)) != claimed:
                row["problems"].append(f"build {instance}: the retry changed its claim")
            running.append(instance)
            row["ops"] += 2
            row["faults"] += 1
            row["seconds"] += time.monotonic() - began

            if not agent.reconcile(at_start=False, fix=False).consistent:
                row["problems"].append("audit not consistent")
            while len(running) > KEPT:
                gone = running.pop(0)
                agent.manager.delete_instance(gone)
                unallocate(placement_url, gone)
    finally:
        for instance in running:
            agent.manager.delete_instance(instance)
            unallocate(placement_url, instance)
        left = agent.manager.tracker.snapshot()
        agent.stop()
    if left[0] or left[1]:
        rows[BUILD]["problems"].append(f"left at the end: {len(left[0])} instances, "
                                       f"{len(left[1])} assignments")
    for row in rows.values():
        row["violations"] = len(row["problems"])
    return list(rows.values())
