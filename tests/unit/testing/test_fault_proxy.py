"""The fault proxy (compute_agent/testing/fault_proxy.py) without a
Placement: which fault each request draws, and what each does between a
client and a recording HTTP server standing for Placement. (tests/
reliability/test_fault_proxy.py runs it in front of a real Placement.)"""
from __future__ import annotations

import http.client
import http.server
import json
import select
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault
from tests.waiting import wait_for

# Nothing is sent there: these proxies are never started.
UPSTREAM = "http://127.0.0.1:1"


def test_one_seed_gives_one_sequence_of_faults():
    rates = {PlacementFault.CONFLICT: 0.2, PlacementFault.RESET_AFTER: 0.2,
             PlacementFault.DELAY: 0.2}
    runs = []
    for _ in range(2):
        proxy = FaultProxy(UPSTREAM, rates, seed=42)
        runs.append([proxy.draw("PUT", "/traits/CUSTOM_X") for _ in range(200)])
        proxy.stop()
    assert runs[0] == runs[1]
    assert {f for f in runs[0] if f} == set(rates)
    # About the configured share of each, not all of one.
    assert all(20 <= runs[0].count(f) <= 60 for f in rates), Counter(runs[0])


@pytest.mark.parametrize("rates", [{PlacementFault.DELAY: 1.5}, {PlacementFault.DELAY: -0.1},
                                   {PlacementFault.DELAY: 0.6, PlacementFault.CONFLICT: 0.6}])
def test_rates_out_of_range_are_refused_naming_them(rates):
    with pytest.raises(ValueError, match="DELAY"):
        FaultProxy(UPSTREAM, rates)


def test_a_roll_that_lands_on_a_conflict_for_a_read_is_no_fault_not_the_next_one():
    """A read never meets a 409, and its share is not handed to the fault
    after it: the same seed gives reads the writes' faults, conflicts
    taken out."""
    rates = {PlacementFault.CONFLICT: 0.5, PlacementFault.ERROR_500_BEFORE: 0.5}
    writes = FaultProxy(UPSTREAM, rates, seed=3)
    reads = FaultProxy(UPSTREAM, rates, seed=3)
    try:
        put = [writes.draw("PUT", "/traits/CUSTOM_X") for _ in range(100)]
        get = [reads.draw("GET", "/traits") for _ in range(100)]
    finally:
        writes.stop()
        reads.stop()
    assert PlacementFault.CONFLICT in put
    assert get == [None if f is PlacementFault.CONFLICT else f for f in put]
    assert reads.injected == {PlacementFault.ERROR_500_BEFORE: put.count(
        PlacementFault.ERROR_500_BEFORE)}
    assert reads.requests == 100 and reads.seen[0][:2] == ("GET", "/traits")


def test_a_planned_fault_meets_the_next_request_of_its_method_and_path_only():
    proxy = FaultProxy(UPSTREAM, {PlacementFault.DELAY: 1}, seed=1)
    try:
        proxy.once(PlacementFault.RESET_BEFORE, "PUT", "/traits/CUSTOM_")
        assert proxy.draw("GET", "/traits/CUSTOM_A") is PlacementFault.DELAY
        assert proxy.draw("PUT", "/resource_providers/x") is PlacementFault.DELAY
        assert proxy.draw("PUT", "/traits/CUSTOM_A") is PlacementFault.RESET_BEFORE
        assert proxy.draw("PUT", "/traits/CUSTOM_A") is PlacementFault.DELAY
        proxy.set_rates({})
        assert proxy.draw("PUT", "/traits/CUSTOM_A") is None
    finally:
        proxy.stop()
    assert proxy.injected == {PlacementFault.DELAY: 3, PlacementFault.RESET_BEFORE: 1}
    assert proxy.total_injected == 4 and proxy.requests == 5


def test_an_upstream_that_is_no_url_is_refused():
    with pytest.raises(ValueError, match="not a URL with a host: 'placement:8778'"):
        FaultProxy("placement:8778")


# --- in front of a server ------------------------------------------------------

@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Upstream(http.server.BaseHTTPRequestHandler):
    """Records each request and answers it with its own status, a header
    of its own and a hop-by-hop one, and a JSON body naming it."""

    protocol_version = "HTTP/1.1"
    seen: list[Seen]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append(Seen(self.command, self.path, dict(self.headers),
                              self.rfile.read(length)))
        body = json.dumps({"served": f"{self.command} {self.path}"}).encode()
        self.send_response(201 if self.command == "PUT" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("OpenStack-Request-ID", "req-upstream")
        self.send_header("Keep-Alive", "timeout=5")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = _answer  # noqa: N815 - http.server's names

    def log_message(self, *args: object) -> None:
        pass  # not the test's output


@pytest.fixture
def upstream() -> Iterator[tuple[str, list[Seen]]]:
    seen: list[Seen] = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("RecordingUpstream", (Upstream,), {"seen": seen}))
    # Polled often, so that its shutdown waits 0.05 s, not serve_forever's 0.5 s.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def proxy(upstream) -> Iterator[FaultProxy]:
    # No delay: a DELAY fault is then told apart by its count alone.
    with FaultProxy(upstream[0], seed=1, delay=0) as p:
        yield p


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict:
        (error,) = json.loads(self.body)["errors"]
        return error


def send(proxy: FaultProxy, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def test_without_a_fault_the_request_and_the_answer_pass_but_their_hop_by_hop_headers(
        proxy, upstream):
    _, seen = upstream
    answer = send(proxy, "PUT", "/traits/CUSTOM_A?x=1", b'{"a": 1}',
                  {"X-Auth-Token": "admin", "Proxy-Connection": "keep-alive",
                   "Content-Type": "application/json"})
    assert (answer.status, json.loads(answer.body)) == (
        201, {"served": "PUT /traits/CUSTOM_A?x=1"})
    assert answer.headers["openstack-request-id"] == "req-upstream"
    assert "keep-alive" not in answer.headers
    assert answer.headers["content-length"] == str(len(answer.body))
    (put,) = seen
    assert (put.method, put.path, put.body) == ("PUT", "/traits/CUSTOM_A?x=1", b'{"a": 1}')
    assert put.headers["X-Auth-Token"] == "admin"
    assert "Proxy-Connection" not in put.headers
    assert proxy.seen == [("PUT", "/traits/CUSTOM_A?x=1", None)] and not proxy.injected


def test_a_head_is_answered_without_a_body_even_when_it_meets_a_fault(proxy, upstream):
    """A body after a HEAD's answer would be read as the next answer on the
    connection."""
    proxy.once(PlacementFault.ERROR_503_BEFORE, "HEAD", "/traits")
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        for method, status in [("HEAD", 503), ("HEAD", 200), ("GET", 200)]:
            conn.request(method, "/traits")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (status, b"" if method == "HEAD" else
                                                  b'{"served": "GET /traits"}')
    finally:
        conn.close()
    assert [s.method for s in upstream[1]] == ["HEAD", "GET"]


@pytest.mark.parametrize("fault, status, title", [
    (PlacementFault.ERROR_500_BEFORE, 500, "Internal Server Error"),
    (PlacementFault.ERROR_503_BEFORE, 503, "Service Unavailable")])
def test_an_error_before_answers_as_placement_and_never_reaches_it(proxy, upstream, fault,
                                                                    status, title):
    proxy.once(fault, "PUT", "/traits/")
    answer = send(proxy, "PUT", "/traits/CUSTOM_A")
    assert answer.status == status
    error = answer.error()
    assert (error["status"], error["title"], error["code"]) == (
        status, title, "placement.undefined_code")
    assert error["detail"] == f"injected by the fault proxy: {fault.value}"
    assert error["request_id"].startswith("req-")
    assert upstream[1] == []


def test_a_conflict_is_placements_concurrent_update_naming_the_request(proxy, upstream):
    proxy.once(PlacementFault.CONFLICT, "PUT", "/resource_providers/")
    answer = send(proxy, "PUT", "/resource_providers/rp1/inventories")
    assert answer.status == 409
    error = answer.error()
    assert (error["title"], error["code"]) == ("Conflict", "placement.concurrent_update")
    assert "into PUT /resource_providers/rp1/inventories" in error["detail"]
    assert upstream[1] == []


@pytest.mark.parametrize("fault, status", [(PlacementFault.ERROR_500_AFTER, 500),
                                           (PlacementFault.ERROR_503_AFTER, 503)])
def test_an_error_after_hides_a_write_that_reached_placement(proxy, upstream, fault, status):
    proxy.once(fault, "PUT", "/traits/")
    answer = send(proxy, "PUT", "/traits/CUSTOM_A")
    assert (answer.status, answer.error()["status"]) == (status, status)
    assert [(s.method, s.path) for s in upstream[1]] == [("PUT", "/traits/CUSTOM_A")]


@pytest.mark.parametrize("fault, reached", [(PlacementFault.RESET_BEFORE, False),
                                            (PlacementFault.RESET_AFTER, True)])
def test_a_reset_ends_the_connection_without_an_answer(proxy, upstream, fault, reached):
    proxy.once(fault, "PUT", "/traits/")
    with pytest.raises(ConnectionResetError):
        send(proxy, "PUT", "/traits/CUSTOM_A")
    assert bool(upstream[1]) is reached
    assert proxy.injected == {fault: 1}


def test_a_delay_still_answers_placements_answer(proxy, upstream):
    proxy.set_rates({PlacementFault.DELAY: 1})
    assert send(proxy, "GET", "/traits").status == 200
    assert len(upstream[1]) == 1 and proxy.injected == {PlacementFault.DELAY: 1}


def test_a_black_hole_holds_its_connection_silent_until_the_proxy_stops(proxy, upstream):
    proxy.once(PlacementFault.BLACK_HOLE, "GET", "/traits")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
        client.sendall(b"GET /traits HTTP/1.1\r\nHost: placement\r\n\r\n")
        wait_for(lambda: proxy.requests == 1, timeout=10, interval=0.01)
        # Another client is served meanwhile; the first has heard nothing,
        # not even its connection's end.
        assert send(proxy, "GET", "/resource_providers").status == 200
        assert select.select([client], [], [], 0)[0] == []
        proxy.stop()
        assert client.recv(4096) == b""  # closed, and nothing said
    assert [s.path for s in upstream[1]] == ["/resource_providers"]


def test_a_placement_out_of_reach_is_a_502_saying_so():
    with FaultProxy(UPSTREAM) as proxy:
        answer = send(proxy, "GET", "/traits")
    assert answer.status == 502
    assert answer.error()["detail"].startswith("the proxy did not reach Placement: ")


def test_a_stopped_proxy_takes_no_connection(upstream):
    proxy = FaultProxy(upstream[0]).start()
    proxy.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
