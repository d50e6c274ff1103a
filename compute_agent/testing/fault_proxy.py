"""A fault-injecting HTTP proxy, to put between a Placement client (the
agent, or our users' own tools) and a real Placement in tests.

    proxy = FaultProxy(placement.url, {PlacementFault.CONFLICT: 0.05,
                                       PlacementFault.ERROR_503_AFTER: 0.05}, seed=7).start()
    # point the client at proxy.url ...
    proxy.set_rates({})          # faults stop; requests pass through
    proxy.injected               # Counter: PlacementFault -> how many were injected
    proxy.stop()

Each request draws at most one fault from a seeded generator, so a run
that makes the same requests in the same order meets the same faults.
"_BEFORE" faults answer without Placement ever seeing the request;
"_AFTER" faults forward it, let Placement do the work, then replace its
answer (the client does not learn that its write happened). A black hole
accepts the request and never answers: only the client's timeout ends
it. The proxy speaks HTTP/1.1 with keep-alive on 127.0.0.1, on its own
free port, a thread per connection.
"""
from __future__ import annotations

import enum
import http.client
import json
import random
import select
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class PlacementFault(enum.Enum):
    """A fault the proxy puts between the agent and Placement."""

    CONFLICT = "409 concurrent_update"
    ERROR_500_BEFORE = "500 before"
    ERROR_503_BEFORE = "503 before"
    ERROR_500_AFTER = "500 after"
    ERROR_503_AFTER = "503 after"
    RESET_BEFORE = "reset before"
    RESET_AFTER = "reset after"
    DELAY = "delay"
    BLACK_HOLE = "black hole"


# Placement answers 409 concurrent_update only to a write that carried a
# generation; a read never meets it.
WRITE_METHODS = frozenset({"PUT", "POST", "PATCH", "DELETE"})

_ERROR_TITLES = {409: "Conflict", 500: "Internal Server Error",
                 502: "Bad Gateway", 503: "Service Unavailable"}
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te",
                         "trailer", "upgrade", "proxy-connection", "content-length"})


def applies_to(fault: PlacementFault, method: str) -> bool:
    return fault is not PlacementFault.CONFLICT or method in WRITE_METHODS


def error_body(status: int, code: str, detail: str) -> bytes:
    """An error as Placement writes it."""
    return json.dumps({"errors": [{
        "status": status, "title": _ERROR_TITLES[status], "detail": detail,
        "code": code, "request_id": f"req-{uuid.uuid4()}"}]}).encode()


def conflict_body(method: str, path: str) -> bytes:
    return error_body(409, "placement.concurrent_update",
                      f"There was a conflict when trying to complete your request."
                      f"\n\n resource provider generation conflict (injected by "
                      f"the fault proxy into {method} {path})")


class FaultProxy:
    def __init__(self, upstream: str, rates: dict[PlacementFault, float] | None = None,
                 seed: int = 0, delay: float = 0.5, upstream_timeout: float = 60):
        parts = urlsplit(upstream)
        if parts.hostname is None:
            raise ValueError(f"upstream: not a URL with a host: {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.delay = delay
        self.upstream_timeout = upstream_timeout
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.injected: Counter[PlacementFault] = Counter()
        # (method, path, fault or None) of every request, oldest first.
        self.seen: list[tuple[str, str, PlacementFault | None]] = []
        # Faults for the next request matching (method, path prefix).
        self._planned: list[tuple[str, str, PlacementFault]] = []
        self.set_rates(rates or {})
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    def set_rates(self, rates: dict[PlacementFault, float]) -> None:
        """Each fault's probability per request; together at most 1.
        ``{}``: no more faults."""
        bad = {f: r for f, r in rates.items() if not 0 <= r <= 1}
        if bad or sum(rates.values()) > 1:
            raise ValueError(f"fault rates must be in [0, 1] and sum to at most 1 "
                             f"(value: { {f.name: r for f, r in rates.items()} })")
        with self._lock:
            self.rates = dict(rates)

    @property
    def requests(self) -> int:
        return len(self.seen)

    @property
    def total_injected(self) -> int:
        return sum(self.injected.values())

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        args=(0.05,), name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:  # shutdown() waits for serve_forever
            self._server.shutdown()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def once(self, fault: PlacementFault, method: str, path_prefix: str) -> None:
        """The next request of ``method`` whose path starts with
        ``path_prefix`` meets ``fault``, whatever the rates: for tests that
        need one fault at one place."""
        with self._lock:
            self._planned.append((method, path_prefix, fault))

    def draw(self, method: str, path: str) -> PlacementFault | None:
        """The fault for the next request, if any, counted as injected."""
        with self._lock:
            fault = self._planned_for(method, path) or self._roll(method)
            if fault is not None:
                self.injected[fault] += 1
            self.seen.append((method, path, fault))
            return fault

    def _planned_for(self, method: str, path: str) -> PlacementFault | None:
        for i, (m, prefix, fault) in enumerate(self._planned):
            if m == method and path.startswith(prefix):
                del self._planned[i]
                return fault
        return None

    def _roll(self, method: str) -> PlacementFault | None:
        roll = self._rng.random()
        for fault, rate in self.rates.items():
            if roll < rate:
                return fault if applies_to(fault, method) else None
            roll -= rate
        return None

    def _handler_class(self):
        proxy = self

        class Handler(_ProxyHandler):
            pass

        Handler.proxy = proxy
        return Handler


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = do_GET  # noqa: N815 - http.server's names

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = self.proxy.draw(self.command, self.path)
        if fault is PlacementFault.CONFLICT:
            return self._answer(409, conflict_body(self.command, self.path))
        if fault in (PlacementFault.ERROR_500_BEFORE, PlacementFault.ERROR_503_BEFORE):
            return self._answer(_status(fault), _server_error(fault))
        if fault is PlacementFault.RESET_BEFORE:
            return self._reset()
        if fault is PlacementFault.BLACK_HOLE:
            return self._black_hole()
        if fault is PlacementFault.DELAY:
            time.sleep(self.proxy.delay)
        try:
            status, headers, answer = self._forward(body)
        except OSError as e:
            return self._answer(502, error_body(
                502, "placement.undefined_code", f"the proxy did not reach Placement: {e}"))
        if fault is PlacementFault.RESET_AFTER:
            return self._reset()
        if fault in (PlacementFault.ERROR_500_AFTER, PlacementFault.ERROR_503_AFTER):
            return self._answer(_status(fault), _server_error(fault))
        self._answer(status, answer, headers)

    def _forward(self, body: bytes | None):
        conn = http.client.HTTPConnection(*self.proxy.upstream,
                                          timeout=self.proxy.upstream_timeout)
        try:
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in _HOP_BY_HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            answer = resp.read()
            return resp.status, [(k, v) for k, v in resp.getheaders()
                                 if k.lower() not in _HOP_BY_HOP], answer
        finally:
            conn.close()

    def _answer(self, status: int, body: bytes, headers=None) -> None:
        self.send_response(status)
        for key, value in headers or [("Content-Type", "application/json")]:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reset(self) -> None:
        """Close with a TCP reset (SO_LINGER 0), not an orderly FIN."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                   struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _black_hole(self) -> None:
        """Answer nothing until the client gives up (closes) or the proxy
        stops."""
        self.close_connection = True
        while not self.proxy._stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.2)
            if readable and not self.connection.recv(4096):
                return


def _status(fault: PlacementFault) -> int:
    return (500 if fault in (PlacementFault.ERROR_500_BEFORE, PlacementFault.ERROR_500_AFTER)
            else 503)


def _server_error(fault: PlacementFault) -> bytes:
    return error_body(_status(fault), "placement.undefined_code",
                      f"injected by the fault proxy: {fault.value}")
