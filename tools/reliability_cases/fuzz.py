"""Fuzzing, long: every surface of tests/reliability for a share of the
time, each in batches of fresh inputs (one row per surface). The RPC
surface goes through the machine's RabbitMQ to one agent daemon on a
Placement of the case's own; the others run in this process."""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from compute_agent.testing.local_placement import LocalPlacement
from tests.reliability import host_data_fuzz as host_data
from tests.reliability.config_fuzz import FuzzedConfig
from tests.reliability.exploring import Tally, explore_for
from tests.reliability.rpc_fuzz import FuzzedAgent, calls

NAME = "fuzz"
TOP = Path(__file__).resolve().parents[2]
# Shares of the time. The parsers run in this process and are fast; the
# RPC calls each cross the broker twice and the store is read after each.
SHARES = {"RPC payloads": 0.3, "node-device XML": 0.12, "capabilities XML": 0.12,
          "ndctl JSON": 0.12, "ndctl file bytes": 0.06, "sysfs + discovery": 0.14,
          "config files": 0.14}


def run(minutes: float, workdir: Path) -> list[dict]:
    # Discovery warns about every device the junk spoils: thousands of
    # lines that say the parsers work, and would bury the table.
    drivers_log = logging.getLogger("compute_agent.drivers")
    level = drivers_log.level
    drivers_log.setLevel(logging.ERROR)
    try:
        return _run(minutes, workdir)
    finally:
        drivers_log.setLevel(level)


def _run(minutes: float, workdir: Path) -> list[dict]:
    subprocess.run([str(TOP / "tools" / "services")], check=True,
                   stdout=subprocess.DEVNULL, timeout=300)
    seconds = {surface: minutes * 60 * share for surface, share in SHARES.items()}
    tallies = [Tally(surface) for surface in SHARES]
    by_name = {t.surface: t for t in tallies}

    def timed(surface: str, strategy, check) -> None:
        explore_for(by_name[surface], strategy, check, seconds[surface])

    timed("node-device XML", host_data.xml_inputs(
        host_data.node_device_documents(workdir / "nodedev")), host_data.check_node_device)
    timed("capabilities XML", host_data.xml_inputs(host_data.capabilities_documents()),
          host_data.check_capabilities)
    ndctl = host_data.NdctlFile(workdir)
    timed("ndctl JSON", host_data.ndctl_inputs(), ndctl.check)
    timed("ndctl file bytes", host_data.ndctl_bytes(), ndctl.check_bytes)
    sysfs = host_data.FuzzedSysfs(workdir / "sysfs")
    try:
        timed("sysfs + discovery", host_data.sysfs_inputs(), sysfs.check)
    finally:
        sysfs.close()
    config = FuzzedConfig(workdir / "config")
    timed("config files", config.inputs(), config.check)

    placement = LocalPlacement(workdir / "placement").start()
    try:
        agent = FuzzedAgent(workdir / "agent", placement.url)
        try:
            timed("RPC payloads", calls(agent.facts), agent.check)
            meanwhile = agent.changed_meanwhile
        finally:
            agent.close()
    finally:
        placement.stop()
    rows = [t.row() for t in tallies]
    rpc = next(r for r in rows if r["scenario"] == "fuzz RPC payloads")
    rpc["notes"] += (f"; {len(meanwhile)} store changes during refused calls naming "
                     "none of their UUIDs")
    rpc["problems"] = rpc["problems"] + [f"not the call's: {m}" for m in meanwhile[:5]]
    total = sum(t.inputs for t in tallies)
    rows.append({"scenario": "fuzz, all surfaces", "seconds": sum(t.seconds for t in tallies),
                 "ops": total, "faults": 0,
                 "violations": sum(len(t.violations) for t in tallies),
                 "notes": f"{total} inputs"})
    return rows
