"""The daemon under Placement faults (tests/reliability/placement_faults.py)
at several fault rates, in rounds of about a minute: each round's daemon
must stay up and converge to the fault-free tree within three cycles once
its faults stop."""
from __future__ import annotations

import time
from pathlib import Path

from compute_agent.testing.local_placement import LocalPlacement
from tests.reliability.placement_faults import Scenario

NAME = "placement_faults"
RATES = (0.05, 0.2, 0.4)
ROUND_SECONDS = 60


def run(minutes: float, workdir: Path) -> list[dict]:
    placement = LocalPlacement(workdir / "placement").start()
    try:
        share = minutes * 60 / len(RATES)
        return [run_rate(rate, share, placement.url, workdir / f"rate-{rate}")
                for rate in RATES]
    finally:
        placement.stop()


def run_rate(rate: float, seconds: float, url: str, workdir: Path) -> dict:
    started = time.monotonic()
    cycles = faults = changes = rounds = 0
    problems: list[str] = []
    while time.monotonic() - started < seconds:
        left = seconds - (time.monotonic() - started)
        outcome = Scenario(workdir / f"round-{rounds}", url, rate,
                           seed=rounds).run(min(ROUND_SECONDS, max(left, 10)))
        rounds += 1
        cycles += outcome.cycles
        faults += outcome.faults
        changes += outcome.changes
        problems += [f"round {rounds - 1} (seed {rounds - 1}): {p}"
                     for p in outcome.problems]
    return {"scenario": f"placement faults {rate:.0%}",
            "seconds": time.monotonic() - started, "ops": cycles, "faults": faults,
            "violations": len(problems),
            "notes": f"{rounds} daemons, {changes} host changes; ops = update cycles",
            "problems": problems}
