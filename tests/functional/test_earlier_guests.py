"""Guests an earlier version of this agent defined, redefined by today's:
through the agent's manager and reconcile, on libvirt's test driver (every
device kind) and on a real libvirtd running QEMU/KVM (a pinned host CPU,
what QEMU here can really hold); a live migration between two real
libvirtds.

Each guest is built by today's agent, so its store rows are real, and its
domain is then replaced by the definition an earlier version wrote for the
same devices (tests/functional/earlier_guests.py: named after the
instance, no title, no ACPI, and at d1b250d no VF MAC), and started: the
host as the upgrade left it.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import libvirt
import pytest
from lxml import etree

from compute_agent.cmd.common import load_config
from compute_agent.compute.reconcile import ReconcileInputs, reconcile
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec
from compute_agent.drivers.migration import DeviceMove, LiveMigrationTarget
from tests.contract.test_driver_contract import libvirt_driver
from tests.functional.earlier_guests import DERIVED_MAC, NO_MAC, earlier_domain_xml
from tests.functional.helpers import placement_tree, write_conf
from tests.functional.libvirt_host import GPU, PF, Host

NAME = "web"  # an earlier version's domain name: the instance's


@dataclass
class World:
    """An agent on a host, the allocations of one guest there, and the
    shape of the definitions its earlier version wrote."""

    agent: Agent
    allocations: Callable[[], dict]
    shape: str
    spec: dict
    made: list[str] = field(default_factory=list)


def on_the_test_driver(tmp_path, placement) -> World:
    h = Host(tmp_path, placement.url)
    h.build_default()
    h.make_agent()
    h.cycle()

    def allocations() -> dict:
        tree = h.tree()
        return {tree[h.p("numa_1")]["uuid"]: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}},
                tree[h.p(PF.upper())]["uuid"]: {"resources": {"SRIOV_NET_VF": 1}},
                tree[h.p("pci_" + GPU.replace(":", "_").replace(".", "_"))]["uuid"]:
                    {"resources": {"VGPU": 1}},
                tree[h.p("pmem_64G_numa_1")]["uuid"]:
                    {"resources": {"CUSTOM_PMEM_NAMESPACE_64G": 1}}}

    # d1b250d, the first version with guests, wrote no VF MAC.
    return World(h.agent, allocations, NO_MAC, {"name": NAME, "vcpus": 2, "memory_mb": 1024})


def on_qemu(tmp_path, placement, uri: str) -> World:
    assert os.cpu_count() >= 2, "the resize needs two host CPUs to move between"
    (tmp_path / "sys").mkdir()
    path = write_conf(
        tmp_path, placement.url, f"old-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(tmp_path / "sys")},
        libvirt={"connection_uri": uri, "instances_path": str(tmp_path / "instances")},
        compute={"cpu_dedicated_set": "0-1"})
    agent = compose(load_config(["--config-file", str(path)]))
    agent.driver.init_host()
    outcome = agent.run_cycle()
    assert outcome.ok, outcome.reason

    def allocations() -> dict:
        cell = placement_tree(placement.url, agent.policy.root_uuid)[
            f"{agent.policy.host}_numa_0"]["uuid"]
        return {cell: {"resources": {"PCPU": 1, "MEMORY_MB": 64}}}

    # The last shape before 88f9c57: a derived VF MAC (no VF here anyway).
    return World(agent, allocations, DERIVED_MAC, {"name": NAME, "vcpus": 1, "memory_mb": 64})


@pytest.fixture(params=["libvirt-test", "libvirt-qemu"])
def world(request, tmp_path, placement):
    if request.param == "libvirt-qemu":
        w = on_qemu(tmp_path, placement, request.getfixturevalue("private_libvirtd").uri)
    else:
        w = on_the_test_driver(tmp_path, placement)
    yield w
    for instance in w.made:
        w.agent.manager.delete_instance(instance)
    w.agent.driver.cleanup()
    w.agent.manager.tracker.store.close()


def earlier_guest(w: World) -> str:
    """A running guest whose domain an earlier version defined."""
    instance = str(uuid.uuid4())
    w.made.append(instance)
    w.agent.manager.build_instance(instance, w.spec, w.allocations())
    guest = w.agent.manager.host.guest(instance)
    w.agent.driver.destroy(instance)
    define_as_earlier(w, replace(guest, name=NAME), start=True)
    assert domain_name(w, instance) == NAME
    return instance


def define_as_earlier(w: World, guest, start: bool) -> None:
    def define(conn: libvirt.virConnect) -> None:
        dom = conn.defineXML(earlier_domain_xml(guest, w.shape))
        if start and not dom.isActive():
            dom.create()
    # The test driver's domains live in the agent's own connection.
    w.agent.driver._conn.call(define)


def domain_name(w: World, instance: str) -> str:
    return etree.fromstring(w.agent.driver.guest_definition(instance)).findtext("name")


def held(w: World, instance: str) -> tuple[frozenset[str], frozenset[str]]:
    """(live, saved) assignment ids of the guest, which must run."""
    state = w.agent.driver.guest_state(instance)
    assert state is not None and state.running, f"guest {instance} is not running"
    return state.live, state.saved


def test_bug_a_retried_build_of_a_running_guest_an_earlier_version_named_keeps_it(world):
    """Before the fix the retried spawn failed on the name, and the failed
    build destroyed the running guest and gave its devices back."""
    instance = earlier_guest(world)
    before = held(world, instance)
    _, rows, _ = world.agent.manager.tracker.instance(instance)

    world.agent.manager.build_instance(instance, world.spec, world.allocations())

    assert held(world, instance) == before
    assert world.agent.manager.tracker.instance(instance)[1] == rows
    assert domain_name(world, instance) == NAME


def test_bug_update_guest_of_a_guest_an_earlier_version_named(world):
    instance = earlier_guest(world)
    live, saved = held(world, instance)
    world.agent.manager.redefine_guest(instance)
    assert held(world, instance) == (live, saved)
    assert domain_name(world, instance) == NAME

    world.agent.driver.power_off(instance)
    world.agent.manager.redefine_guest(instance)
    state = world.agent.driver.guest_state(instance)
    assert not state.running and state.saved == saved
    assert domain_name(world, instance) == NAME


def test_bug_reconcile_redefines_a_guest_an_earlier_version_named(world):
    """A saved definition that lacks one of the store's devices is
    redefined from the store, under the name it has."""
    instance = earlier_guest(world)
    guest = world.agent.manager.host.guest(instance)
    lacking = replace(guest, name=NAME, devices=guest.devices[1:])
    define_as_earlier(world, lacking, start=False)
    live, saved = held(world, instance)
    assert saved == frozenset(d.assignment_id for d in lacking.devices) != live

    report = reconcile(world.agent.manager, ReconcileInputs(None, at_start=False))

    assert [(f.kind, f.fixed) for f in report.findings] == [("guest_devices_differ", True)]
    assert held(world, instance) == (live, live)
    assert domain_name(world, instance) == NAME


def test_bug_same_host_resize_of_a_guest_an_earlier_version_named(world):
    """finish_resize stops the guest and starts it on its new devices, and
    revert on its old ones, each through a definition: under the name an
    earlier version gave it."""
    m = world.agent.manager
    instance = earlier_guest(world)
    first, _ = held(world, instance)

    for end in ("revert", "confirm"):
        migration = str(uuid.uuid4())
        m.prep_resize(migration, instance, world.spec, world.allocations())
        m.resize_instance(migration, instance)
        m.finish_resize(migration, instance)
        moved, saved = held(world, instance)
        assert moved == saved and not moved & first
        assert domain_name(world, instance) == NAME
        if end == "revert":
            m.revert_resize(migration, instance)
            assert held(world, instance) == (first, first)
        else:
            m.confirm_resize(migration, instance)
            assert held(world, instance) == (moved, moved)
        assert domain_name(world, instance) == NAME


# --- live migration, between two real libvirtds -------------------------------------

def pinned_guest(instance: str, which: str, cpu: int) -> GuestSpec:
    return GuestSpec(instance, NAME, 1, 64, (
        GuestDevice(f"{which}-pcpu", DeviceKind.PCPU, str(cpu), cpus=frozenset({cpu}),
                    detail=DeviceDetail(numa_node=0)),
        GuestDevice(f"{which}-numa", DeviceKind.NUMA, "0")))


def test_bug_a_guest_an_earlier_version_named_live_migrates_to_a_host_with_its_name_taken(
        tmp_path, two_private_libvirtds):
    """Earlier versions named domains after their instances, which two
    hosts may share ("web"): the guest arrives named by its uuid, rather
    than refused for the name ("domain 'web' already exists")."""
    daemons = two_private_libvirtds
    source, dest = (libvirt_driver(tmp_path / d.root.name, d.uri, tmp_path / "sys")
                    for d in daemons)
    moving = pinned_guest(str(uuid.uuid4()), "a", 0)
    there = pinned_guest(str(uuid.uuid4()), "c", 1)
    arrived = pinned_guest(moving.instance_uuid, "b", 0)
    try:
        for driver, guest in ((source, moving), (dest, there)):
            driver._conn.call(lambda conn, guest=guest:
                              conn.defineXML(earlier_domain_xml(guest)).create())

        source.live_migrate(moving.instance_uuid, daemons[1].uri, LiveMigrationTarget(
            moving.instance_uuid, tuple(DeviceMove(s, d) for s, d in
                                        zip(moving.devices, arrived.devices))))

        state = dest.guest_state(moving.instance_uuid)
        assert state.running and state.live == state.saved == {"b-pcpu", "b-numa"}
        for live in (False, True):
            assert etree.fromstring(dest.guest_definition(
                moving.instance_uuid, live=live)).findtext("name") == \
                f"instance-{moving.instance_uuid}"
        assert etree.fromstring(dest.guest_definition(
            there.instance_uuid, live=True)).findtext("name") == NAME
        assert source.guest_state(moving.instance_uuid) is None
    finally:
        for driver in (source, dest):
            for instance in (moving.instance_uuid, there.instance_uuid):
                driver.destroy(instance)
            driver.cleanup()
