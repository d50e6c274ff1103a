"""The crash loop for minutes (tests/reliability/crash_loop.py): a
conductor following nova's protocol drives two agent daemons through
builds, deletes, resizes, live migrations and evacuations while it SIGKILLs
them, in flight and at start-up, and checks after every operation that no
acknowledged assignment was lost, none is held twice, and store, guests and
Placement agree (the audit). This case runs it on the fake driver with a state
file (the hypervisor outlives the agent; a restart takes well under a
second, so the kills count in the thousands); crash_loop_qemu on the
libvirt driver over two private libvirtds with QEMU/KVM (real guests, real
live migrations). One seed per round of at most ``ROUND`` seconds."""
from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compute_agent.testing.local_placement import LocalPlacement
from tests.reliability.crash_loop import CrashLoop, FakeHypervisors, Violation

NAME = "crash_loop"
ROUND = 120  # seconds: each round a fresh pair of hosts and a new seed
TOP = Path(__file__).resolve().parents[2]


def run(minutes: float, workdir: Path) -> list[dict]:
    with services(workdir) as placement_url:
        return [rounds("fake driver, state file", minutes * 60, workdir / "fake",
                       placement_url, lambda root: FakeHypervisors())]


@contextmanager
def services(workdir: Path) -> Iterator[str]:
    """The machine's RabbitMQ and libvirtd running; a Placement of the
    case's own, its URL."""
    subprocess.run([str(TOP / "tools" / "services")], check=True,
                   stdout=subprocess.DEVNULL, timeout=300)
    placement = LocalPlacement(workdir / "placement").start()
    try:
        yield placement.url
    finally:
        placement.stop()


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
