"""Benchmark: what a claim pays to learn what every guest holds.

Claims never choose a device a guest's domain holds (compute_agent/claims/veto.py),
so the manager asks the driver's ``guest_holdings()`` before each claim. On
a libvirtd of its own (QEMU/KVM, tests/functional/private_services.py),
with 10, 100 and 500 defined guests of nova's shape, each holding a VF and
an mdev:

- ``reread_ms``: ``guest_holdings(reread=True)``, every domain's XML read
  and parsed (what the update loop does once a cycle), median;
- ``claim_ms``: ``guest_holdings()`` with nothing changed: one listing of
  the domains, each kept read checked by its id (what a claim does), median;
- ``after_a_change_ms``: the same after one guest was redefined through
  the driver (that one read again), median.

``reread_ms`` grows with the guests (each domain's XML read and parsed),
which is why a claim does not pay it: ``claim_ms`` is one listing.
"""
from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path

from oslo_config import cfg

from compute_agent import config
from compute_agent.drivers.base import GuestSpec
from compute_agent.drivers.libvirt.driver import LibvirtDriver
from tests.functional.nova_host import nova_domain_xml
from tests.functional.private_services import PrivateLibvirtd

GUESTS = (10, 100, 500)
REPEATS = 9


def make_driver(workdir: Path, uri: str) -> LibvirtDriver:
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf([], default_config_files=[])
    (workdir / "sys").mkdir(parents=True, exist_ok=True)
    conf.set_override("sysfs_root", str(workdir / "sys"))
    conf.set_override("connection_uri", uri, "libvirt")
    conf.set_override("instances_path", str(workdir / "instances"), "libvirt")
    driver = LibvirtDriver(conf)
    driver.init_host()
    return driver


def _median_ms(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def run(workdir: Path) -> list[dict]:
    daemon = PrivateLibvirtd(workdir / "libvirtd").start()
    driver = make_driver(workdir, daemon.uri)
    results = []
    try:
        defined = 0
        for count in GUESTS:
            def define(conn, start=defined, stop=count) -> None:
                for i in range(start, stop):
                    conn.defineXML(nova_domain_xml(
                        str(uuid.uuid4()), i + 1, f"bench-{i}", 1, 64,
                        pci=(f"0000:81:{0x10 + i // 8 % 16:02x}.{i % 8}",),
                        mdevs=(str(uuid.uuid4()),)))
            driver._conn.call(define)
            defined = count
            reread = _median_ms(lambda: driver.guest_holdings(reread=True))
            driver.guest_holdings()
            claim = _median_ms(driver.guest_holdings)
            ours = GuestSpec(str(uuid.uuid4()), "bench-ours", 1, 64)
            driver.update_guest(ours)
            after = []
            for _ in range(REPEATS):
                driver.update_guest(ours)
                start = time.perf_counter()
                driver.guest_holdings()
                after.append(time.perf_counter() - start)
            driver.destroy(ours.instance_uuid)
            results.append({"case": "guest_holdings", "guests": count,
                            "reread_ms": reread, "claim_ms": claim,
                            "after_a_change_ms": round(statistics.median(after) * 1000, 2)})
    finally:
        driver.cleanup()
        daemon.close()
    return results
