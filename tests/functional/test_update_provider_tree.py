"""The update_provider_tree loop against a real Placement, fake driver."""
from __future__ import annotations

import copy
import logging
import re
from dataclasses import replace
from uuid import uuid4

import requests

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from tests.functional.helpers import (
    HEADERS,
    allocate,
    make_agent,
    placement_tree,
    totals,
    unallocate,
    wait_for,
)

HOST = {
    "disk_gb": 200,
    "numa_cells": [{"id": 0, "cpus": "0-7", "memory_mb": 16384},
                   {"id": 1, "cpus": "8-15", "memory_mb": 16384}],
    "pci_devices": [{"address": "0000:3b:00.0", "vendor_id": "8086",
                     "product_id": "1572", "numa_node": 0,
                     "vfs": {"count": 8, "product_id": "154c"}}],
    "gpus": [{"address": "0000:af:00.0", "numa_node": 1,
              "mdev_types": {"nvidia-222": {"available_instances": 14},
                             "nvidia-223": {"available_instances": 8}},
              "mdevs": [{"uuid": "4b20d080-1b54-4048-85b3-a6a62d165c01",
                         "type": "nvidia-222"},
                        {"uuid": "4b20d080-1b54-4048-85b3-a6a62d165c02",
                         "type": "nvidia-222"}]}],
    "pmem_namespaces": [{"name": "ns0", "size_bytes": 2**36, "numa_node": 0},
                        {"name": "ns1", "size_bytes": 2**36, "numa_node": 1}],
}
POLICY = {
    "pci": {"device_spec": ['{"vendor_id": "8086", "product_id": "154c"}']},
    "devices": {"enabled_mdev_types": "nvidia-222"},
    "pmem": {"namespaces": "64GB:ns0|ns1"},
}


def standard_agent(tmp_path, placement, host=None):
    return make_agent(tmp_path, placement.url, host or HOST, **POLICY)


def tree_of(agent, placement):
    return placement_tree(placement.url, agent.policy.root_uuid)


def test_fake_host_appears_in_placement_as_the_nested_tree(tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()

    h = agent.policy.host
    tree = tree_of(agent, placement)
    assert {name: node["parent"] for name, node in tree.items()} == {
        h: None,
        f"{h}_numa_0": h,
        f"{h}_numa_1": h,
        f"{h}_0000:3B:00.0": f"{h}_numa_0",
        f"{h}_pci_0000_af_00_0": f"{h}_numa_1",
        f"{h}_pmem_64GB_numa_0": f"{h}_numa_0",
        f"{h}_pmem_64GB_numa_1": f"{h}_numa_1",
    }
    assert totals(tree[h]) == {"DISK_GB": 200}
    assert totals(tree[f"{h}_numa_0"]) == {"VCPU": 8, "MEMORY_MB": 16384}
    assert tree[f"{h}_numa_0"]["inventories"]["MEMORY_MB"]["reserved"] == 512
    assert tree[f"{h}_numa_0"]["inventories"]["VCPU"]["allocation_ratio"] == 4.0
    assert tree[f"{h}_numa_1"]["traits"] == {"HW_NUMA_ROOT"}
    assert totals(tree[f"{h}_0000:3B:00.0"]) == {"CUSTOM_PCI_8086_154C": 8}
    assert tree[f"{h}_0000:3B:00.0"]["traits"] == {"COMPUTE_MANAGED_PCI_DEVICE"}
    # Two existing mdevs of the enabled type plus 14 more creatable.
    assert totals(tree[f"{h}_pci_0000_af_00_0"]) == {"VGPU": 16}
    assert tree[f"{h}_pci_0000_af_00_0"]["traits"] == {"CUSTOM_MDEV_TYPE_NVIDIA_222"}
    assert totals(tree[f"{h}_pmem_64GB_numa_1"]) == {"CUSTOM_PMEM_NAMESPACE_64GB": 1}


def test_first_registration_stays_within_three_requests_a_provider(tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    mark = placement.mark()
    agent.update_provider_tree()
    sent = placement.requests_since(mark)
    providers, custom_names = 7, 2  # CUSTOM_PMEM_NAMESPACE_64GB, the mdev trait
    assert len(sent) <= 3 * providers + custom_names, sent


def test_a_cycle_with_nothing_changed_sends_one_request(tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    mark = placement.mark()
    agent.update_provider_tree()
    assert placement.requests_since(mark) == [
        f"GET /resource_providers?in_tree={agent.policy.root_uuid} 200"]


def test_one_inventory_change_sends_one_write(tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    host = copy.deepcopy(HOST)
    host["pci_devices"][0]["vfs"]["count"] = 6
    agent.driver.set_host(host)

    mark = placement.mark()
    agent.update_provider_tree()
    sent = placement.requests_since(mark)
    writes = [r for r in sent if not r.startswith("GET")]
    assert len(writes) == 1 and writes[0].startswith("PUT /resource_providers/"), sent
    assert len(sent) == 2
    pf = tree_of(agent, placement)[f"{agent.policy.host}_0000:3B:00.0"]
    assert totals(pf) == {"CUSTOM_PCI_8086_154C": 6}
    # The write's generation was learnt from its answer: back to one request.
    mark = placement.mark()
    agent.update_provider_tree()
    assert len(placement.requests_since(mark)) == 1


def test_several_inventory_changes_go_in_one_reshaper_post(tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    host = copy.deepcopy(HOST)
    host["disk_gb"] = 150
    host["pci_devices"][0]["vfs"]["count"] = 6
    host["gpus"][0]["mdev_types"]["nvidia-222"]["available_instances"] = 10
    agent.driver.set_host(host)

    mark = placement.mark()
    agent.update_provider_tree()
    sent = placement.requests_since(mark)
    assert [r for r in sent if not r.startswith("GET")] == ["POST /reshaper 204"], sent
    h = agent.policy.host
    tree = tree_of(agent, placement)
    assert totals(tree[h]) == {"DISK_GB": 150}
    assert totals(tree[f"{h}_0000:3B:00.0"]) == {"CUSTOM_PCI_8086_154C": 6}
    assert totals(tree[f"{h}_pci_0000_af_00_0"]) == {"VGPU": 12}
    # The generations were read back after the reshape: nothing to redo.
    mark = placement.mark()
    agent.update_provider_tree()
    assert len(placement.requests_since(mark)) == 1


def test_bug_a_provider_deleted_right_after_a_reshape_failed_the_cycle(
        tmp_path, placement):
    """Another writer deleted a provider between the reshaper's POST and the
    GET of the generations after it: the cycle ended in a KeyError
    traceback (found by the Placement-faults test, which deletes providers
    behind the agent's back). The provider is created again by the next
    cycle."""
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    h = agent.policy.host
    vfs = tree_of(agent, placement)[f"{h}_0000:3B:00.0"]["uuid"]
    host = copy.deepcopy(HOST)
    host["disk_gb"] = 150
    host["pci_devices"][0]["vfs"]["count"] = 6
    agent.driver.set_host(host)
    reshape = agent.sync.client.reshape

    def reshape_then_deleted(inventories):
        reshape(inventories)
        assert requests.delete(f"{placement.url}/resource_providers/{vfs}",
                               headers=HEADERS, timeout=10).status_code == 204
    agent.sync.client.reshape = reshape_then_deleted
    try:
        agent.update_provider_tree()
    finally:
        agent.sync.client.reshape = reshape
    assert f"{h}_0000:3B:00.0" not in tree_of(agent, placement)

    agent.update_provider_tree()
    tree = tree_of(agent, placement)
    assert totals(tree[f"{h}_0000:3B:00.0"]) == {"CUSTOM_PCI_8086_154C": 6}
    assert totals(tree[h]) == {"DISK_GB": 150}


def meddle_with_traits(placement, provider: dict) -> None:
    """Someone else replaces the provider's traits: the agent's go, one of
    their own comes."""
    requests.put(f"{placement.url}/traits/CUSTOM_MEDDLING", headers=HEADERS, timeout=10)
    resp = requests.put(
        f"{placement.url}/resource_providers/{provider['uuid']}/traits", headers=HEADERS,
        timeout=10, json={"resource_provider_generation": provider["generation"],
                          "traits": ["CUSTOM_MEDDLING"]})
    assert resp.status_code == 200, resp.text


def restarted(agent, tmp_path):
    """The same host's agent, stopped and started again on its state."""
    agent.stop()
    return compose(load_config(["--config-file", str(tmp_path / "agent.conf")]))


def test_a_restart_with_nothing_changed_sends_two_requests(tmp_path, placement):
    """The new process's version discovery, then the tree: every provider
    is trusted from the view the last run saved."""
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    before = tree_of(agent, placement)

    agent = restarted(agent, tmp_path)
    mark = placement.mark()
    agent.update_provider_tree()
    assert placement.requests_since(mark) == [
        "GET / 200", f"GET /resource_providers?in_tree={agent.policy.root_uuid} 200"]
    assert tree_of(agent, placement) == before
    agent.stop()


def test_a_provider_changed_while_the_agent_was_down_is_read_and_put_back(
        tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    agent.stop()
    cell = tree_of(agent, placement)[f"{agent.policy.host}_numa_0"]
    meddle_with_traits(placement, cell)

    agent = restarted(agent, tmp_path)
    mark = placement.mark()
    agent.update_provider_tree()
    sent = placement.requests_since(mark)
    # Discovery, the tree, that one provider's inventories and traits, its
    # traits put back.
    assert len(sent) == 5, sent
    assert all(cell["uuid"] in r for r in sent[2:]), sent
    assert tree_of(agent, placement)[f"{agent.policy.host}_numa_0"]["traits"] == {
        "HW_NUMA_ROOT", "CUSTOM_MEDDLING"}
    agent.stop()


def test_a_provider_gone_from_the_host_is_deleted(tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    agent.driver.set_host({**HOST, "gpus": []})
    agent.update_provider_tree()
    assert f"{agent.policy.host}_pci_0000_af_00_0" not in tree_of(agent, placement)


def test_a_provider_with_allocations_is_kept_reserved_with_a_warning(
        tmp_path, placement, caplog):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    gpu_name = f"{agent.policy.host}_pci_0000_af_00_0"
    gpu = tree_of(agent, placement)[gpu_name]
    consumer = allocate(placement.url, gpu["uuid"], {"VGPU": 1})

    agent.driver.set_host({**HOST, "gpus": []})
    with caplog.at_level(logging.WARNING):
        agent.update_provider_tree()
    kept = tree_of(agent, placement)[gpu_name]
    assert kept["inventories"]["VGPU"]["reserved"] == kept["inventories"]["VGPU"]["total"]
    assert any(gpu_name in r.getMessage() and "reserved" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)

    # Refused once and nothing moved since: no retry, one request a cycle.
    mark = placement.mark()
    agent.update_provider_tree()
    assert len(placement.requests_since(mark)) == 1

    unallocate(placement.url, consumer)
    agent.sync.kept_retry_seconds = 0  # rather than wait five minutes
    agent.update_provider_tree()
    assert gpu_name not in tree_of(agent, placement)


def test_a_trait_of_the_agent_removed_behind_its_back_is_put_back(tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    cell = tree_of(agent, placement)[f"{agent.policy.host}_numa_0"]
    meddle_with_traits(placement, cell)

    agent.update_provider_tree()
    assert tree_of(agent, placement)[f"{agent.policy.host}_numa_0"]["traits"] == {
        "HW_NUMA_ROOT", "CUSTOM_MEDDLING"}


def test_a_write_that_loses_a_race_is_rewritten_after_a_fresh_read(
        tmp_path, placement):
    agent = standard_agent(tmp_path, placement)
    agent.update_provider_tree()
    host = copy.deepcopy(HOST)
    host["numa_cells"][1]["memory_mb"] = 8192
    agent.driver.set_host(host)

    # Another writer moves the provider's generation after the agent has
    # read the tree and before its write lands.
    real_write = agent.sync.client.set_inventories

    def write_after_a_rival(uuid, generation, inventories):
        if agent.sync.client.set_inventories is write_after_a_rival:
            agent.sync.client.set_inventories = real_write
            rival = requests.put(
                f"{placement.url}/resource_providers/{uuid}/aggregates",
                headers=HEADERS, timeout=10,
                json={"resource_provider_generation": generation,
                      "aggregates": [str(uuid4())]})
            assert rival.status_code == 200, rival.text
        return real_write(uuid, generation, inventories)

    agent.sync.client.set_inventories = write_after_a_rival
    mark = placement.mark()
    outcome = agent.run_cycle()

    assert outcome.ok, outcome.reason
    writes = [r for r in placement.requests_since(mark) if r.startswith("PUT")]
    assert [w.rsplit(" ", 1)[1] for w in writes] == ["200", "409", "200"], writes
    assert totals(tree_of(agent, placement)[f"{agent.policy.host}_numa_1"]) == {
        "VCPU": 8, "MEMORY_MB": 8192}


def test_the_loop_survives_placement_going_away_and_catches_up(
        tmp_path, placement, caplog):
    agent = standard_agent(tmp_path, placement)
    agent.settings = replace(agent.settings, update_interval=0.2)
    agent.start()
    try:
        h = agent.policy.host
        wait_for(lambda: f"{h}_numa_1" in tree_of(agent, placement))
        placement.stop()
        host = copy.deepcopy(HOST)
        host["pci_devices"][0]["vfs"]["count"] = 4
        with caplog.at_level(logging.INFO):
            agent.driver.set_host(host)
            wait_for(lambda: any(f"Placement at {placement.url} did not answer"
                                 in r.getMessage() for r in caplog.records))
            assert agent._thread.is_alive()
            placement.start()
            wait_for(lambda: totals(tree_of(agent, placement)[f"{h}_0000:3B:00.0"])
                     == {"CUSTOM_PCI_8086_154C": 4})
            # The return is said at the end of the cycle that wrote the
            # change: seen after it.
            wait_for(lambda: any("is back after" in r.getMessage() for r in caplog.records))
        said = [r.getMessage() for r in caplog.records if "Placement at" in r.getMessage()]
        # Once going away, once coming back, whatever the cycles between.
        # (Refused, or closed when it stopped in the middle of a request.)
        assert len(said) == 2, said
        assert re.fullmatch(rf"Placement at {placement.url} did not answer "
                            r"\(connection (refused|closed)\)", said[0]), said
        assert said[1].startswith(f"Placement at {placement.url} is back after ")
    finally:
        if placement.proc is None:
            placement.start()
        agent.stop()
