"""A real QEMU/KVM guest live-migrated between two real libvirtds on this
machine (tests/functional/private_services.py: each in a mount namespace
of its own, with its own host UUID and migration ports), through the
libvirt driver's ``live_migrate``.

No host device may be given to a guest here, so the guest holds stand-ins
that QEMU really runs and that differ per host: a pinned host CPU (CPU 0
on A, CPU 1 on B) and an nvdimm backed by a file in each daemon's own
directory, standing in for a dax device. The nvdimm's content is the
guest's memory: finding A's bytes in B's file shows the guest's state
moved, not only its definition.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path

import libvirt
import pytest

from compute_agent.drivers.base import (
    DeviceDetail,
    DeviceKind,
    GuestDevice,
    GuestSpec,
    HostResource,
    HostResourceKind,
    MigrationFailure,
)
from compute_agent.drivers.errors import LiveMigrationError
from compute_agent.drivers.libvirt.driver import LibvirtDriver
from compute_agent.drivers.libvirt.guest_xml import domain_name
from tests.contract.test_driver_contract import libvirt_driver, target
from tests.functional.helpers import wait_for

PMEM_BYTES = 64 << 20
MARK = b"compute-agent live migration\n"


def guest(instance: str, pmem: Path, cpu: int, which: str) -> GuestSpec:
    return GuestSpec(instance, f"livemig-{instance[:8]}", 1, 64, (
        GuestDevice(f"{which}-pcpu", DeviceKind.PCPU, str(cpu), cpus=frozenset({cpu}),
                    detail=DeviceDetail(numa_node=0)),
        GuestDevice(f"{which}-numa", DeviceKind.NUMA, "0"),
        GuestDevice(f"{which}-pmem", DeviceKind.PMEM, f"ns-{which}",
                    detail=DeviceDetail(numa_node=0, size_bytes=PMEM_BYTES,
                                        dev_path=str(pmem)))))


class Hosts:
    """Host A and host B: a daemon, a driver on it, and a directory for
    the pmem stand-in files of each."""

    def __init__(self, tmp_path: Path, daemons):
        self.daemons = dict(zip("ab", daemons))
        self.drivers: dict[str, LibvirtDriver] = {
            w: libvirt_driver(tmp_path / w, d.uri, tmp_path / w / "sys")
            for w, d in self.daemons.items()}
        self.made: list[str] = []

    def pmem(self, which: str, instance: str, content: bytes = b"") -> Path:
        path = self.daemons[which].root / f"pmem-{instance}"
        with open(path, "wb") as f:
            f.write(content)
            f.truncate(PMEM_BYTES)
        return path

    def spawn_on_a(self) -> tuple[GuestSpec, GuestSpec]:
        """A guest running on A, and what it is to run with on B."""
        instance = str(uuid.uuid4())
        self.made.append(instance)
        a = guest(instance, self.pmem("a", instance, MARK), 0, "a")
        b = guest(instance, self.pmem("b", instance), 1, "b")
        self.drivers["a"].spawn(a)
        return a, b

    def close(self) -> None:
        for driver in self.drivers.values():
            for instance in self.made:
                driver.destroy(instance)
            driver.cleanup()


@pytest.fixture
def hosts(tmp_path, two_private_libvirtds):
    h = Hosts(tmp_path, two_private_libvirtds)
    yield h
    h.close()


def resources(spec: GuestSpec) -> frozenset[HostResource]:
    return frozenset({HostResource(HostResourceKind.HOST_CPU, spec.devices[0].device_id),
                      HostResource(HostResourceKind.BACKING_PATH,
                                   spec.devices[2].detail.dev_path)})


def ids(spec: GuestSpec) -> frozenset[str]:
    return frozenset(d.assignment_id for d in spec.devices)


def assert_runs_on_a_only(hosts: Hosts, a: GuestSpec) -> None:
    state = hosts.drivers["a"].guest_state(a.instance_uuid)
    assert state.running
    assert state.live == state.saved == ids(a)
    assert state.live_resources == resources(a)
    assert hosts.drivers["b"].guest_state(a.instance_uuid) is None
    assert hosts.daemons["b"].domain(a.instance_uuid) is None


def test_a_running_guest_moves_live_to_b_and_runs_there_on_bs_devices(hosts):
    a, b = hosts.spawn_on_a()
    started = time.monotonic()
    hosts.drivers["a"].live_migrate(a.instance_uuid, hosts.daemons["b"].uri,
                                    target(a, b))
    took = time.monotonic() - started

    # B runs it, live, with B's CPU and B's file, and keeps it defined
    # with B's devices and our metadata naming B's assignments.
    state = hosts.drivers["b"].guest_state(a.instance_uuid)
    assert state.running
    assert state.live == state.saved == ids(b)
    assert state.live_resources == resources(b)
    assert hosts.daemons["b"].domain(a.instance_uuid).isPersistent()
    live = hosts.drivers["b"].guest_definition(a.instance_uuid, live=True)
    assert b.devices[2].detail.dev_path in live
    assert "cpuset='1'" in live and "cpuset='0'" not in live
    # The guest's memory came along: A's bytes are in B's nvdimm file.
    with open(b.devices[2].detail.dev_path, "rb") as f:
        assert f.read(len(MARK)) == MARK
    # A holds nothing: neither running nor defined.
    assert hosts.daemons["a"].domain(a.instance_uuid) is None
    assert hosts.drivers["a"].guest_state(a.instance_uuid) is None
    assert a.instance_uuid not in hosts.drivers["a"].list_guests()
    # About 3 s here, most of it the source's QEMU and cgroup teardown.
    assert took < 20


def slowed_on_a(hosts: Hosts, instance: str) -> tuple[libvirt.virConnect,
                                                      libvirt.virDomain]:
    """The guest's domain on A, its migrations slowed to 1 MiB/s (through
    libvirt, not the driver) so that a transfer is still under way when the
    test acts; the connection is the caller's to close."""
    conn = libvirt.open(hosts.daemons["a"].uri)
    dom = conn.lookupByUUIDString(instance)
    dom.migrateSetMaxSpeed(1, 0)
    return conn, dom


def wait_until_mid_way(hosts: Hosts, dom: libvirt.virDomain,
                       mover: threading.Thread) -> None:
    """Until B's QEMU is up and A has sent some of the memory."""
    def mid_way() -> bool:
        assert mover.is_alive()
        return (hosts.daemons["b"].domain(dom.UUIDString()) is not None
                and dom.jobStats().get("memory_processed", 0) > 0)
    wait_for(mid_way, timeout=30, interval=0.05)


def test_a_migration_whose_destination_qemu_dies_midway_leaves_it_on_a(hosts):
    a, b = hosts.spawn_on_a()
    moves = target(a, b)
    conn, dom = slowed_on_a(hosts, a.instance_uuid)
    raised: list[Exception] = []

    def migrate() -> None:
        try:
            hosts.drivers["a"].live_migrate(a.instance_uuid, hosts.daemons["b"].uri,
                                            moves)
        except Exception as exc:  # handed to the test's thread
            raised.append(exc)

    mover = threading.Thread(target=migrate)
    mover.start()
    try:
        wait_until_mid_way(hosts, dom, mover)
        os.kill(hosts.daemons["b"].qemu_pid(domain_name(a.instance_uuid)),
                signal.SIGKILL)
    finally:
        mover.join(60)
        conn.close()
    assert not mover.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], LiveMigrationError), raised
    assert raised[0].cause is MigrationFailure.ABORTED
    assert a.instance_uuid in str(raised[0]) and hosts.daemons["b"].uri in str(raised[0])
    assert_runs_on_a_only(hosts, a)


def test_a_destination_that_cannot_start_the_guest_refuses_and_a_keeps_it(hosts):
    """B is given a backing file it does not have: its QEMU cannot start,
    so the incoming migration is refused before anything moves."""
    a, b = hosts.spawn_on_a()
    missing = hosts.daemons["b"].root / "no-such-pmem"
    b_missing = guest(a.instance_uuid, missing, 1, "b")
    with pytest.raises(LiveMigrationError, match=str(missing)) as caught:
        hosts.drivers["a"].live_migrate(a.instance_uuid, hosts.daemons["b"].uri,
                                        target(a, b_missing))
    assert caught.value.cause is MigrationFailure.ABORTED
    assert_runs_on_a_only(hosts, a)


def test_a_migration_under_way_is_seen_by_a_new_connection_and_not_started_twice(
        tmp_path, hosts):
    """What a restarted agent finds: a driver of its own (a new connection)
    sees the migration an earlier one started still running, and a second
    migration is refused with the outcome unknown (it may still take the
    guest away), never as "no running guest"."""
    a, b = hosts.spawn_on_a()
    moves = target(a, b)
    restarted = libvirt_driver(tmp_path / "restarted", hosts.daemons["a"].uri,
                               tmp_path / "a" / "sys")
    assert not restarted.migrating_out(a.instance_uuid)
    conn, dom = slowed_on_a(hosts, a.instance_uuid)
    incoming: list[int] = []
    mover = threading.Thread(target=hosts.drivers["a"].live_migrate,
                             args=(a.instance_uuid, hosts.daemons["b"].uri, moves))
    mover.start()
    try:
        wait_until_mid_way(hosts, dom, mover)
        # Held mid-way: B's QEMU stopped, the transfer waits for it.
        incoming.append(hosts.daemons["b"].qemu_pid(domain_name(a.instance_uuid)))
        os.kill(incoming[0], signal.SIGSTOP)
        assert restarted.migrating_out(a.instance_uuid)
        with pytest.raises(LiveMigrationError) as caught:
            restarted.live_migrate(a.instance_uuid, hosts.daemons["b"].uri, moves)
        assert caught.value.cause is MigrationFailure.OUTCOME_UNKNOWN, caught.value
        assert "another migration job" in str(caught.value)
    finally:
        if incoming:
            os.kill(incoming[0], signal.SIGCONT)
        mover.join(120)
        conn.close()
        restarted.cleanup()
    assert not mover.is_alive()
    # Once it has ended, the guest is B's and A has no migration of it.
    assert hosts.drivers["b"].guest_state(a.instance_uuid).running
    assert not hosts.drivers["a"].migrating_out(a.instance_uuid)
    assert not hosts.drivers["b"].migrating_out(a.instance_uuid)
