"""Benchmark: hot-plug latency, from libvirt's node-device event reaching
the agent's connection callback to the change showing in Placement.

A running agent (update loop and health watch threads, an update interval
of an hour, so only the event starts the cycle) on the libvirt test driver
over a fake sysfs tree (the functional tests' host, tests/functional/
libvirt_host.py), synced into a local Placement. This machine has no PCI
hot-plug and the test driver sends node-device lifecycle events for vHBAs
only, so each change is: a GPU's vendor driver binds in sysfs (the GPU
becomes an mdev parent with 4 vGPUs of nvidia-35) or unbinds, then a vHBA
is created or destroyed through the agent's own libvirt connection, and the
test driver's CREATED or DELETED event is what the agent hears, through
libvirt's event loop, as it would hear libvirtd's. The clock starts when
the event reaches the connection's callback (the time libvirt took from
the create or destroy call to it is ``delivery_ms_median``) and stops when
Placement, read every 10 ms in one request (it serves with 2 workers,
so these reads do not queue the agent's writes), offers the GPU's 4 vGPUs
(bound) or no longer has its provider (unbound).

    from tools.benchmarks import hotplug
    figures = hotplug.run(pathlib.Path("/tmp/bench"))

Figures: RUNS runs of EVENTS changes each (bind and unbind in turn, each
after a random pause of up to 0.2 s): ``latency_s_p50`` and
``latency_s_p99`` per run, their medians over the runs, the largest
latency seen, the target (1 s), and ``placement_s_p50``: how much of a
latency the agent's own requests to Placement took, while the cycle read
the tree and wrote the provider (p50 per run, their median).
"""
from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from compute_agent.drivers.fake_sysfs import vhba_xml
from compute_agent.testing.local_placement import LocalPlacement
from compute_agent.tree.host_tree import gpu_provider_name
from tests.functional.helpers import providers_named
from tests.functional.libvirt_host import Host
from tools.benchmarks.common import percentile

RUNS = 5
EVENTS = 40
TARGET_S = 1.0
LATE_GPU = "0000:07:00.0"
TYPES = {"nvidia-35": ("GRID M60-2Q", 4)}
READ_EVERY_S = 0.01
TIMEOUT_S = 30.0


class CallbackClock:
    """Stamps each node-device event as it reaches the connection's
    callback, before the agent's handler runs."""

    def __init__(self, host: Host) -> None:
        self.arrivals: list[float] = []
        self._arrived = threading.Condition()
        connection = host.agent.driver._conn
        handler = connection._on_event

        def stamped(kind: str, name: str, event: int) -> None:
            with self._arrived:
                self.arrivals.append(time.monotonic())
                self._arrived.notify_all()
            handler(kind, name, event)
        connection._on_event = stamped

    def next_arrival(self, count: int) -> float:
        """The arrival of event number ``count`` (from 1)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.arrivals) >= count, TIMEOUT_S):
                raise RuntimeError(f"node-device event {count} not delivered "
                                   f"within {TIMEOUT_S} s")
            return self.arrivals[count - 1]


class RequestClock:
    """The span of each request the agent makes to Placement."""

    def __init__(self, host: Host) -> None:
        self.spans: list[tuple[float, float]] = []
        client = host.agent.sync.client
        call = client._call

        def timed(*args, **kwargs):
            started = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                self.spans.append((started, time.monotonic()))
        client._call = timed

    def within(self, start: float, end: float) -> float:
        """Seconds spent in the requests made between these times."""
        return sum(e - s for s, e in self.spans if s >= start and e <= end)


def seen_at(reached: Callable[[], bool]) -> float:
    deadline = time.monotonic() + TIMEOUT_S
    while not reached():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Placement did not change within {TIMEOUT_S} s")
        time.sleep(READ_EVERY_S)
    return time.monotonic()


def one_run(host: Host, clock: CallbackClock, requests: RequestClock, hba: str) -> dict:
    """EVENTS changes, bind and unbind in turn."""
    provider = gpu_provider_name(host.name, LATE_GPU)

    def offered() -> bool:
        return providers_named(host.url, provider, "VGPU:4") != []

    def gone() -> bool:
        return providers_named(host.url, provider) == []

    connection = host.agent.driver._conn
    latencies, in_placement, deliveries = [], [], []
    vhba = None
    for n in range(EVENTS):
        time.sleep(random.uniform(0, 0.2))
        delivered = len(clock.arrivals)
        if vhba is None:
            host.sys.bind_mdev_driver(LATE_GPU, TYPES)
            called = time.monotonic()
            vhba = connection.call(
                lambda conn, n=n: conn.nodeDeviceCreateXML(vhba_xml(hba, n), 0))
            reached = offered
        else:
            host.sys.unbind_mdev_driver(LATE_GPU)
            called = time.monotonic()
            connection.call(lambda conn, vhba=vhba: vhba.destroy())
            vhba, reached = None, gone
        arrival = clock.next_arrival(delivered + 1)
        seen = seen_at(reached)
        latencies.append(seen - arrival)
        in_placement.append(requests.within(arrival, seen))
        deliveries.append(arrival - called)
    return {"latency_s_p50": round(percentile(latencies, 50), 3),
            "latency_s_p99": round(percentile(latencies, 99), 3),
            "latency_s_max": round(max(latencies), 3),
            "placement_s_p50": round(percentile(in_placement, 50), 3),
            "delivery_ms_median": round(statistics.median(deliveries) * 1000, 3)}


def run(workdir: Path) -> dict:
    placement = LocalPlacement(workdir / "placement", workers=2).start()
    try:
        host = Host(workdir, placement.url)
        host.build_default()
        host.sys.add_pci_device(LATE_GPU, "10de", "13f2", "030000", numa_node=0)
        hba = host.sys.add_npiv_hba(5)
        host.make_agent(default={"update_interval": 3600, "update_jitter": 0})
        clock, requests = CallbackClock(host), RequestClock(host)
        host.agent.start()
        try:
            runs = [one_run(host, clock, requests, hba) for _ in range(RUNS)]
        finally:
            host.agent.stop()
    finally:
        placement.stop()

    def median_of(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 3)

    return {
        "case": "hotplug",
        "event": "test driver node-device lifecycle (vHBA created / destroyed)",
        "runs": RUNS,
        "events_per_run": EVENTS,
        "latency_s_p50": median_of("latency_s_p50"),
        "latency_s_p99": median_of("latency_s_p99"),
        "latency_s_p50_each_run": [r["latency_s_p50"] for r in runs],
        "latency_s_p99_each_run": [r["latency_s_p99"] for r in runs],
        "latency_s_max": max(r["latency_s_max"] for r in runs),
        "placement_s_p50": median_of("placement_s_p50"),
        "delivery_ms_median": median_of("delivery_ms_median"),
        "target_s": TARGET_S,
    }
