"""Claims through the production libvirt driver: the assignment as the store
and the domain XML show it.

On the test driver, devices of every kind reach the guest definition. The
test driver's domains live as long as its connection, so an agent restart
is a new store, tracker and manager over the same driver (the hypervisor
outlives the agent). On the real libvirtd, a real QEMU guest outlives a
real restart of the agent's connection.
"""
from __future__ import annotations

import math
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from lxml import etree

from compute_agent.claims.model import AssignmentState, Owner
from compute_agent.cmd.common import load_config
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.daemon.composition import compose
from compute_agent.store.queries import live_changed_at
from compute_agent.store.store import Store
from tests.functional.helpers import put_allocations, write_conf
from tests.functional.libvirt_host import GPU, PF, Host

SPEC = {"name": "guest-1", "vcpus": 2, "memory_mb": 1024}
NS = {"ca": "http://compute-agent.openstack.org/xmlns/instance/1"}


@pytest.fixture
def host(tmp_path, placement):
    h = Host(tmp_path, placement.url)
    h.build_default()
    h.make_agent()
    h.cycle()
    yield h
    h.agent.manager.tracker.store.close()
    h.agent.driver.cleanup()


def allocations(h: Host, vcpus=2, memory_mb=1024, vfs=1) -> dict:
    return {h.uuid_of("numa_1"): {"resources": {"VCPU": vcpus, "MEMORY_MB": memory_mb}},
            h.uuid_of(PF.upper()): {"resources": {"SRIOV_NET_VF": vfs}},
            h.uuid_of("pci_" + GPU.replace(":", "_").replace(".", "_")):
                {"resources": {"VGPU": 1}},
            h.uuid_of("pmem_64G_numa_1"): {"resources": {"CUSTOM_PMEM_NAMESPACE_64G": 1}}}


def domain(h: Host, instance: str):
    return etree.fromstring(h.agent.driver.guest_definition(instance).encode())


def devices_in_xml(dom) -> dict[str, list[str]]:
    def pci(addr):
        return (f"{int(addr.get('domain'), 16):04x}:{int(addr.get('bus'), 16):02x}:"
                f"{int(addr.get('slot'), 16):02x}.{int(addr.get('function'), 16)}")
    return {
        "vf": [pci(a) for a in dom.iterfind("devices/interface[@type='hostdev']/source/address")],
        "mdev": [a.get("uuid") for a in dom.iterfind("devices/hostdev[@type='mdev']/source/address")],
        "pmem": [p.text for p in dom.iterfind("devices/memory[@model='nvdimm']/source/path")],
        "numa": [m.get("nodeset") for m in dom.iterfind("numatune/memory")],
    }


def devices_in_store(rows) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"vf": [], "mdev": [], "pmem": [], "numa": []}
    for a in rows:
        if a.owner is Owner.INSTANCE and a.kind.value in out:
            # A namespace reaches the guest as its dax device.
            out[a.kind.value].append(a.detail.dev_path or a.device_id)
    return {k: sorted(set(v)) for k, v in out.items()}


def restart(h: Host) -> None:
    """A new agent process over the same hypervisor: new store handle,
    tracker and manager; the pools come from the next cycle."""
    old = h.agent.manager.tracker
    old.store.close()
    store = Store(old.store.path)
    h.agent.manager = ComputeManager(Tracker(store, h.agent.driver.boot_id()),
                                     h.agent.driver)
    h.cycle()


def test_a_build_puts_every_claimed_device_in_the_domain(host):
    instance = str(uuid.uuid4())
    host.agent.manager.build_instance(instance, SPEC, allocations(host))

    _, rows, _ = host.agent.manager.tracker.instance(instance)
    assert {a.state for a in rows} == {AssignmentState.CLAIMED}
    dom = domain(host, instance)
    in_xml = devices_in_xml(dom)
    in_store = devices_in_store(rows)
    assert in_xml["vf"] == in_store["vf"] and len(in_xml["vf"]) == 1
    assert in_xml["vf"][0].startswith("0000:81:")  # a VF of the PF
    assert in_xml["mdev"] == in_store["mdev"]
    # The GPU's existing free mdev goes first; nothing new is created.
    assert in_xml["mdev"] == ["4b20d080-1b54-4048-85b3-a6a62d165c01"]
    assert len(in_xml["pmem"]) == 1 and in_xml["pmem"][0].startswith("/dev/dax")
    assert in_xml["numa"] == ["1"]
    ids = {e.get("id") for e in dom.iterfind("metadata/ca:instance/ca:assignment",
                                              namespaces=NS)}
    assert ids == {a.id for a in rows}


def test_a_second_guest_gets_a_new_mdev_created_through_sysfs(host):
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    host.agent.manager.build_instance(first, SPEC, allocations(host))
    host.agent.manager.build_instance(second, {**SPEC, "name": "guest-2"},
                                      allocations(host))
    created = devices_in_xml(domain(host, second))["mdev"][0]
    assert created != devices_in_xml(domain(host, first))["mdev"][0]
    create_file = (host.sys.root / "class/mdev_bus" / GPU /
                   "mdev_supported_types/nvidia-35/create")
    assert created in create_file.read_text()


def test_same_host_resize_then_restart_then_revert_restores_the_devices(host):
    instance, migration = str(uuid.uuid4()), str(uuid.uuid4())
    m = host.agent.manager
    m.build_instance(instance, SPEC, allocations(host))
    before = devices_in_xml(domain(host, instance))

    bigger = {**SPEC, "vcpus": 4}
    m.prep_resize(migration, instance, bigger, allocations(host, vcpus=4))
    m.resize_instance(migration, instance)
    m.finish_resize(migration, instance)
    during = devices_in_xml(domain(host, instance))
    assert len(during["vf"]) == 1 and during["vf"] != before["vf"]

    restart(host)
    host.agent.manager.revert_resize(migration, instance)

    assert devices_in_xml(domain(host, instance)) == before
    _, rows, _ = host.agent.manager.tracker.instance(instance)
    assert devices_in_store(rows) == before
    assert {a.owner for a in rows} == {Owner.INSTANCE}


def test_same_host_resize_then_restart_then_confirm_keeps_only_the_new(host):
    instance, migration = str(uuid.uuid4()), str(uuid.uuid4())
    m = host.agent.manager
    m.build_instance(instance, SPEC, allocations(host))
    before = devices_in_xml(domain(host, instance))
    m.prep_resize(migration, instance, {**SPEC, "vcpus": 4},
                  allocations(host, vcpus=4))
    m.resize_instance(migration, instance)
    m.finish_resize(migration, instance)
    after = devices_in_xml(domain(host, instance))

    restart(host)
    host.agent.manager.confirm_resize(migration, instance)

    # Nothing of the old set is held any more, by anyone.
    live = host.agent.manager.tracker.snapshot()[1]
    assert {a.owner for a in live} == {Owner.INSTANCE}
    assert devices_in_store(live) == after
    assert after["vf"] != before["vf"]


def test_audit_reports_a_guest_deleted_behind_the_agents_back(host):
    instance = str(uuid.uuid4())
    put_allocations(host.url, instance, allocations(host))
    host.agent.manager.build_instance(instance, SPEC, allocations(host))
    assert host.agent.reconcile(at_start=False, fix=False).consistent

    held = host.agent.manager.tracker.snapshot()[1]
    host.agent.driver.destroy(instance)
    # Within orphan_grace_period (300 s by default) it is reported, and
    # even a fixing reconcile leaves the devices held.
    report = host.agent.reconcile(at_start=False, fix=True)
    assert not report.consistent
    assert [(f.kind, f.subject, f.fixed) for f in report.findings] == [
        ("assignment_without_guest", instance, False)]
    assert host.agent.manager.tracker.snapshot()[1] == held
    # Once the assignments have been unchanged for longer, fixing gives the
    # devices back: the agent's clock is set to the last instant before the
    # grace period ends, then to its end (both exact: 0.5 s is a whole
    # number of a wall-clock time's steps).
    host.agent.settings = replace(host.agent.settings, orphan_grace_period=0.5)
    changed = host.agent.manager.tracker.store.read(live_changed_at)[instance]
    host.agent.wall_clock = lambda: math.nextafter(changed + 0.5, 0)
    report = host.agent.reconcile(at_start=False, fix=True)
    assert [(f.kind, f.subject, f.fixed) for f in report.findings] == [
        ("assignment_without_guest", instance, False)]
    assert host.agent.manager.tracker.snapshot()[1] == held
    host.agent.wall_clock = lambda: changed + 0.5
    report = host.agent.reconcile(at_start=False, fix=False)
    assert [(f.kind, f.subject) for f in report.findings] == [
        ("assignment_without_guest", instance)]
    assert host.agent.reconcile(at_start=False, fix=True).consistent
    assert host.agent.manager.tracker.snapshot()[1] == []


# --- the real hypervisor -----------------------------------------------------

@pytest.fixture
def real_agent(tmp_path, placement, private_libvirtd):
    path = write_conf(
        tmp_path, placement.url, f"realvm-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": "/sys"},
        libvirt={"connection_uri": private_libvirtd.uri,
                 "instances_path": str(tmp_path / "instances")})
    agent = compose(load_config(["--config-file", str(path)]))
    agent.start()
    yield agent, path
    agent.stop()


def test_a_real_guest_survives_an_agent_restart_and_is_audited_clean(
        tmp_path, placement, real_agent):
    agent, conf = real_agent
    tree = {p.name: p.uuid for p in agent.sync.cache}
    cell = tree[f"{agent.policy.host}_numa_0"]
    instance = str(uuid.uuid4())
    # Only CPUs and memory: no device of this machine is ever given away.
    wanted = {cell: {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}
    put_allocations(placement.url, instance, wanted)
    agent.manager.build_instance(
        instance, {"name": f"ca-test-{instance[:8]}", "vcpus": 1, "memory_mb": 64},
        wanted)
    try:
        assert agent.driver.guest_is_running(instance)
        agent.stop()

        # A new process: a new connection to libvirtd and the same store.
        audit = subprocess.run(
            [str(Path(sys.executable).parent / "compute-agent-manage"),
             "--config-file", str(conf), "audit", "--json"],
            capture_output=True, text=True, timeout=120)
        assert audit.returncode == 0, audit.stdout + audit.stderr

        again = compose(load_config(["--config-file", str(conf)]))
        again.start()
        try:
            assert again.driver.guest_is_running(instance)
            assert again.manager.get_instance(instance)["running"]
            dom = etree.fromstring(again.driver.guest_definition(instance).encode())
            assert dom.find("numatune/memory").get("nodeset") == "0"
            again.manager.delete_instance(instance)
            assert not again.driver.guest_is_running(instance)
            assert again.manager.tracker.snapshot()[1] == []
        finally:
            again.stop()
    finally:
        agent.driver.destroy(instance)
