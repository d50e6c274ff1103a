"""Store faults under the real daemon (tests/reliability/store_faults.py),
for minutes: builds and deletes over RPC while the store's file system
fills up and empties, or the kernel turns it read-only and the operator
repairs it and restarts the agent. After every round: nothing
acknowledged lost, no device held twice, the daemon up."""
from __future__ import annotations

import random
import time
from pathlib import Path

from compute_agent.testing.local_placement import LocalPlacement
from tests.reliability.store_faults import StoreFaultHost

NAME = "store_faults"
VFS = 8  # the host's VFs: at most this many instances at once


def run(minutes: float, workdir: Path) -> dict:
    placement = LocalPlacement(workdir / "placement").start()
    host = StoreFaultHost(workdir / "host", placement.url)
    rng = random.Random(0)
    started = time.monotonic()
    calls = faults = rounds = 0
    problems: list[str] = []
    try:
        host.start()
        while time.monotonic() - started < minutes * 60:
            fault = rng.choice(("full", "read-only", "none"))
            if fault == "full":
                host.disk.fill()
            elif fault == "read-only":
                host.disk.fail_read_only()
            faults += fault != "none"
            calls += some_calls(host, rng)
            if host.proc.poll() is not None:
                problems.append(f"round {rounds}: the daemon died "
                                f"(exit {host.proc.returncode})")
                host.start()
            if fault == "full":
                host.disk.unfill()
            elif fault == "read-only":
                host.stop()
                host.disk.repair()
                host.start()
            for instance in list(host.ledger.refused):
                host.build(instance)  # the conductor retries
                calls += 1
            problems += [f"round {rounds} ({fault}): {p}" for p in host.violations()]
            rounds += 1
    finally:
        host.close()
        placement.stop()
    problems += [f"{log}: a traceback" for log in sorted(host.daemon.dir.glob("agent-*.log"))
                 if "Traceback" in log.read_text()]
    return {"scenario": "store faults (full, read-only)",
            "seconds": time.monotonic() - started, "ops": calls, "faults": faults,
            "violations": len(problems),
            "notes": f"{rounds} rounds, {host.ledger.refusals} calls refused "
                     "(StoreUnavailable); ops = build and delete calls",
            "problems": problems}


def some_calls(host: StoreFaultHost, rng: random.Random) -> int:
    """A few builds and deletes, as a conductor would send them."""
    calls = rng.randint(2, 6)
    for _ in range(calls):
        held = sorted(host.ledger.acknowledged)
        if held and (len(held) + len(host.ledger.refused) >= VFS or rng.random() < 0.4):
            host.delete(rng.choice(held))
        elif len(held) + len(host.ledger.refused) < VFS:
            host.build()
    return calls
