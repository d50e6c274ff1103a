"""compute_agent/metrics.py: what the recording calls leave in the registry (the
endpoint is scraped in tests/functional/test_metrics.py)."""
from __future__ import annotations

import pytest

from compute_agent.exception import ClaimFailed, InvalidRequest
from compute_agent.metrics import Metrics, ProviderCapacity, parse_listen, probe_response, provider_capacity
from compute_agent.store.errors import StoreError
from compute_agent.tree.provider_tree import Provider


def series(metrics: Metrics, name: str) -> dict[frozenset, float]:
    return {frozenset(s.labels.items()): s.value
            for family in metrics.registry.collect() for s in family.samples
            if s.name == name}


def test_a_device_shows_each_reason_it_is_out_and_nothing_once_healthy():
    m = Metrics()
    m.set_device_health("0000:3b:00.0", ["config_space_unreadable", "aer_fatal"])
    m.set_device_health("0000:3b:00.1", ["link_down"])
    m.set_device_health("0000:3b:00.0", ["aer_fatal"])
    assert series(m, "compute_agent_device_unhealthy") == {
        frozenset({"device": "0000:3b:00.0", "reason": "aer_fatal"}.items()): 1,
        frozenset({"device": "0000:3b:00.1", "reason": "link_down"}.items()): 1}
    m.set_device_health("0000:3b:00.0", [])
    assert list(series(m, "compute_agent_device_unhealthy")) == [
        frozenset({"device": "0000:3b:00.1", "reason": "link_down"}.items())]


@pytest.mark.parametrize("error,result", [
    (ClaimFailed("rp", "VGPU", 2, 1), "no_capacity"),
    (InvalidRequest("allocations", {}, "must be a non-empty object"), "invalid"),
    (StoreError("store: commit failed"), "store_failed"),
    (KeyError("bug"), "error"),
])
def test_a_refused_claim_is_counted_by_its_error_and_raised(error, result):
    m = Metrics()
    with pytest.raises(type(error)):
        with m.claim("resize"):
            raise error
    counts = series(m, "compute_agent_claims_total")
    assert counts[frozenset({"kind": "resize", "result": result}.items())] == 1
    assert sum(counts.values()) == 1


def test_assignments_are_read_when_scraped_not_before():
    m = Metrics()
    held = {}
    m.watch_assignments(lambda: held)
    held[("VGPU", "claiming")] = 1
    assert series(m, "compute_agent_assigned") == {
        frozenset({"resource_class": "VGPU", "state": "claiming"}.items()): 1}


def test_an_ipv6_address_is_given_without_its_brackets():
    assert parse_listen("[::1]:9180") == ("::1", 9180)
    assert parse_listen("localhost:80") == ("localhost", 80)


def test_capacity_is_each_inventory_with_used_only_where_allocations_were_read():
    pool = Provider("u-pool", "h_0000:3B:00.0", "u-cell", inventories={
        "SRIOV_NET_VF": {"total": 8, "reserved": 1}})
    cell = Provider("u-cell", "h_numa_0", inventories={
        "VCPU": {"total": 4, "reserved": 0}, "MEMORY_MB": {"total": 4096, "reserved": 512}})
    assert provider_capacity([cell, pool], {"u-pool": {"SRIOV_NET_VF": 3}}) == [
        ProviderCapacity("h_numa_0", "u-cell", "MEMORY_MB", 4096, 512, None),
        ProviderCapacity("h_numa_0", "u-cell", "VCPU", 4, 0, None),
        ProviderCapacity("h_0000:3B:00.0", "u-pool", "SRIOV_NET_VF", 8, 1, 3)]


def test_capacity_is_read_when_scraped_and_a_gone_provider_has_no_series():
    m = Metrics()
    rows = [ProviderCapacity("h_gpu", "u-gpu", "VGPU", 4, 0, 1),
            ProviderCapacity("h_pf", "u-pf", "SRIOV_NET_VF", 8, 2, None)]
    m.watch_capacity(lambda: rows)
    gpu = frozenset({"provider": "h_gpu", "provider_uuid": "u-gpu",
                     "resource_class": "VGPU"}.items())
    pf = frozenset({"provider": "h_pf", "provider_uuid": "u-pf",
                    "resource_class": "SRIOV_NET_VF"}.items())
    assert series(m, "compute_agent_provider_total") == {gpu: 4, pf: 8}
    assert series(m, "compute_agent_provider_reserved") == {gpu: 0, pf: 2}
    assert series(m, "compute_agent_provider_used") == {gpu: 1}  # unknown: no series
    rows.pop(0)
    assert series(m, "compute_agent_provider_total") == {pf: 8}
    assert series(m, "compute_agent_provider_used") == {}


def test_a_probe_answers_its_status_and_its_reason_on_one_line():
    status, headers, body = probe_response((503, "stopping:\n  store closed"))
    assert status == "503 Service Unavailable"
    assert dict(headers) == {"Content-Type": "text/plain; charset=utf-8",
                             "Content-Length": str(len(body))}
    assert body == b"stopping: store closed\n"
    assert probe_response((200, "ready"))[::2] == ("200 OK", b"ready\n")
