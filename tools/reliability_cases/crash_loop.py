"""The crash loop for minutes (tests/reliability/crash_loop.py): a
conductor following nova's protocol drives two agent daemons through
builds, deletes, resizes, live migrations and evacuations while it SIGKILLs
them, in flight and at start-up, and checks after every operation that no
acknowledged assignment was lost, none is held twice, and store, guests and
Placement agree (the audit). Two rows: most of the time on the fake driver
with a state file (the hypervisor outlives the agent; a restart takes well
under a second, so the kills count in the thousands), the rest on the
libvirt driver over two private libvirtds with QEMU/KVM (real guests, real
live migrations), one seed per round of at most ``ROUND`` seconds."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from agent.testing.local_placement import LocalPlacement
from tests.functional.private_services import private_libvirtd_pair
from tests.reliability.crash_loop import (CrashLoop, FakeHypervisors, QemuHypervisors,
                                          Violation)

NAME = "crash_loop"
QEMU_SHARE = 0.25  # of the minutes, on real QEMU guests
ROUND = 120  # seconds: each round a fresh pair of hosts and a new seed
TOP = Path(__file__).resolve().parents[2]


def run(minutes: float, workdir: Path) -> list[dict]:
    subprocess.run([str(TOP / "tools" / "services")], check=True,
                   stdout=subprocess.DEVNULL, timeout=300)
    placement = LocalPlacement(workdir / "placement").start()
    try:
        qemu_seconds = minutes * 60 * QEMU_SHARE
        rows = [rounds("fake driver, state file", minutes * 60 - qemu_seconds,
                       workdir / "fake", placement.url, lambda root: FakeHypervisors())]
        daemons = private_libvirtd_pair(workdir / "libvirtd")
        try:
            for daemon in daemons:
                daemon.start()
            rows.append(rounds("libvirt driver, QEMU/KVM", qemu_seconds, workdir / "qemu",
                               placement.url, lambda root: QemuHypervisors(daemons)))
        finally:
            for daemon in daemons:
                daemon.close()
    finally:
        placement.stop()
    return rows


def rounds(label: str, seconds: float, root: Path, placement_url: str, hypervisors) -> dict:
    """Rounds of the loop, one seed each, for ``seconds``; one row."""
    began = time.monotonic()
    kills = ops = retries = in_flight = startup = audits = seed = 0
    problems: list[str] = []
    while time.monotonic() - began < seconds:
        seed += 1
        left = seconds - (time.monotonic() - began)
        loop = CrashLoop(root / f"seed-{seed}", placement_url, hypervisors(root), seed)
        try:
            loop.start().run(seconds=min(ROUND, left))
        except Violation as e:
            problems.append(f"seed {seed}: {e}")
        finally:
            loop.close()
        f = loop.figures
        kills += f.total_kills
        in_flight += f.kills["in flight"]
        startup += f.kills["start-up"]
        ops += sum(f.ops.values())
        retries += f.retries
        audits += f.command_audits
    took = time.monotonic() - began
    return {"scenario": f"crash loop: {label}", "seconds": took, "ops": ops,
            "faults": kills, "violations": len(problems),
            "notes": f"SIGKILLs {kills} ({in_flight} in flight, {startup} at start-up), "
                     f"{kills / max(took, 1e-9):.2f}/s; {retries} calls sent again; "
                     f"{audits} audit commands; seeds 1-{seed}",
            "problems": problems}
