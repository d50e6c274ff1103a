"""agent/metrics.py: what the recording calls leave in the registry (the
endpoint is scraped in tests/functional/test_metrics.py)."""
from __future__ import annotations

import pytest

from agent.exception import ClaimFailed, InvalidRequest
from agent.metrics import Metrics, parse_listen, probe_response
from agent.store.errors import StoreError


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


def test_a_probe_answers_its_status_and_its_reason_on_one_line():
    status, headers, body = probe_response((503, "stopping:\n  store closed"))
    assert status == "503 Service Unavailable"
    assert dict(headers) == {"Content-Type": "text/plain; charset=utf-8",
                             "Content-Length": str(len(body))}
    assert body == b"stopping: store closed\n"
    assert probe_response((200, "ready"))[::2] == ("200 OK", b"ready\n")
