"""The health watch over the fake driver: it wakes the update loop once per
change, logs one line each way, and a device bad before the first cycle is
never offered."""
from __future__ import annotations

import json
import logging
import threading

from compute_agent.drivers.base import PciHealthSignals
from compute_agent.drivers.fake import FakeDriver
from compute_agent.health.rules import DeviceFault
from compute_agent.health.run import HealthSettings, HealthWatch
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import TreePolicy, build_tree
from compute_agent.tree.ownership import UNHEALTHY_TRAIT

NIC = "0000:3b:00.0"
OTHER = "0000:3c:00.0"
ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
POLICY = TreePolicy("h", ROOT, device_specs=parse_specs(
    [json.dumps({"vendor_id": "15b3", "product_id": "101b"})]))


def driver() -> FakeDriver:
    return FakeDriver({"cpus": "0-3", "memory_mb": 4096, "pci_devices": [
        {"address": a, "vendor_id": "15b3", "product_id": "101b"} for a in (NIC, OTHER)]})


class Wakes:
    def __init__(self):
        self.count = 0

    def __call__(self):
        self.count += 1


def cycle(watch: HealthWatch, fake: FakeDriver):
    inv = fake.get_host_inventory()
    return watch.apply(build_tree(inv, POLICY), inv)


def nic_reserved(built) -> int:
    return built.tree.by_name("h_0000:3B:00.0").inventories["CUSTOM_PCI_15B3_101B"]["reserved"]


def dead(address: str) -> PciHealthSignals:
    return PciHealthSignals(address, True, "ffff")


def test_a_device_bad_at_the_first_cycle_is_never_offered():
    fake, wakes = driver(), Wakes()
    fake.set_device_health(dead(NIC))
    watch = HealthWatch(fake, HealthSettings(), wakes)
    built = cycle(watch, fake)
    assert nic_reserved(built) == 1
    assert wakes.count == 0  # this very cycle applies it


def test_a_change_wakes_the_loop_once_and_logs_once_each_way(caplog):
    caplog.set_level(logging.INFO, logger="compute_agent.health.run")
    fake, wakes = driver(), Wakes()
    watch = HealthWatch(fake, HealthSettings(), wakes)
    assert nic_reserved(cycle(watch, fake)) == 0
    assert watch.poll() is False and wakes.count == 0

    fake.set_device_health(PciHealthSignals(NIC, True, "15b3", aer_nonfatal=0))
    watch.poll()
    fake.set_device_health(PciHealthSignals(NIC, True, "15b3", aer_nonfatal=1))
    assert watch.poll() is True and wakes.count == 1
    fake.set_device_health(PciHealthSignals(NIC, True, "15b3", aer_nonfatal=5))
    assert watch.poll() is False and wakes.count == 1  # still the same fault
    built = cycle(watch, fake)
    assert nic_reserved(built) == 1
    assert DeviceFault.AER_NONFATAL.trait in built.tree.by_name("h_0000:3B:00.0").traits
    assert [v.address for v in watch.snapshot().unhealthy] == [NIC]

    fake.set_device_health(PciHealthSignals(NIC, True, "15b3", aer_nonfatal=0))
    assert watch.poll() is True and wakes.count == 2
    built = cycle(watch, fake)
    assert nic_reserved(built) == 0
    assert UNHEALTHY_TRAIT not in built.tree.by_name("h_0000:3B:00.0").traits
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("Device 0000:3b:00.0 unhealthy (aer_nonfatal): "
                               "TOTAL_ERR_NONFATAL 0 -> 1;")
    assert lines[1] == ("Device 0000:3b:00.0 healthy again: its units are back in "
                        "scheduling")


def test_a_device_no_longer_allowlisted_is_no_longer_watched(caplog):
    caplog.set_level(logging.INFO, logger="compute_agent.health.run")
    fake = driver()
    watch = HealthWatch(fake, HealthSettings(), Wakes())
    fake.set_device_health(dead(NIC))
    cycle(watch, fake)
    inv = fake.get_host_inventory()
    watch.apply(build_tree(inv, TreePolicy("h", ROOT)), inv)
    assert watch.snapshot().watched == frozenset()
    assert watch.snapshot().unhealthy == ()
    assert caplog.records[-1].getMessage() == (
        "Device 0000:3b:00.0 no longer watched: no provider of this host depends "
        "on it any more")


def test_the_thread_polls_until_stopped():
    fake = driver()
    woken = threading.Event()
    watch = HealthWatch(fake, HealthSettings(poll_interval=0.05), woken.set)
    cycle(watch, fake)
    watch.start()
    try:
        fake.set_device_health(dead(OTHER))
        fake.set_device_health(dead(NIC))
        assert woken.wait(5)
    finally:
        watch.stop(timeout=5)
    assert watch.snapshot().polls >= 2
    # Stopped: its thread has ended, so no poll follows.
    assert not watch._thread.is_alive()


def test_each_change_of_a_devices_faults_is_reported_for_the_metrics_gauge():
    fake, heard = driver(), []
    watch = HealthWatch(fake, HealthSettings(), Wakes(),
                        report=lambda device, reasons: heard.append((device, reasons)))
    cycle(watch, fake)
    fake.set_device_health(dead(NIC))
    watch.poll()
    watch.poll()  # the same fault again: nothing new to report
    fake.set_device_health(PciHealthSignals(NIC, True, "15b3"))
    watch.poll()
    assert heard == [(NIC, frozenset({DeviceFault.CONFIG_SPACE.value})), (NIC, frozenset())]
