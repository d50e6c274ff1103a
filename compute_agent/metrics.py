"""The agent's Prometheus metrics, and the HTTP endpoint that serves them
(``[metrics] listen``, off by default).

Each Agent owns one ``Metrics``: a private CollectorRegistry, never
prometheus_client's global one, so several agents in one process (tests)
keep their counts apart. The parts of the agent record into it (the
Placement client, the tracker, the update loop, reconciliation, device
health); a part built without one gets a Metrics of its own that nobody
serves. Recording is in memory and costs microseconds; only the endpoint
is optional.

What is served, all named ``compute_agent_*``:

- ``cycle_duration_seconds`` (histogram) and ``cycles_total{result}``:
  each update_provider_tree cycle, ``result`` a CycleResult.
- ``placement_requests_total{method,status}`` and
  ``placement_request_duration_seconds{method}``: every request the
  Placement client makes; ``status`` is the HTTP status, or ``no_answer``
  when none came (connection refused, timeout, authentication failed).
- ``claims_total{kind,result}``: every claim the tracker decides, ``kind``
  build, resize, live_migration or evacuation; ``result`` one of
  CLAIM_RESULTS.
- ``assigned{resource_class,state}`` (gauge): units of each class that
  live assignments hold, read from the tracker's in-memory view at scrape
  time.
- ``lock_wait_seconds`` (histogram): how long each tracker operation
  waited before its decision ran under the tracker's lock: queued in the
  store's writer (compute_agent/store/writer.py), then for the lock itself.
- ``reconcile_findings_total{rule,outcome}``: each finding of each
  reconciliation pass, ``outcome`` fixed or reported.
- ``device_unhealthy{device,reason}`` (gauge): 1 for each reason a device
  is out of scheduling; no series for a healthy device.
- ``provider_total``, ``provider_reserved`` and ``provider_used``
  ``{provider,provider_uuid,resource_class}`` (gauges): each inventory of
  each provider of the host's tree, nested ones included, read at scrape
  time from what the update loop last read (ProviderCapacity); a provider
  gone from the tree has no series.

The same listener answers the probes the daemon gives it (/healthz and
/readyz, compute_agent/daemon/probes.py): a status and one line of text/plain.
"""
from __future__ import annotations

import enum
import errno
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import ClassVar
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

from compute_agent.claims.model import MoveKind
from compute_agent.exception import ClaimFailed, ConfigError, InvalidRequest, MoveInProgress
from compute_agent.store.errors import StoreError
from compute_agent.tree.provider_tree import Provider

LOG = logging.getLogger(__name__)

PREFIX = "compute_agent"

# A probe served beside the metrics: its HTTP status and one line saying why.
Probe = Callable[[], tuple[int, str]]


class CycleResult(str, enum.Enum):
    """How an update_provider_tree cycle ended (compute_agent/daemon/service.py run_cycle)."""

    OK = "ok"
    HYPERVISOR_UNAVAILABLE = "hypervisor_unavailable"
    KEYSTONE_UNAVAILABLE = "keystone_unavailable"
    PLACEMENT_UNAVAILABLE = "placement_unavailable"
    CONFIG_ERROR = "config_error"
    FAILED = "failed"  # Placement refused, or another error of the agent's
    UNEXPECTED_ERROR = "unexpected_error"  # a bug: logged with its traceback


# What a claim is for: a new instance, or the destination's side of a move.
CLAIM_KINDS = ("build",) + tuple(k.value for k in MoveKind)

# A claim's result, by the error that refused it; "claimed" when none did.
CLAIM_RESULTS: tuple[tuple[type[BaseException], str], ...] = (
    (ClaimFailed, "no_capacity"),
    (InvalidRequest, "invalid"),
    (MoveInProgress, "move_in_progress"),
    (StoreError, "store_failed"),
)
CLAIM_CLAIMED = "claimed"
CLAIM_ERROR = "error"  # anything else

NO_ANSWER = "no_answer"  # a Placement request that got no HTTP status

# Cycles take milliseconds against a warm cache, seconds on a first
# registration, up to Placement's timeout (30 s) when it does not answer.
CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A claim's wait is tens of microseconds alone, milliseconds behind a
# group commit (an fsync is about 0.3 ms here).
LOCK_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                0.025, 0.05, 0.1, 0.25, 1)
# Placement answers a GET on loopback in about 8 ms.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))"
                     r":(?P<port>[0-9]{1,5})")


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6 address]:port`` as (host, port); ValueError
    saying what is wrong otherwise."""
    match = _LISTEN.fullmatch(text)
    if not match:
        raise ValueError("not host:port (an IPv6 address as [address]:port)")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is not within 1-65535")
    if match["v6"] is not None:
        try:
            ipaddress.IPv6Address(match["v6"])
        except ValueError:
            raise ValueError(f"{match['v6']!r} is not an IPv6 address") from None
        return match["v6"], port
    return match["host"], port


class _QuietHandler(WSGIRequestHandler):
    """No line per request: a probe every few seconds would fill the log."""

    def log_message(self, format, *args) -> None:
        pass


def probe_response(answer: tuple[int, str]) -> tuple[str, list[tuple[str, str]], bytes]:
    """A probe's answer as HTTP: status line, headers, body of one line."""
    code, reason = answer
    body = (" ".join(reason.split()) + "\n").encode()
    return (f"{code} {HTTPStatus(code).phrase}",
            [("Content-Type", "text/plain; charset=utf-8"),
             ("Content-Length", str(len(body)))], body)


def with_probes(metrics_app: Callable, probes: Mapping[str, Probe]) -> Callable:
    """A WSGI app answering each probe's path from the probe, and every
    other path as ``metrics_app`` does."""
    def app(environ, start_response):
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics_app(environ, start_response)
        status, headers, body = probe_response(probe())
        start_response(status, headers)
        return [body]
    return app


class _AssignedCollector:
    """The ``assigned`` gauge, read from the tracker when scraped."""

    NAME = f"{PREFIX}_assigned"
    HELP = ("Units of each resource class held by live assignments, by "
            "assignment state (the tracker's in-memory view).")

    def __init__(self, read: Callable[[], Mapping[tuple[str, str], int]]):
        self._read = read

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.NAME, self.HELP,
                                 labels=["resource_class", "state"])

    def describe(self):
        # Registration asks for the names: without reading the tracker.
        return [self._family()]

    def collect(self):
        family = self._family()
        for (resource_class, state), units in sorted(self._read().items()):
            family.add_metric([resource_class, state], units)
        yield family


@dataclass(frozen=True)
class ProviderCapacity:
    """One inventory of one provider: its total and reserved as the tree
    last read from Placement has them, and the units its consumers use as
    Placement's allocations were last read; None when they have not been
    (unknown, not 0)."""

    provider: str
    provider_uuid: str
    resource_class: str
    total: int
    reserved: int
    used: int | None


def provider_capacity(providers: Iterable[Provider],
                      usages: Mapping[str, Mapping[str, int]]
                      ) -> list[ProviderCapacity]:
    """Each inventory of each provider; ``usages``: provider uuid -> class
    -> units used, for the providers whose allocations were read."""
    out = []
    for p in providers:
        used = usages.get(p.uuid)
        for resource_class, inventory in sorted(p.inventories.items()):
            out.append(ProviderCapacity(
                p.name, p.uuid, resource_class, int(inventory["total"]),
                int(inventory.get("reserved", 0)),
                None if used is None else used.get(resource_class, 0)))
    return out


class _CapacityCollector:
    """The provider_* gauges, read from the update loop's last reads when
    scraped: a provider that left the tree leaves no series behind."""

    LABELS: ClassVar[list[str]] = ["provider", "provider_uuid", "resource_class"]
    FAMILIES = (
        ("total", "Units of each provider's inventory, by resource class "
         "(Placement's total)."),
        ("reserved", "Units of each provider's inventory kept from "
         "scheduling (Placement's reserved)."),
        ("used", "Units of each provider's inventory its consumers' "
         "allocations hold, as last read from Placement."),
    )

    def __init__(self, read: Callable[[], Iterable[ProviderCapacity]]):
        self._read = read

    def _families(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(f"{PREFIX}_provider_{field}", text,
                                  labels=self.LABELS)
                for field, text in self.FAMILIES]

    def describe(self):
        return self._families()

    def collect(self):
        families = self._families()
        for row in self._read():
            labels = [row.provider, row.provider_uuid, row.resource_class]
            for family, (field, _) in zip(families, self.FAMILIES):
                amount = getattr(row, field)
                if amount is not None:
                    family.add_metric(labels, amount)
        yield from families


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.cycle_duration = Histogram(
            f"{PREFIX}_cycle_duration_seconds",
            "Duration of each update_provider_tree cycle.",
            buckets=CYCLE_BUCKETS, registry=r)
        self.cycles = Counter(
            f"{PREFIX}_cycles", "update_provider_tree cycles, by result.",
            ["result"], registry=r)
        self.placement_requests = Counter(
            f"{PREFIX}_placement_requests",
            "Requests to Placement, by method and HTTP status (no_answer: none "
            "came).", ["method", "status"], registry=r)
        self.placement_duration = Histogram(
            f"{PREFIX}_placement_request_duration_seconds",
            "Duration of each request to Placement, answered or not.",
            ["method"], buckets=REQUEST_BUCKETS, registry=r)
        self.claims = Counter(
            f"{PREFIX}_claims", "Claims decided by the tracker, by kind and result.",
            ["kind", "result"], registry=r)
        self.lock_wait = Histogram(
            f"{PREFIX}_lock_wait_seconds",
            "Time each tracker operation waited before its decision ran under "
            "the tracker's lock (queued in the store's writer, then the lock).",
            buckets=LOCK_BUCKETS, registry=r)
        self.reconcile_findings = Counter(
            f"{PREFIX}_reconcile_findings",
            "Findings of reconciliation passes, by rule and outcome (fixed or "
            "reported).", ["rule", "outcome"], registry=r)
        self.device_unhealthy = Gauge(
            f"{PREFIX}_device_unhealthy",
            "1 for each reason a device is out of scheduling; no series while "
            "it is healthy.", ["device", "reason"], registry=r)
        # Every label value shows from the start, at 0 until seen: a rate
        # over a series that appears with its first count misses that one.
        for cycle_result in CycleResult:
            self.cycles.labels(cycle_result.value)
        for kind in CLAIM_KINDS:
            for result in (CLAIM_CLAIMED, CLAIM_ERROR, *dict(CLAIM_RESULTS).values()):
                self.claims.labels(kind, result)
        self._device_reasons: dict[str, frozenset[str]] = {}
        self._device_lock = threading.Lock()
        self._server = None
        self._server_thread: threading.Thread | None = None

    # --- recording ----------------------------------------------------------

    def cycle_done(self, seconds: float, result: CycleResult) -> None:
        self.cycle_duration.observe(seconds)
        self.cycles.labels(result.value).inc()

    def placement_request(self, method: str, status: int | None, seconds: float) -> None:
        self.placement_requests.labels(method, NO_ANSWER if status is None
                                       else str(status)).inc()
        self.placement_duration.labels(method).observe(seconds)

    def placement_requests_sent(self) -> int:
        """Every request placement_request counted, whatever its method and
        status."""
        return int(sum(s.value for family in self.placement_requests.collect()
                       for s in family.samples if s.name.endswith("_total")))

    @contextmanager
    def claim(self, kind: str) -> Iterator[None]:
        """Count the claim the block makes, by the error that ends it."""
        try:
            yield
        except BaseException as e:
            self.claims.labels(kind, claim_result(e)).inc()
            raise
        self.claims.labels(kind, CLAIM_CLAIMED).inc()

    def waited_for_lock(self, since: float) -> None:
        """A decision starts now; it was asked for at ``since``
        (time.perf_counter())."""
        self.lock_wait.observe(time.perf_counter() - since)

    def findings(self, findings: Iterable) -> None:
        """A reconciliation pass's findings (compute_agent/compute/reconcile.py Finding)."""
        for f in findings:
            self.reconcile_findings.labels(f.kind, "fixed" if f.fixed else "reported").inc()

    def set_device_health(self, device: str, reasons: Iterable[str]) -> None:
        """The reasons ``device`` is out of scheduling now; none: healthy."""
        reasons = frozenset(reasons)
        with self._device_lock:
            for gone in self._device_reasons.get(device, frozenset()) - reasons:
                self.device_unhealthy.remove(device, gone)
            for reason in reasons:
                self.device_unhealthy.labels(device, reason).set(1)
            self._device_reasons[device] = reasons

    def watch_assignments(self, read: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """Serve ``assigned`` from ``read()``: (class, state) -> units."""
        self.registry.register(_AssignedCollector(read))

    def watch_capacity(self, read: Callable[[], Iterable[ProviderCapacity]]) -> None:
        """Serve the provider_* gauges from ``read()``."""
        self.registry.register(_CapacityCollector(read))

    # --- the endpoint -------------------------------------------------------

    def serve(self, listen: str, probes: Mapping[str, Probe] | None = None) -> None:
        """Serve GET /metrics on ``listen`` (host:port) from a thread of its
        own, and each of ``probes`` on its path. Raises ConfigError naming
        the option when it cannot be bound (a port in use, an address not
        of this host)."""
        host, port = parse_listen(listen)
        app = with_probes(make_wsgi_app(self.registry), probes or {})
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                        flags=socket.AI_PASSIVE)[0][0]
            server_class = type("MetricsServer", (ThreadingWSGIServer,),
                                {"address_family": family})
            self._server = make_server(host, port, app, server_class,
                                       handler_class=_QuietHandler)
        except OSError as e:
            reason = ("address already in use" if e.errno == errno.EADDRINUSE
                      else e.strerror or str(e))
            raise ConfigError(f"[metrics] listen: cannot serve metrics there: "
                              f"{reason} (value: {listen!r})") from None
        self._server_thread = threading.Thread(target=self._server.serve_forever,
                                               name="metrics-http", daemon=True)
        self._server_thread.start()
        LOG.info("Serving metrics on http://%s/metrics", listen)

    def stop(self) -> None:
        """Stop serving and free the port."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        assert self._server_thread is not None  # started with the server
        self._server_thread.join()
        self._server = self._server_thread = None


def claim_result(error: BaseException) -> str:
    for kind, result in CLAIM_RESULTS:
        if isinstance(error, kind):
            return result
    return CLAIM_ERROR
