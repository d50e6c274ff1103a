"""Benchmark: SIGTERM to exit of an idle daemon.

The real console script (``compute-agent``, fake driver) against a local
Placement and the machine's RabbitMQ (``rabbit://`` on localhost, as the
daemon's default): once it says it is running, it is left idle for IDLE_S
(its cycle done, the next an hour away, its RPC listeners waiting on the
broker), then sent SIGTERM. RUNS runs.

    from tools.benchmarks import stop
    figures = stop.run(pathlib.Path("/tmp/bench"))

Figures: ``stop_median_s`` and ``stop_max_s`` (SIGTERM to exit), ``exit_codes``
(each run's), ``warnings`` (WARNING or ERROR lines the runs logged, in all).
"""
from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from compute_agent.testing.local_placement import LocalPlacement

RUNS = 5
IDLE_S = 3
BIN = Path(sys.executable).parent
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}


def write_conf(workdir: Path, url: str) -> Path:
    workdir.mkdir(parents=True)
    (workdir / "host.yaml").write_text(yaml.safe_dump(HOST))
    conf = workdir / "agent.conf"
    conf.write_text(f"""\
[DEFAULT]
host = stop-{uuid.uuid4().hex[:8]}
state_path = {workdir / 'state'}
compute_driver = fake
update_interval = 3600
update_jitter = 0

[fake]
host_file = {workdir / 'host.yaml'}

[placement]
auth_type = placement_noauth2
endpoint = {url}
""")
    return conf


def stop_once(workdir: Path, url: str) -> tuple[float, int, int]:
    """(seconds from SIGTERM to exit, exit code, WARNING or ERROR lines)."""
    log = workdir / "agent.log"
    conf = write_conf(workdir, url)
    with open(log, "w") as out:
        daemon = subprocess.Popen([str(BIN / "compute-agent"), "--config-file", str(conf)],
                                  stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "compute-agent running as host" not in log.read_text():
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            raise RuntimeError(f"the daemon did not start: see {log}")
        time.sleep(0.1)
    time.sleep(IDLE_S)
    sent = time.monotonic()
    daemon.send_signal(signal.SIGTERM)
    code = daemon.wait(120)
    took = time.monotonic() - sent
    lines = log.read_text().splitlines()
    return took, code, sum(" WARNING " in line or " ERROR " in line for line in lines)


def run(workdir: Path) -> dict:
    placement = LocalPlacement(workdir / "placement").start()
    try:
        runs = [stop_once(workdir / f"run{i}", placement.url) for i in range(RUNS)]
    finally:
        placement.stop()
    took = [t for t, _, _ in runs]
    return {"case": "stop", "runs": RUNS, "idle_s": IDLE_S,
            "stop_median_s": round(statistics.median(took), 2),
            "stop_max_s": round(max(took), 2),
            "exit_codes": [c for _, c, _ in runs], "warnings": sum(w for _, _, w in runs)}
