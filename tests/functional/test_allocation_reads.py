"""Reconciliation reads a provider's allocations from a real Placement only
where they may have changed (compute_agent/placement/allocations.py), counted at the HTTP
level as Placement saw them."""
from __future__ import annotations

import time
from uuid import uuid4

import pytest
import requests

from compute_agent.cmd.common import load_config
from compute_agent.exception import ConfigError
from tests.functional.helpers import (
    HEADERS,
    allocate,
    make_agent,
    provider_uuid,
    unallocate,
    wait_for,
    write_conf,
)
from tests.functional.test_update_provider_tree import HOST, POLICY

SPEC = {"name": "vm", "vcpus": 1, "memory_mb": 512}


@pytest.fixture
def agent(tmp_path, placement):
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY,
                       DEFAULT={"allocation_refresh_interval": 3600})
    agent.run_cycle()
    agent.reconcile(at_start=True)
    yield agent
    agent.stop()


def provider(agent, placement, suffix: str) -> str:
    return provider_uuid(placement.url, f"{agent.policy.host}_{suffix}")


def allocation_reads(requests: list[str]) -> list[str]:
    return [r.split()[1].split("/")[2] for r in requests
            if r.startswith("GET /resource_providers/") and r.endswith("/allocations 200")]


def reconcile_requests(agent, placement, cycle: bool = True):
    mark = placement.mark()
    if cycle:
        agent.run_cycle()
    report = agent.reconcile(at_start=False)
    return placement.requests_since(mark), report


def unexplained(report) -> set[str]:
    return {f.subject for f in report.findings if f.kind == "allocation_without_record"}


def other_hosts_gpu(url: str) -> str:
    """A provider outside our tree that can take a VGPU."""
    rp = requests.post(f"{url}/resource_providers", headers=HEADERS, timeout=10,
                       json={"name": f"other-{uuid4()}"}).json()
    resp = requests.put(f"{url}/resource_providers/{rp['uuid']}/inventories",
                        headers=HEADERS, timeout=10,
                        json={"resource_provider_generation": rp["generation"],
                              "inventories": {"VGPU": {"total": 4}}})
    assert resp.status_code == 200, resp.text
    return rp["uuid"]


def move_allocation(url: str, consumer: str, to_provider: str) -> None:
    """What an evacuation does to the instance's allocations: one PUT that
    replaces them with others, on another host's provider."""
    current = requests.get(f"{url}/allocations/{consumer}", headers=HEADERS,
                           timeout=10).json()
    resp = requests.put(f"{url}/allocations/{consumer}", headers=HEADERS, timeout=10, json={
        "allocations": {to_provider: {"resources": {"VGPU": 1}}},
        "project_id": current["project_id"], "user_id": current["user_id"],
        "consumer_generation": current["consumer_generation"],
        "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text


def test_an_idle_cycle_with_reconciliation_sends_one_request(agent, placement):
    for _ in range(3):
        sent, _ = reconcile_requests(agent, placement)
        assert sent == [f"GET /resource_providers?in_tree={agent.policy.root_uuid} 200"]


def test_an_idle_loop_reconciling_every_cycle_only_reads_the_tree(tmp_path, placement):
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY,
                       DEFAULT={"reconcile_interval": 1})
    agent.start()  # the first cycle and reconciliation, before the loop
    try:
        idle = placement.mark()
        # Three cycles of one second, each reconciling.
        wait_for(lambda: len(placement.requests_since(idle)) >= 3, timeout=30)
    finally:
        agent.stop()
    sent = placement.requests_since(idle)
    assert set(sent) == {f"GET /resource_providers?in_tree={agent.policy.root_uuid} 200"}


def test_a_local_build_makes_the_next_reconcile_read_its_provider_only(agent, placement):
    """The conductor writes the allocation after the cycle read the tree and
    just before it asks us to build: the generation the reconcile knows has
    not moved, the claim is what says the provider changed."""
    pf = provider(agent, placement, "0000:3B:00.0")
    agent.run_cycle()
    instance = allocate(placement.url, pf, {"CUSTOM_PCI_8086_154C": 1})
    agent.manager.build_instance(instance, SPEC, {pf: {"resources": {"CUSTOM_PCI_8086_154C": 1}}})

    sent, report = reconcile_requests(agent, placement, cycle=False)
    assert allocation_reads(sent) == [pf]
    assert report.consistent, report.findings


def test_a_local_release_makes_the_next_reconcile_read_its_provider_only(agent, placement):
    pf = provider(agent, placement, "0000:3B:00.0")
    instance = allocate(placement.url, pf, {"CUSTOM_PCI_8086_154C": 1})
    agent.manager.build_instance(instance, SPEC, {pf: {"resources": {"CUSTOM_PCI_8086_154C": 1}}})
    reconcile_requests(agent, placement)

    # Deleting allocations leaves the provider's generation where it was.
    unallocate(placement.url, instance)
    agent.manager.delete_instance(instance)
    sent, _ = reconcile_requests(agent, placement)
    assert allocation_reads(sent) == [pf]


def test_an_allocation_written_behind_the_agents_back_is_read_at_the_next_reconcile(
        agent, placement):
    gpu = provider(agent, placement, "pci_0000_af_00_0")
    stranger = allocate(placement.url, gpu, {"VGPU": 1})

    sent, report = reconcile_requests(agent, placement)
    assert allocation_reads(sent) == [gpu]
    assert unexplained(report) == {stranger}


def test_a_reconcile_after_failed_cycles_reads_the_tree_itself(agent, placement):
    """No cycle read the tree since the last reconcile: the generations it
    used then would hide a change, so it reads the tree again."""
    gpu = provider(agent, placement, "pci_0000_af_00_0")
    stranger = allocate(placement.url, gpu, {"VGPU": 1})

    sent, report = reconcile_requests(agent, placement, cycle=False)
    assert sent[0] == f"GET /resource_providers?in_tree={agent.policy.root_uuid} 200"
    assert allocation_reads(sent) == [gpu]
    assert unexplained(report) == {stranger}


def test_an_allocation_moved_off_our_provider_is_seen_within_the_refresh_interval(
        tmp_path, placement):
    """Placement moves neither generation of the provider an allocation is
    deleted from nor of the one a consumer moves off (an evacuation): only
    the refresh interval bounds how long the agent still sees them."""
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY,
                       DEFAULT={"allocation_refresh_interval": 4})
    try:
        agent.run_cycle()
        gpu = provider(agent, placement, "pci_0000_af_00_0")
        deleted = allocate(placement.url, gpu, {"VGPU": 1})
        moved = allocate(placement.url, gpu, {"VGPU": 1})
        agent.run_cycle()
        agent.reconcile(at_start=True)
        read_at = time.monotonic()

        unallocate(placement.url, deleted)
        move_allocation(placement.url, moved, other_hosts_gpu(placement.url))

        sent, report = reconcile_requests(agent, placement)
        assert allocation_reads(sent) == []
        assert unexplained(report) == {deleted, moved}  # not yet: within the bound

        # The bound passes: what is read by age is due only once it has.
        time.sleep(max(0.0, read_at + 4 - time.monotonic()))
        sent, report = reconcile_requests(agent, placement)
        # The provider that held them, once; those read empty are not read
        # again by age (whatever is written on them moves their generation).
        assert allocation_reads(sent) == [gpu]
        assert unexplained(report) == set()
    finally:
        agent.stop()


def test_sighup_reads_every_providers_allocations_again(agent, placement):
    agent.drop_cache()
    sent, _ = reconcile_requests(agent, placement)
    assert len(allocation_reads(sent)) == 7


def test_a_refresh_interval_of_zero_reads_every_provider_at_every_reconcile(
        tmp_path, placement):
    agent = make_agent(tmp_path, placement.url, HOST, **POLICY,
                       DEFAULT={"allocation_refresh_interval": 0})
    try:
        agent.run_cycle()
        agent.reconcile(at_start=True)
        sent, _ = reconcile_requests(agent, placement)
        assert len(allocation_reads(sent)) == 7
    finally:
        agent.stop()


def test_a_negative_refresh_interval_is_refused_in_one_line(tmp_path, placement):
    path = write_conf(tmp_path, placement.url, "h", None,
                      DEFAULT={"allocation_refresh_interval": -1})
    with pytest.raises(ConfigError) as e:
        load_config(["--config-file", str(path)])
    assert str(e.value).startswith("[DEFAULT] allocation_refresh_interval: ")
    assert "(value: '-1')" in str(e.value)
