"""Broker faults, long: one agent daemon and two conductor callers
building and deleting on a RabbitMQ node of the case's own
(tests/reliability/broker_faults.py), while the broker is, in turn,
stopped for 2-6 s (stop_app, start_app) or has every connection cut
(close_all_connections). One row per fault: calls answered around it,
faults, violations (the ledger against the agent, the audit, and one down
and one back line per outage, none for a cut), and how long the daemon
took to serve again after the broker returned."""
from __future__ import annotations

import logging
import random
import statistics
import time
from pathlib import Path

from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.private_services import PrivateRabbitMQ
from tests.reliability.broker_faults import BrokerAgent, Conductor, seconds_until_served

NAME = "broker_faults"
OUTAGE = "broker stopped and started"
CUT = "broker connections cut"


def run(minutes: float, workdir: Path) -> list[dict]:
    # The conductor's own client says each failed send (ERROR): thousands
    # of lines that say the faults happen, and would bury the table.
    messaging_log = logging.getLogger("oslo.messaging")
    level = messaging_log.level
    messaging_log.setLevel(logging.CRITICAL)
    placement = LocalPlacement(workdir / "placement").start()
    broker = PrivateRabbitMQ().start()
    try:
        return _run(minutes, workdir, placement, broker)
    finally:
        broker.close()
        placement.stop()
        messaging_log.setLevel(level)


def _run(minutes: float, workdir: Path, placement: LocalPlacement,
         broker: PrivateRabbitMQ) -> list[dict]:
    agent = BrokerAgent(workdir / "agent", placement.url, broker)
    conductor = Conductor(agent, placement.url)
    agent.start(conductor.api)
    rng = random.Random(0)
    rows = {kind: {"scenario": kind, "seconds": 0.0, "ops": 0, "faults": 0,
                   "violations": 0, "problems": []} for kind in (OUTAGE, CUT)}
    back_in: list[float] = []
    started = time.monotonic()
    conductor.start()
    try:
        while time.monotonic() - started < minutes * 60:
            kind = rng.choice((OUTAGE, CUT))
            row, mark = rows[kind], agent.mark()
            calls, began = conductor.ledger.calls, time.monotonic()
            if kind == OUTAGE:
                broker.stop_app()
                time.sleep(rng.uniform(2, 6))
                broker.start_app()
            else:
                broker.close_all_connections()
            served = seconds_until_served(conductor.api, agent.name)
            if kind == OUTAGE:
                back_in.append(served)
            time.sleep(rng.uniform(2, 4))  # calls after the fault
            expected = 1 if kind == OUTAGE else 0
            lines = (len(agent.down_lines(mark)), len(agent.back_lines(mark)))
            if lines != (expected, expected):
                row["problems"].append(f"{kind}: {lines[0]} down and {lines[1]} back "
                                       f"lines, {expected} each expected")
            noise = agent.driver_noise(mark)
            row["problems"] += [f"{kind}: the driver said: {line[-160:]}" for line in noise]
            row["ops"] += conductor.ledger.calls - calls
            row["faults"] += 1
            row["seconds"] += time.monotonic() - began
    finally:
        conductor.stop()
        final = conductor.violations()
        conductor.close()
        agent.stop()
    rows[OUTAGE]["problems"] += final
    for row in rows.values():
        row["violations"] = len(row["problems"])
    timeouts = sum(conductor.ledger.timeouts.values())
    served = (f"served again {statistics.median(back_in):.1f} s (median), "
              f"{max(back_in):.1f} s (max) after the broker returned; " if back_in else "")
    rows[OUTAGE]["notes"] = (f"{served}{timeouts} calls timed out and were retried; "
                             f"{len(conductor.ledger.built)} instances")
    return list(rows.values())
