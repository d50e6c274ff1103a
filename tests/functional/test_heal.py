"""Reserved until healed, and heal, against a real Placement (fake driver).

A host runs in flat mode with guests holding VCPU, PCPU and MEMORY_MB on
the root, then switches to nested: the cells must come up fully reserved
while the root keeps its inventory, the capacity offered must never exceed
the host's, and heal must move every allocation to the cells in one
reshape.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.heal.errors import HealRefused
from compute_agent.heal.run import run_heal
from tests.functional.helpers import (
    HEADERS,
    assert_never_more_than_physical,
    get,
    offered,
    placement_tree,
    put_allocations,
    used,
    wait_for,
    write_conf,
)

HOST = {
    "disk_gb": 100,
    "numa_cells": [{"id": 0, "cpus": "0-7", "memory_mb": 16384},
                   {"id": 1, "cpus": "8-15", "memory_mb": 16384}],
    "pmem_namespaces": [{"name": "ns0", "size_bytes": 2**30, "numa_node": 0},
                        {"name": "ns1", "size_bytes": 2**30, "numa_node": 1}],
}
POLICY = {"pmem": {"namespaces": "SMALL:ns0|ns1"}}
PMEM = "CUSTOM_PMEM_NAMESPACE_SMALL"
# Shared CPUs 0-11 at 4.0; CPUs 12-15 (cell 1) pinned; memory less the
# 512 MB the host keeps; both namespaces.
PHYSICAL = {"VCPU": 48, "PCPU": 4, "MEMORY_MB": 32768 - 512, "DISK_GB": 100, PMEM: 2}
# (vcpus or pinned, memory) of each guest, held on the root in flat mode.
GUESTS = [{"VCPU": 2, "MEMORY_MB": 4096}, {"VCPU": 4, "MEMORY_MB": 8192},
          {"VCPU": 1, "MEMORY_MB": 2048}, {"PCPU": 2, "MEMORY_MB": 2048, PMEM: 1}]


def agent_in_mode(directory: Path, placement, host: str, mode: str) -> Agent:
    path = write_conf(directory, placement.url, host, HOST,
                      compute={"provider_tree_mode": mode, "cpu_dedicated_set": "12-15",
                               "cpu_shared_set": "0-11"},
                      **POLICY)
    return compose(load_config(["--config-file", str(path)]))


def flat_host_with_guests(directory: Path, placement) -> tuple[Agent, list[str]]:
    """A flat host whose guests hold their resources on the root, as nova's
    scheduler allocated them, with the devices its claims chose; then the
    same host's agent restarted in nested mode (not yet cycled)."""
    host = f"heal-{uuid.uuid4().hex[:8]}"
    agent = agent_in_mode(directory, placement, host, "flat")
    agent.update_provider_tree()
    tree = placement_tree(placement.url, agent.policy.root_uuid)
    root = agent.policy.root_uuid
    pmem = tree[f"{host}_pmem_SMALL"]["uuid"]
    consumers = []
    for i, guest in enumerate(GUESTS):
        # In guest order: the even rule takes instances in UUID order, so
        # two such hosts heal alike.
        consumer = str(uuid.UUID(f"{i:08x}" + uuid.uuid4().hex[8:]))
        allocations = {root: {"resources": {rc: n for rc, n in guest.items()
                                            if rc != PMEM}}}
        if PMEM in guest:
            allocations[pmem] = {"resources": {PMEM: guest[PMEM]}}
        put_allocations(placement.url, consumer, allocations)
        agent.manager.tracker.claim_build(
            consumer, {"name": f"guest{i}", "vcpus": guest.get("VCPU", 0)
                       or guest["PCPU"], "memory_mb": guest["MEMORY_MB"]}, allocations)
        agent.manager.tracker.complete(consumer)
        consumers.append(consumer)
    agent.stop()
    return agent_in_mode(directory, placement, host, "nested"), consumers


def allocations_by_name(url: str, consumer: str, names: dict[str, str]) -> dict:
    doc = get(url, f"/allocations/{consumer}")["allocations"]
    return {names[rp]: body["resources"] for rp, body in doc.items()}


def end_state(agent: Agent, url: str) -> dict:
    """The tree's inventories, with the host's name left out, so that two
    hosts compare."""
    host = agent.policy.host
    return {name.replace(host, "HOST"): node["inventories"]
            for name, node in placement_tree(url, agent.policy.root_uuid).items()}


def test_switching_to_nested_under_guests_reserves_the_cells_until_healed(
        tmp_path, placement):
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    root = agent.policy.root_uuid
    assert_never_more_than_physical(placement.url, root, PHYSICAL)

    agent.update_provider_tree()
    h = agent.policy.host
    tree = placement_tree(placement.url, root)
    for cell in (f"{h}_numa_0", f"{h}_numa_1"):
        for rc, record in tree[cell]["inventories"].items():
            assert record["reserved"] == record["total"], (cell, rc, record)
    assert set(tree[h]["inventories"]) == {"VCPU", "PCPU", "MEMORY_MB", "DISK_GB"}
    assert_never_more_than_physical(placement.url, root, PHYSICAL)
    # Steady while unhealed: one request a cycle, nothing written.
    mark = placement.mark()
    agent.update_provider_tree()
    assert placement.requests_since(mark) == [
        f"GET /resource_providers?in_tree={root} 200"]
    agent.stop()


def test_heal_moves_every_allocation_to_its_cell_in_one_reshape(tmp_path, placement):
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    root = agent.policy.root_uuid
    agent.update_provider_tree()

    mark = placement.mark()
    result = run_heal(agent)
    writes = [r for r in placement.requests_since(mark) if not r.startswith("GET")]
    assert result.applied
    assert writes[0] == "POST /reshaper 204", writes
    # The cleanup cycle deletes nothing else here: the root stays, cells stay.
    assert all(not w.startswith("POST /reshaper") for w in writes[1:]), writes

    h = agent.policy.host
    tree = placement_tree(placement.url, root)
    names = {node["uuid"]: name for name, node in tree.items()}
    assert set(tree[h]["inventories"]) == {"DISK_GB"}
    assert tree[f"{h}_numa_0"]["inventories"]["MEMORY_MB"]["reserved"] == 512
    assert tree[f"{h}_numa_1"]["inventories"]["VCPU"]["reserved"] == 0
    assert offered(placement.url, root) == PHYSICAL
    assert used(placement.url, root) == {"VCPU": 7, "PCPU": 2, "MEMORY_MB": 16384,
                                         PMEM: 1}
    for consumer, guest in zip(consumers, GUESTS):
        held = allocations_by_name(placement.url, consumer, names)
        assert h not in held, held
        assert {rc: n for res in held.values() for rc, n in res.items()} == guest
    # The pinned guest's CPUs are on cell 1, and its memory with them.
    pinned = allocations_by_name(placement.url, consumers[3], names)
    assert pinned[f"{h}_numa_1"] == {"PCPU": 2, "MEMORY_MB": 2048}
    assert_never_more_than_physical(placement.url, root, PHYSICAL)

    mark = placement.mark()
    again = run_heal(agent)
    assert not again.applied and again.plan.empty
    assert [r for r in placement.requests_since(mark) if not r.startswith("GET")] == []
    agent.stop()


def placement_dump(url: str, agent: Agent, consumers: list[str]) -> dict:
    return {"tree": placement_tree(url, agent.policy.root_uuid),
            "allocations": {c: get(url, f"/allocations/{c}") for c in consumers}}


def test_heal_refuses_an_allocation_that_maps_to_no_device(tmp_path, placement):
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    agent.update_provider_tree()
    # A guest the store knows nothing of holds a namespace of the flat
    # provider: which of the two cells' namespaces is it?
    h = agent.policy.host
    tree = placement_tree(placement.url, agent.policy.root_uuid)
    stranger = str(uuid.uuid4())
    put_allocations(placement.url, stranger,
                    {tree[f"{h}_pmem_SMALL"]["uuid"]: {"resources": {PMEM: 1}}})
    agent.update_provider_tree()
    before = placement_dump(placement.url, agent, consumers + [stranger])

    with pytest.raises(HealRefused) as refused:
        run_heal(agent)
    assert refused.value.consumer_uuid == stranger
    assert PMEM in str(refused.value)
    assert placement_dump(placement.url, agent, consumers + [stranger]) == before
    agent.stop()


def test_heal_converges_when_a_generation_moves_behind_its_back(tmp_path, placement):
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    agent.update_provider_tree()
    cell = placement_tree(placement.url, agent.policy.root_uuid)[
        f"{agent.policy.host}_numa_0"]
    real = agent.sync.client.reshape
    calls = []

    def rival_first(inventories, allocations=None):
        if not allocations:  # an update cycle's, not heal's
            return real(inventories)
        if not calls:  # another writer touches a cell just before
            requests.put(f"{placement.url}/resource_providers/{cell['uuid']}/traits",
                         headers=HEADERS, timeout=10,
                         json={"resource_provider_generation": cell["generation"],
                               "traits": ["HW_NUMA_ROOT", "COMPUTE_STATUS_DISABLED"]}
                         ).raise_for_status()
        calls.append(1)
        return real(inventories, allocations)

    agent.sync.client.reshape = rival_first
    result = run_heal(agent)
    assert result.applied and result.attempts == 2
    assert len(calls) == 2
    assert offered(placement.url, agent.policy.root_uuid) == PHYSICAL
    agent.stop()


class Killed(BaseException):
    """The process dies here."""


def store_rows(agent: Agent, url: str) -> list[tuple]:
    """The store's live assignments by guest name and provider name (the
    host's name left out), so that two hosts compare."""
    host = agent.policy.host
    names = {node["uuid"]: name.replace(host, "HOST")
             for name, node in placement_tree(url, agent.policy.root_uuid).items()}
    instances, rows, _ = agent.manager.tracker.snapshot()
    return sorted((instances[a.instance_uuid]["name"], a.resource_class,
                   names.get(a.provider_uuid, f"not in the tree: {a.provider_uuid}"),
                   a.kind.value, a.device_id, a.amount) for a in rows)


def assert_store_follows_placement(agent: Agent, url: str) -> None:
    """Every live row names a provider and class that hold its consumer's
    allocation, and no more than that allocation's amount."""
    _, rows, _ = agent.manager.tracker.snapshot()
    held: dict[tuple[str, str, str], int] = {}
    for a in rows:
        key = (a.consumer_uuid, a.provider_uuid, a.resource_class)
        held[key] = held.get(key, 0) + a.amount
    for (consumer, rp, rc), amount in held.items():
        doc = get(url, f"/allocations/{consumer}")["allocations"]
        assert 0 < amount <= doc.get(rp, {}).get("resources", {}).get(rc, 0), (
            consumer, rp, rc, amount, doc)


def healed_reference(directory: Path, placement) -> tuple[dict, list[tuple]]:
    """The tree and store rows an uninterrupted heal ends with."""
    reference, _ = flat_host_with_guests(directory, placement)
    run_heal(reference)
    expected = end_state(reference, placement.url), store_rows(reference, placement.url)
    reference.stop()
    return expected


def test_heal_moves_the_store_rows_with_the_allocations(tmp_path, placement):
    agent, _ = flat_host_with_guests(tmp_path, placement)
    result = run_heal(agent)
    # VCPU of three guests, memory of four, two pinned CPUs (a row each)
    # and a namespace: 10 rows, in one transaction.
    assert len(result.store.moved) == 10 and result.store.unaligned == []
    assert_store_follows_placement(agent, placement.url)
    rows = store_rows(agent, placement.url)
    assert {where for _, _, where, *_ in rows} == {
        "HOST_numa_0", "HOST_numa_1", "HOST_pmem_SMALL_numa_0"}, rows
    # The pinned guest: CPUs and memory on cell 1, the namespace its claim
    # chose (ns0) on cell 0's pmem provider.
    assert [r[1:] for r in rows if r[0] == "guest3"] == [
        (PMEM, "HOST_pmem_SMALL_numa_0", "pmem", "ns0", 1),
        ("MEMORY_MB", "HOST_numa_1", "numa", "1", 2048),
        ("PCPU", "HOST_numa_1", "pcpu", "12", 1), ("PCPU", "HOST_numa_1", "pcpu", "13", 1)]
    agent.stop()


@pytest.mark.parametrize("when", ["before", "after"])
def test_heal_killed_around_the_reshaper_and_run_again_ends_the_same(
        tmp_path, placement, when):
    expected_tree, expected_rows = healed_reference(tmp_path / "ref", placement)

    agent, consumers = flat_host_with_guests(tmp_path / "killed", placement)
    planned = run_heal(agent, dry_run=True).plan
    real = agent.sync.client.reshape

    def dies(inventories, allocations=None):
        if not allocations:  # an update cycle's, not heal's
            return real(inventories)
        if when == "after":
            real(inventories, allocations)
        raise Killed()

    agent.sync.client.reshape = dies
    with pytest.raises(Killed):
        run_heal(agent)
    assert_never_more_than_physical(placement.url, agent.policy.root_uuid, PHYSICAL)
    agent.stop()

    again = compose(load_config(
        ["--config-file", str(tmp_path / "killed" / "agent.conf")]))
    run_heal(again)
    assert end_state(again, placement.url) == expected_tree
    assert store_rows(again, placement.url) == expected_rows
    for consumer in consumers:
        held = get(placement.url, f"/allocations/{consumer}")["allocations"]
        assert {rp: body["resources"] for rp, body in held.items()} == \
            planned.consumers[consumer].allocations
    again.stop()


def killed_after_the_reshaper(directory: Path, placement) -> Agent:
    """A host whose heal died right after Placement took its reshape,
    before the store was written; its agent restarted (not started)."""
    agent, _ = flat_host_with_guests(directory, placement)
    real = agent.sync.client.reshape

    def dies(inventories, allocations=None):
        real(inventories, allocations)
        if allocations:
            raise Killed()

    agent.sync.client.reshape = dies
    with pytest.raises(Killed):
        run_heal(agent)
    agent.stop()
    return compose(load_config(["--config-file", str(directory / "agent.conf")]))


def test_a_heal_killed_after_the_reshaper_leaves_the_store_to_the_next_heal(
        tmp_path, placement):
    _, expected_rows = healed_reference(tmp_path / "ref", placement)
    again = killed_after_the_reshaper(tmp_path / "killed", placement)
    # The rows still name the root: Placement moved, the store did not.
    assert any(where == "HOST" and rc == "VCPU"
               for _, rc, where, *_ in store_rows(again, placement.url))
    mark = placement.mark()
    result = run_heal(again)
    assert result.plan.empty and not result.applied
    assert len(result.store.moved) == 10 and result.store.unaligned == []
    # Placement is not written again: only the cycle heal starts with
    # deletes the flat pmem provider the killed heal's last cycle would have.
    assert [r.split("/")[0] for r in placement.requests_since(mark)
            if not r.startswith("GET")] == ["DELETE "]
    assert store_rows(again, placement.url) == expected_rows
    # Aligned, a third heal reads no allocations for the store.
    mark = placement.mark()
    assert run_heal(again).store.moved == []
    assert not any("/allocations" in r for r in placement.requests_since(mark))
    again.stop()


def test_a_heal_killed_after_the_reshaper_leaves_the_store_to_the_next_start(
        tmp_path, placement):
    _, expected_rows = healed_reference(tmp_path / "ref", placement)
    again = killed_after_the_reshaper(tmp_path / "killed", placement)
    again.start()
    try:
        assert store_rows(again, placement.url) == expected_rows
    finally:
        again.stop()


def test_after_heal_the_next_mode_switches_are_planned_from_the_store(
        tmp_path, placement):
    """flat -> nested -> heal -> flat -> heal -> nested -> heal: the last
    heal finds each namespace and pinned CPU through rows the earlier heals
    moved (the flat pmem provider's namespace could be either cell's)."""
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    host = agent.policy.host
    assert run_heal(agent).applied
    assert_store_follows_placement(agent, placement.url)
    first = store_rows(agent, placement.url)
    agent.stop()
    for mode in ("flat", "nested"):
        agent = agent_in_mode(tmp_path, placement, host, mode)
        agent.update_provider_tree()
        result = run_heal(agent)
        assert result.applied and result.store.unaligned == []
        assert_store_follows_placement(agent, placement.url)
        assert_never_more_than_physical(placement.url, agent.policy.root_uuid, PHYSICAL)
        if mode == "flat":
            assert {where for _, _, where, *_ in store_rows(agent, placement.url)} \
                == {"HOST", "HOST_pmem_SMALL"}
        agent.stop()
    again = agent_in_mode(tmp_path, placement, host, "nested")
    assert store_rows(again, placement.url) == first
    assert offered(placement.url, again.policy.root_uuid) == PHYSICAL
    again.stop()


def manage(conf: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "compute-agent-manage"),
                           "--config-file", str(conf), "heal", *args],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_heal_command_dry_run_changes_nothing_and_yes_heals_once(tmp_path, placement):
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    agent.update_provider_tree()
    agent.stop()
    conf = tmp_path / "agent.conf"
    before = placement_dump(placement.url, agent, consumers)

    dry = manage(conf, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    # VCPU of three guests, memory of four, one PCPU and one namespace.
    assert len(plan["moves"]) == 9
    assert sorted(plan["consumers"]) == sorted(consumers)
    assert placement_dump(placement.url, agent, consumers) == before

    done = manage(conf, "--yes")
    assert done.returncode == 0, done.stderr
    assert "healed: 9 allocations of 4 consumers" in done.stderr
    assert offered(placement.url, agent.policy.root_uuid) == PHYSICAL

    again = manage(conf, "--yes")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "nothing to heal"


def test_heal_dry_run_on_a_healed_host_says_nothing_to_heal(tmp_path, placement):
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    agent.update_provider_tree()
    run_heal(agent)
    agent.stop()

    dry = manage(tmp_path / "agent.conf", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert (dry.stdout, dry.stderr) == ("nothing to heal\n", "")


def test_heal_dry_run_plans_beside_a_running_agent_whose_store_stays_locked(
        tmp_path, placement):
    """A dry run only reads: it runs beside the agent, reading the store
    read-only; a real heal is still refused there (exit 2)."""
    agent, consumers = flat_host_with_guests(tmp_path, placement)
    agent.stop()
    conf = tmp_path / "agent.conf"
    log = tmp_path / "agent.log"
    daemon = subprocess.Popen([str(Path(sys.executable).parent / "compute-agent"),
                               "--config-file", str(conf)],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "compute-agent running as host" in log.read_text(), 60)
        before = placement_dump(placement.url, agent, consumers)

        dry = manage(conf, "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        assert len(json.loads(dry.stdout)["moves"]) == 9
        assert placement_dump(placement.url, agent, consumers) == before

        refused = manage(conf, "--yes")
        assert refused.returncode == 2
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        assert placement_dump(placement.url, agent, consumers) == before
        assert daemon.poll() is None
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
