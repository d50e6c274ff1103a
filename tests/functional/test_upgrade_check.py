"""compute-agent-manage upgrade-check against the real Placement: a switch
of provider_tree_mode under guests is a warning naming the classes and
heal, beside the agent that holds the store; once healed, a success."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from compute_agent.heal.run import run_heal
from tests.functional.test_heal import PMEM, flat_host_with_guests


def upgrade_check(conf: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compute_agent.cmd.manage", "--config-file",
                           str(conf), "upgrade-check", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_mode_switch_under_guests_warns_until_healed(tmp_path, placement):
    # Guests placed in flat mode; the config now says nested.
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    conf = tmp_path / "agent.conf"
    try:
        done = upgrade_check(conf, "--json")
        assert done.returncode == 1, done.stdout + done.stderr
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["Store schema"]["result"] == 0
        assert checks["No move in flight"]["result"] == 0
        unhealed = checks["Healed under the configured model"]
        assert unhealed["result"] == 1
        classes = ", ".join(sorted(["MEMORY_MB", "PCPU", "VCPU", PMEM]))
        assert (f"provider_tree_mode = nested: this version's model takes {classes} "
                f"off providers where {len(consumers)} consumers hold them"
                in unhealed["details"])
        assert "'compute-agent-manage heal'" in unhealed["details"]

        table = upgrade_check(conf)
        assert table.returncode == 1
        assert "Result: Warning" in table.stdout and "Check: Store schema" in table.stdout

        assert run_heal(agent).applied
        healed = upgrade_check(conf)
        assert healed.returncode == 0, healed.stdout + healed.stderr
        assert healed.stdout.count("Result: Success") == 3
    finally:
        agent.stop()
