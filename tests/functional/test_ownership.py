"""Living beside others in Placement, against a real Placement: the agent
changes only what it owns, and says what it changes."""
from __future__ import annotations

import logging

import requests

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from tests.functional.helpers import HEADERS, get, make_agent, placement_tree, write_conf

HOST = {
    "disk_gb": 100,
    "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 8192}],
    "pci_devices": [{"address": "0000:3b:00.0", "vendor_id": "8086",
                     "product_id": "1572", "numa_node": 0,
                     "vfs": {"count": 8, "product_id": "154c"}}],
    "gpus": [{"address": "0000:af:00.0", "numa_node": 0,
              "mdev_types": {"nvidia-222": {"available_instances": 4},
                             "nvidia-223": {"available_instances": 2}}}],
}
POLICY = {
    "pci": {"device_spec": ['{"vendor_id": "8086", "product_id": "154c", '
                            '"resource_class": "SRIOV_NET_VF"}']},
    "devices": {"enabled_mdev_types": "nvidia-222"},
}
TRAITS_LOGGER = "compute_agent.placement.sync"


def tree_of(agent, placement):
    return placement_tree(placement.url, agent.policy.root_uuid)


def add_traits(url: str, provider_uuid: str, *traits: str) -> None:
    """What an operator's `openstack resource provider trait set` does."""
    for t in traits:
        if t.startswith("CUSTOM_"):
            requests.put(f"{url}/traits/{t}", headers=HEADERS, timeout=10)
    doc = get(url, f"/resource_providers/{provider_uuid}/traits")
    resp = requests.put(f"{url}/resource_providers/{provider_uuid}/traits",
                        headers=HEADERS, timeout=10,
                        json={"resource_provider_generation":
                              doc["resource_provider_generation"],
                              "traits": sorted(set(doc["traits"]) | set(traits))})
    assert resp.status_code == 200, resp.text


def set_reserved(url: str, provider_uuid: str, rc: str, reserved: int) -> None:
    """What `openstack resource provider inventory set --amend` does."""
    doc = get(url, f"/resource_providers/{provider_uuid}/inventories/{rc}")
    doc["reserved"] = reserved
    resp = requests.put(f"{url}/resource_providers/{provider_uuid}/inventories/{rc}",
                        headers=HEADERS, timeout=10, json=doc)
    assert resp.status_code == 200, resp.text


def test_outside_traits_survive_ten_cycles(tmp_path, placement):
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY)
    agent.update_provider_tree()
    h = agent.policy.host
    tree = tree_of(agent, placement)
    add_traits(placement.url, agent.policy.root_uuid,
               "COMPUTE_STATUS_DISABLED", "CUSTOM_RACK_7")
    gpu = f"{h}_pci_0000_af_00_0"
    add_traits(placement.url, tree[gpu]["uuid"], "CUSTOM_OPERATOR_MARK")

    for _ in range(10):
        agent.update_provider_tree()
    tree = tree_of(agent, placement)
    assert {"COMPUTE_STATUS_DISABLED", "CUSTOM_RACK_7"} <= tree[h]["traits"]
    assert tree[gpu]["traits"] == {"CUSTOM_MDEV_TYPE_NVIDIA_222", "CUSTOM_OPERATOR_MARK"}
    agent.stop()


def restarted_with(agent, tmp_path, placement, **policy) -> Agent:
    """The same host's agent started again on a changed config."""
    agent.stop()
    write_conf(tmp_path, placement.url, agent.policy.host, HOST, **policy)
    return compose(load_config(["--config-file", str(tmp_path / "agent.conf")]))


def test_a_trait_the_agent_stops_reporting_is_removed(tmp_path, placement):
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY)
    agent.update_provider_tree()
    gpu = f"{agent.policy.host}_pci_0000_af_00_0"
    add_traits(placement.url, tree_of(agent, placement)[gpu]["uuid"], "CUSTOM_OPERATOR_MARK")

    agent = restarted_with(agent, tmp_path, placement,
                           **{**POLICY, "devices": {"enabled_mdev_types": "nvidia-223"}})
    agent.update_provider_tree()
    assert tree_of(agent, placement)[gpu]["traits"] == {"CUSTOM_MDEV_TYPE_NVIDIA_223",
                                             "CUSTOM_OPERATOR_MARK"}
    agent.stop()


def test_an_operators_reserved_on_a_device_survives_ten_cycles(tmp_path, placement):
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY)
    agent.update_provider_tree()
    pf = tree_of(agent, placement)[f"{agent.policy.host}_0000:3B:00.0"]["uuid"]
    set_reserved(placement.url, pf, "SRIOV_NET_VF", 2)

    for _ in range(10):
        agent.update_provider_tree()
    assert tree_of(agent, placement)[f"{agent.policy.host}_0000:3B:00.0"][
        "inventories"]["SRIOV_NET_VF"]["reserved"] == 2
    # What a scheduler sees: six VFs free, not eight.
    found = get(placement.url, "/allocation_candidates?resources=SRIOV_NET_VF:6"
                f"&in_tree={agent.policy.root_uuid}")
    assert found["provider_summaries"][pf]["resources"]["SRIOV_NET_VF"]["capacity"] == 6
    assert get(placement.url, "/allocation_candidates?resources=SRIOV_NET_VF:7"
               f"&in_tree={agent.policy.root_uuid}")["allocation_requests"] == []
    agent.stop()


def info_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and r.name == TRAITS_LOGGER]


def test_a_typo_in_enabled_mdev_types_logs_the_deleted_provider(
        tmp_path, placement, caplog):
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY)
    agent.update_provider_tree()
    gpu = f"{agent.policy.host}_pci_0000_af_00_0"
    gpu_uuid = tree_of(agent, placement)[gpu]["uuid"]

    # Only the idle cycle's lines: the first cycle's are captured too when
    # an earlier test on this worker left the logger at INFO.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=TRAITS_LOGGER):
        agent.update_provider_tree()
    assert info_lines(caplog) == []  # an idle cycle is silent

    agent = restarted_with(agent, tmp_path, placement,
                           **{**POLICY, "devices": {"enabled_mdev_types": "nvidia-22"}})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=TRAITS_LOGGER):
        agent.update_provider_tree()
    assert gpu not in tree_of(agent, placement)
    assert info_lines(caplog) == [f"Placement: deleted provider {gpu} ({gpu_uuid})"]
    agent.stop()


def nova_scheduler_finds(placement, root_uuid: str) -> bool:
    """nova 34's query for a 1-VCPU flavor: only hosts nova owns that are
    not disabled (root_required, microversion 1.35)."""
    found = get(placement.url, "/allocation_candidates?resources=VCPU:1"
                "&root_required=OWNER_NOVA,!COMPUTE_STATUS_DISABLED"
                f"&in_tree={root_uuid}")
    return found["allocation_requests"] != []


def test_nova_s_scheduler_finds_the_host_until_an_operator_disables_it(
        tmp_path, placement):
    agent = make_agent(tmp_path, placement.url,
                       {**HOST, "cpu_features": ["avx2", "sse4.2", "ds"]}, **POLICY)
    agent.update_provider_tree()
    root = agent.policy.root_uuid
    assert tree_of(agent, placement)[agent.policy.host]["traits"] == {
        "COMPUTE_NODE", "OWNER_NOVA", "HW_CPU_X86_AVX2", "HW_CPU_X86_SSE42"}
    assert nova_scheduler_finds(placement, root)

    add_traits(placement.url, root, "COMPUTE_STATUS_DISABLED")
    for _ in range(3):
        agent.update_provider_tree()
    assert "COMPUTE_STATUS_DISABLED" in tree_of(agent, placement)[agent.policy.host]["traits"]
    assert not nova_scheduler_finds(placement, root)
    agent.stop()


def test_a_nova_pci_alias_finds_the_vfs_by_nova_s_class_and_physnet(tmp_path, placement):
    """A flavor's pci_passthrough:alias for 8086:154c asks Placement for
    CUSTOM_PCI_8086_154C; a neutron port on physnet1 asks for its trait."""
    agent = make_agent(tmp_path, placement.url, HOST, pci={"device_spec": [
        '{"vendor_id": "8086", "product_id": "154c", "physical_network": "physnet1"}']})
    agent.update_provider_tree()
    pf = tree_of(agent, placement)[f"{agent.policy.host}_0000:3B:00.0"]["uuid"]
    found = get(placement.url, "/allocation_candidates?resources=CUSTOM_PCI_8086_154C:2"
                f"&required=CUSTOM_PHYSNET_PHYSNET1&in_tree={agent.policy.root_uuid}")
    assert [list(r["allocations"]) for r in found["allocation_requests"]] == [[pf]]
    agent.stop()
