"""``compute-agent-manage tree`` against a real Placement (fake driver),
beside an agent that holds its state directory and store: in step, an
inventory edited behind the agent's back, a host left unhealed by a switch
from flat to nested under guests, and a Placement that does not answer."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import requests

from compute_agent.store import lock
from tests.functional.helpers import HEADERS, get
from tests.functional.test_heal import GUESTS, PMEM, agent_in_mode, flat_host_with_guests


def manage_tree(conf: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "compute_agent.cmd.manage", "--config-file", str(conf), "tree",
         *args], capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)


def shown(done: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def test_in_step_then_an_inventory_edited_behind_the_agents_back(tmp_path, placement):
    host = f"tree-{uuid.uuid4().hex[:8]}"
    agent = agent_in_mode(tmp_path, placement, host, "nested")
    conf = tmp_path / "agent.conf"
    # As a running agent holds it: the command needs no lock.
    held = lock.acquire(str(tmp_path / "state"))
    try:
        agent.update_provider_tree()
        mark = placement.mark()
        done = manage_tree(conf, "--json")
        assert done.returncode == 0, done.stderr
        doc = shown(done)
        assert doc["in_step"] and doc["differences"] == [] and doc["unhealed"] == []
        names = {p["name"]: p for p in doc["placement"]}
        assert {p["name"] for p in doc["discovered"]} == set(names)
        cell = names[f"{host}_numa_1"]
        assert cell["parent_provider_uuid"] == names[host]["uuid"]
        assert cell["inventories"]["VCPU"]["allocation_ratio"] == 4.0
        assert "reserved" in cell["inventories"]["VCPU"]
        # It only reads.
        assert all(r.startswith("GET ") for r in placement.requests_since(mark))

        # Someone else raises the cell's VCPU overcommit in Placement.
        inventories = get(placement.url,
                          f"/resource_providers/{cell['uuid']}/inventories")
        inventories["inventories"]["VCPU"]["allocation_ratio"] = 16.0
        requests.put(f"{placement.url}/resource_providers/{cell['uuid']}/inventories",
                     json=inventories, headers=HEADERS, timeout=10).raise_for_status()
        done = manage_tree(conf, "--json")
        assert done.returncode == 1, done.stderr
        (difference,) = shown(done)["differences"]
        assert difference["name"] == f"{host}_numa_1"
        assert difference["inventories"]["VCPU"]["fields"] == {
            "allocation_ratio": {"placement": 16.0, "discovered": 4.0}}
        human = manage_tree(conf)
        assert human.returncode == 1, human.stderr
        assert (f"{host}_numa_1 [{cell['uuid']}]: inventory VCPU allocation_ratio "
                "16.0 -> 4.0") in human.stdout
        assert human.stdout.splitlines()[-1] == "1 providers differ; unhealed for no class"
    finally:
        held.release()
        agent.stop()


def test_an_unhealed_host_shows_each_class_with_its_consumers(tmp_path, placement):
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    try:
        agent.update_provider_tree()  # nested now, the cells held reserved
        done = manage_tree(tmp_path / "agent.conf", "--json")
        assert done.returncode == 1, done.stderr
        doc = shown(done)
        assert doc["differences"] == []
        # CPU and memory stay on the root, the namespace on the provider
        # of both cells' namespaces, until heal moves them to the cells'.
        where = {u["resource_class"]: u["resource_provider_name"] for u in doc["unhealed"]}
        h = agent.policy.host
        assert where == {"VCPU": h, "PCPU": h, "MEMORY_MB": h, PMEM: f"{h}_pmem_SMALL"}
        holders = {u["resource_class"]: {c["consumer_uuid"]: (c["amount"], c["instance_name"])
                                         for c in u["consumers"]} for u in doc["unhealed"]}
        for rc in where:
            assert holders[rc] == {c: (g[rc], f"guest{i}") for i, (c, g)
                                   in enumerate(zip(consumers, GUESTS)) if rc in g}, rc
        human = manage_tree(tmp_path / "agent.conf")
        assert human.returncode == 1
        assert f"        {consumers[3]} 2 (guest3)" in human.stdout.splitlines()
        assert human.stdout.splitlines()[-1] == (
            f"0 providers differ; unhealed for {PMEM}, MEMORY_MB, PCPU, VCPU")
    finally:
        agent.stop()


def test_a_closed_pipe_ends_quietly_and_an_unreachable_placement_is_unknown(
        tmp_path, placement):
    agent, _ = flat_host_with_guests(tmp_path, placement)
    agent.stop()
    conf = tmp_path / "agent.conf"
    reader = subprocess.Popen(
        [sys.executable, "-m", "compute_agent.cmd.manage", "--config-file", str(conf), "tree",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL)
    reader.stdout.close()  # as `| head -1` does once it has its line
    _, err = reader.communicate(timeout=60)
    assert reader.returncode == 1 and err == b"", err.decode()

    conf.write_text(conf.read_text().replace(placement.url, "http://127.0.0.1:9"))
    done = manage_tree(conf, "--json")
    assert done.returncode == 2
    (line,) = done.stdout.splitlines()  # with --json, the error is JSON too
    error = json.loads(line)
    assert error["exit_code"] == 2 and "Placement" in error["error"], error
    assert error["error"].startswith("Placement at http://127.0.0.1:9 did not answer"), error
