"""The fault proxy itself, seen by a plain HTTP client in front of a real
Placement: each fault does what it says, and only it."""
from __future__ import annotations

import time
import uuid

import pytest
import requests

from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault
from tests.functional.helpers import HEADERS


@pytest.fixture
def proxy(placement):
    with FaultProxy(placement.url, seed=1, delay=0.4) as p:
        yield p


def put_trait(url: str, name: str, timeout: float = 10) -> requests.Response:
    return requests.put(f"{url}/traits/{name}", headers=HEADERS, timeout=timeout)


def trait_exists(placement, name: str) -> bool:
    return requests.get(f"{placement.url}/traits/{name}", headers=HEADERS,
                        timeout=10).status_code == 204


def new_trait() -> str:
    return f"CUSTOM_PROXY_{uuid.uuid4().hex[:12].upper()}"


def test_without_faults_the_answer_is_placements(proxy, placement):
    name = new_trait()
    assert put_trait(proxy.url, name).status_code == 201
    direct = requests.get(f"{placement.url}/traits?name=in:{name}", headers=HEADERS).json()
    through = requests.get(f"{proxy.url}/traits?name=in:{name}", headers=HEADERS).json()
    assert through == direct == {"traits": [name]}
    assert proxy.total_injected == 0 and proxy.requests == 2


def test_a_conflict_is_placements_error_and_placement_never_sees_it(proxy, placement):
    proxy.set_rates({PlacementFault.CONFLICT: 1})
    mark, name = placement.mark(), new_trait()
    resp = put_trait(proxy.url, name)
    assert resp.status_code == 409
    error = resp.json()["errors"][0]
    assert error["code"] == "placement.concurrent_update" and error["status"] == 409
    assert placement.requests_since(mark) == []
    assert proxy.injected == {PlacementFault.CONFLICT: 1}


def test_a_conflict_is_never_the_answer_to_a_read(proxy):
    proxy.set_rates({PlacementFault.CONFLICT: 1})
    resp = requests.get(f"{proxy.url}/traits", headers=HEADERS, timeout=10)
    assert resp.status_code == 200
    assert proxy.total_injected == 0


@pytest.mark.parametrize("fault,status", [(PlacementFault.ERROR_500_BEFORE, 500),
                                          (PlacementFault.ERROR_503_BEFORE, 503)])
def test_an_error_before_leaves_placement_untouched(proxy, placement, fault, status):
    proxy.set_rates({fault: 1})
    mark, name = placement.mark(), new_trait()
    assert put_trait(proxy.url, name).status_code == status
    assert placement.requests_since(mark) == []
    assert not trait_exists(placement, name)
    assert proxy.injected == {fault: 1}


@pytest.mark.parametrize("fault,status", [(PlacementFault.ERROR_500_AFTER, 500),
                                          (PlacementFault.ERROR_503_AFTER, 503)])
def test_an_error_after_hides_a_write_that_happened(proxy, placement, fault, status):
    proxy.set_rates({fault: 1})
    name = new_trait()
    resp = put_trait(proxy.url, name)
    assert resp.status_code == status
    assert resp.json()["errors"][0]["status"] == status
    assert trait_exists(placement, name)


def test_a_reset_before_reaches_no_placement(proxy, placement):
    proxy.set_rates({PlacementFault.RESET_BEFORE: 1})
    mark, name = placement.mark(), new_trait()
    with pytest.raises(requests.ConnectionError):
        put_trait(proxy.url, name)
    assert placement.requests_since(mark) == []
    assert not trait_exists(placement, name)


def test_a_reset_after_hides_a_write_that_happened(proxy, placement):
    proxy.set_rates({PlacementFault.RESET_AFTER: 1})
    name = new_trait()
    with pytest.raises(requests.ConnectionError):
        put_trait(proxy.url, name)
    assert trait_exists(placement, name)
    assert proxy.injected == {PlacementFault.RESET_AFTER: 1}


def test_a_delay_answers_late_and_right(proxy):
    proxy.set_rates({PlacementFault.DELAY: 1})
    started = time.monotonic()
    assert put_trait(proxy.url, new_trait()).status_code == 201
    assert time.monotonic() - started >= 0.4


def test_a_black_hole_answers_nothing_until_the_client_times_out(proxy, placement):
    proxy.set_rates({PlacementFault.BLACK_HOLE: 1})
    mark = placement.mark()
    started = time.monotonic()
    with pytest.raises(requests.ReadTimeout):
        put_trait(proxy.url, new_trait(), timeout=0.5)
    assert time.monotonic() - started >= 0.5
    assert placement.requests_since(mark) == []
    # The proxy still serves others.
    proxy.set_rates({})
    assert put_trait(proxy.url, new_trait()).status_code == 201


def test_a_planned_fault_meets_the_next_matching_request_only(proxy, placement):
    proxy.once(PlacementFault.ERROR_503_BEFORE, "PUT", "/traits/CUSTOM_PROXY_")
    assert requests.get(f"{proxy.url}/traits", headers=HEADERS).status_code == 200
    assert put_trait(proxy.url, new_trait()).status_code == 503
    assert put_trait(proxy.url, new_trait()).status_code == 201
    assert proxy.injected == {PlacementFault.ERROR_503_BEFORE: 1}
