"""Load, long: 64 concurrent callers building and deleting against one
agent daemon (tests/reliability/load.py) for the whole time, after a
warm-up; throughput, p50 and p99, and the daemon's RSS, threads and file
descriptors after the warm-up and at the end."""
from __future__ import annotations

import subprocess
from pathlib import Path

from compute_agent.testing.local_placement import LocalPlacement
from tests.reliability.load import run_load

NAME = "load"
TOP = Path(__file__).resolve().parents[2]
CALLERS = 64
WARMUP_SECONDS = 10


def run(minutes: float, workdir: Path) -> dict:
    subprocess.run([str(TOP / "tools" / "services")], check=True,
                   stdout=subprocess.DEVNULL, timeout=300)
    placement = LocalPlacement(workdir / "placement").start()
    try:
        figures = run_load(workdir / "agent", placement.url, seconds=minutes * 60,
                           callers=CALLERS, warmup=WARMUP_SECONDS)
    finally:
        placement.stop()
    return figures.row()
