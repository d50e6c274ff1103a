"""The device health watch: a thread that reads the watched devices' health
signals every ``[devices] health_poll_interval`` seconds and wakes the
update loop when a device turns bad or recovers; each cycle then takes the
bad devices out of the tree it reports (``apply``).

A poll, not events: the kernel raises no uevent when an AER counter moves,
a device stops answering config reads or a VF count drifts, and carrier
changes come over rtnetlink, not udev. What udev does announce (a device
removed or added) reaches the agent already, as libvirt's node-device
events (the driver's change listener); the poll sees the removal too.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from compute_agent.drivers.base import HostInventory
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.health.rules import (
    DeviceVerdict,
    HealthJudge,
    HealthSnapshot,
    apply_health,
    watched_devices,
)
from compute_agent.tree.host_tree import BuiltTree

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthSettings:
    """The operator's ``[devices]`` options for the watch; the defaults are
    the options' defaults."""

    # Seconds between two reads of the watched devices' signals.
    poll_interval: float = 1.0
    # The rise of a device's correctable AER errors in a minute that takes
    # it out (compute_agent/health/rules.py).
    correctable_per_minute: int = 100


class HealthWatch:
    def __init__(self, driver: ComputeDriver, settings: HealthSettings,
                 on_change: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic,
                 report: Callable[[str, frozenset[str]], None] = lambda d, r: None
                 ) -> None:
        """``report(device, reasons)`` hears every change of a device's
        faults (none: healthy again), e.g. for the metrics gauge."""
        self.interval = settings.poll_interval
        self._driver = driver
        self._on_change = on_change
        self._report = report
        self._clock = clock
        self._judge = HealthJudge(settings.correctable_per_minute)
        # Guards the judge, the watched set and the verdicts: the poll
        # thread and the update loop both judge.
        self._lock = threading.Lock()
        self._watched: frozenset[str] = frozenset()
        self._verdicts: dict[str, DeviceVerdict] = {}
        self._polls = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def apply(self, built: BuiltTree, inv: HostInventory,
              known_bad: Mapping[str, DeviceVerdict] | None = None) -> BuiltTree:
        """For a cycle, after build_tree: watch the devices this tree
        depends on (those new to the watch are read at once, so a device
        bad at start-up is never offered), and take the bad ones out, with
        those ``known_bad`` without a poll (a VF a reboot took)."""
        watched = watched_devices(built, inv)
        with self._lock:
            new = watched - self._watched
            self._watched = watched
            self._judge.forget(watched)
            for address in sorted(set(self._verdicts) - watched):
                del self._verdicts[address]
                self._report(address, frozenset())
                LOG.info("Device %s no longer watched: no provider of this host "
                         "depends on it any more", address)
        if new:
            self.poll(new, wake=False)
        with self._lock:
            verdicts = dict(self._verdicts)
        for address, bad in (known_bad or {}).items():
            seen = verdicts.get(address)
            verdicts[address] = bad if seen is None else DeviceVerdict(
                address, seen.faults | bad.faults, seen.details + bad.details)
        return apply_health(built, inv, verdicts)

    def poll(self, addresses: Collection[str] | None = None,
             wake: bool = True) -> bool:
        """Read and judge the watched devices (or these of them); True when
        a device turned bad or recovered, which wakes the update loop."""
        with self._lock:
            wanted = self._watched if addresses is None else frozenset(addresses)
        signals = self._driver.device_health(sorted(wanted))
        changed = False
        with self._lock:
            now = self._clock()
            for address, reading in sorted(signals.items()):
                if address in self._watched:
                    changed |= self._record(address,
                                            self._judge.judge(reading, now))
            self._polls += 1
        if changed and wake:
            self._on_change()
        return changed

    def _record(self, address: str, verdict: DeviceVerdict | None) -> bool:
        """Keep the verdict; True and one log line when the device's
        faults changed (a counter that keeps rising changes nothing)."""
        before = self._verdicts.get(address)
        if (before.faults if before else None) == (verdict.faults if verdict else None):
            return False
        self._report(address, frozenset(f.value for f in verdict.faults)
                     if verdict else frozenset())
        if verdict is None:
            del self._verdicts[address]
            LOG.info("Device %s healthy again: its units are back in scheduling",
                     address)
        else:
            self._verdicts[address] = verdict
            LOG.warning("Device %s unhealthy (%s): %s; its units are taken out "
                        "of scheduling, guests holding it keep it", address,
                        ", ".join(f.value for f in sorted(verdict.faults)),
                        "; ".join(verdict.details))
        return True

    def snapshot(self) -> HealthSnapshot:
        with self._lock:
            return HealthSnapshot(self._watched, tuple(
                v for _, v in sorted(self._verdicts.items())), self._polls)

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.poll()
            except Exception:  # the watch must outlive any bug in a poll
                LOG.exception("Device health poll failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="device-health",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
