"""The hypervisor's live state is a veto: whatever the store says, a device
that a guest's domain holds (running: its live XML; defined: its
definition) is never chosen for a claim. Issue 23's case: a store that
forgot two acknowledged builds (a write-ahead log emptied after kill -9)
gave the next build VF 0000:81:10.2, which a forgotten guest still held.

Here the store forgets as that did, but in a way no start check sees: rows
deleted from the SQLite file under a stopped tracker, then a new tracker
over the same hypervisor. On libvirt's test driver (VFs, vGPU mdevs and
pmem namespaces of a fake sysfs, as tests/functional/libvirt_host.py
makes them) and on a real libvirtd with QEMU/KVM, where no host device may
be given to a guest: there a running QEMU guest holds a pinned host CPU,
and a defined one a pmem namespace's device.
"""
from __future__ import annotations

import json
import sqlite3
import uuid

import pytest
from lxml import etree

from compute_agent.claims.model import Owner
from compute_agent.cmd.common import load_config
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt.guest_xml import build_domain_xml
from compute_agent.exception import ClaimFailed
from compute_agent.store.store import Store
from tests.functional.helpers import placement_tree, write_conf
from tests.functional.libvirt_host import GPU, PF, Host
from tests.functional.nova_host import nova_domain_xml

SPEC = {"name": "veto", "vcpus": 1, "memory_mb": 256}
ISSUE_VF = "0000:81:10.2"
PMEM_64G = "CUSTOM_PMEM_NAMESPACE_64G"


def forget(agent: Agent, instances: list[str]) -> None:
    """The store loses these instances as an emptied write-ahead log loses
    acknowledged commits, with nothing to tell: the rows go from the file
    while no tracker holds it, and a new tracker and manager (the agent's
    next start) read it over the same hypervisor."""
    store = agent.manager.tracker.store
    store.close()
    db = sqlite3.connect(store.path)
    with db:
        marks = ",".join("?" * len(instances))
        db.execute(f"DELETE FROM assignments WHERE instance_uuid IN ({marks})", instances)
        db.execute(f"DELETE FROM instances WHERE uuid IN ({marks})", instances)
    db.close()
    agent.manager = ComputeManager(Tracker(Store(store.path), agent.driver.boot_id()),
                                   agent.driver)


def held(agent: Agent, instance: str) -> dict[str, str]:
    """The instance's own devices, by kind: VF address, mdev UUID, pmem
    device path, pinned CPU."""
    _, rows, _ = agent.manager.tracker.instance(instance)
    return {a.kind.value: a.detail.dev_path or a.device_id for a in rows
            if a.owner is Owner.INSTANCE and a.kind.value in ("vf", "mdev", "pmem", "pcpu")}


def findings(agent: Agent) -> list[tuple[str, str]]:
    """The audit's findings on guests and what they hold (Placement,
    which these tests give no allocations, has its own)."""
    report = agent.reconcile(at_start=False, fix=False)
    return sorted((f.kind, f.subject) for f in report.findings
                  if f.kind in ("guest_without_assignments", "device_held_outside_the_store"))


# --- libvirt's test driver: a VF, an mdev and a pmem namespace ----------------

@pytest.fixture
def host(tmp_path, placement):
    h = Host(tmp_path, placement.url)
    b = h.sys
    b.add_numa_node(0, "0-3", 8192)
    b.add_numa_node(1, "4-7", 8192)
    b.add_pf(PF, "8086", "10fb", "10ed", numa_node=1, total_vfs=8, num_vfs=5,
             driver="ixgbe", vf_driver="ixgbevf")
    b.add_mdev_parent(GPU, 1, {"nvidia-35": ("GRID M60-2Q", 3)})
    for index in range(3):
        b.add_pmem_namespace(1, index, 64 << 30, 1, alt_name=f"ns{index}")
    vfs = json.dumps({"vendor_id": "8086", "product_id": "10ed",
                      "resource_class": "SRIOV_NET_VF"})
    h.make_agent(pci={"device_spec": [vfs]}, devices={"enabled_mdev_types": "nvidia-35"},
                 pmem={"namespaces": "64G:ns0|ns1|ns2"})
    h.cycle()
    yield h
    h.agent.manager.tracker.store.close()
    h.agent.driver.cleanup()


def allocations(h: Host, pmem: bool = True, vgpu: bool = True) -> dict:
    tree = h.tree()
    out = {tree[h.p("numa_1")]["uuid"]: {"resources": {"VCPU": 1, "MEMORY_MB": 256}},
           tree[h.p(PF.upper())]["uuid"]: {"resources": {"SRIOV_NET_VF": 1}}}
    if vgpu:
        gpu = h.p("pci_" + GPU.replace(":", "_").replace(".", "_"))
        out[tree[gpu]["uuid"]] = {"resources": {"VGPU": 1}}
    if pmem:
        out[tree[h.p("pmem_64G_numa_1")]["uuid"]] = {"resources": {PMEM_64G: 1}}
    return out


def build(h: Host, pmem: bool = True, vgpu: bool = True) -> str:
    """A build; the kernel makes the mdev it asked for (a fake sysfs does
    nothing by itself)."""
    instance = str(uuid.uuid4())
    try:
        h.agent.manager.build_instance(instance, SPEC, allocations(h, pmem, vgpu))
    finally:
        h.sys.answer_mdev_writes()
    return instance


def test_bug_a_build_got_a_device_a_guest_the_store_forgot_still_held(host):
    agent = host.agent
    forgotten = [build(host), build(host)]
    lost = {i: held(agent, i) for i in forgotten}
    forget(agent, forgotten)
    host.cycle()  # the first cycle after the start: pools and guests read

    # The first build after the loss: nothing the forgotten guests hold.
    after = build(host)
    got = held(agent, after)
    assert got["vf"] == ISSUE_VF
    for kind in ("vf", "mdev", "pmem"):
        assert got[kind] not in {lost[i][kind] for i in forgotten}, (kind, got, lost)

    # Reconcile reports each forgotten guest and each device it holds.
    assert findings(agent) == sorted(
        [("guest_without_assignments", i) for i in forgotten]
        + [("device_held_outside_the_store", i) for i in forgotten for _ in range(3)])

    # Out of every pool: the GPU's three vGPUs and the three namespaces
    # have nothing more to give.
    with pytest.raises(ClaimFailed, match=PMEM_64G):
        build(host, vgpu=False)
    with pytest.raises(ClaimFailed, match="VGPU"):
        build(host, pmem=False)
    # A guest of another manager, without our metadata, defined by hand,
    # holds a VF too.
    stranger, spare = str(uuid.uuid4()), "0000:81:10.3"
    agent.driver._conn.call(lambda conn: conn.defineXML(nova_domain_xml(
        stranger, 7, "defined-by-hand", 1, 64, pci=(spare,))))
    assert held(agent, build(host, pmem=False, vgpu=False))["vf"] == "0000:81:10.4"
    with pytest.raises(ClaimFailed, match="SRIOV_NET_VF"):
        build(host, pmem=False, vgpu=False)
    host.cycle()  # a cycle's full reread keeps them out
    with pytest.raises(ClaimFailed, match="SRIOV_NET_VF"):
        build(host, pmem=False, vgpu=False)

    # The operator decides: the forgotten instance is deleted (its guest
    # with it), the stranger undefined. Their devices come back.
    agent.manager.delete_instance(forgotten[0])
    agent.driver._conn.call(lambda conn: conn.lookupByUUIDString(stranger).undefine())
    host.cycle()
    assert held(agent, build(host)) == lost[forgotten[0]]
    assert held(agent, build(host, pmem=False, vgpu=False))["vf"] == spare


# --- a real libvirtd with QEMU/KVM: a pinned CPU and a pmem namespace --------

@pytest.fixture
def qemu_agent(tmp_path, placement, private_libvirtd):
    sysfs = SysfsBuilder(tmp_path / "sys")
    sysfs.add_pmem_namespace(0, 0, 64 << 30, 0, alt_name="ns0")
    path = write_conf(
        tmp_path, placement.url, f"veto-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(sysfs.root)},
        libvirt={"connection_uri": private_libvirtd.uri,
                 "instances_path": str(tmp_path / "instances")},
        compute={"cpu_dedicated_set": "0-1"}, pmem={"namespaces": "64G:ns0"})
    agent = compose(load_config(["--config-file", str(path)]))
    agent.driver.init_host()
    outcome = agent.run_cycle()
    assert outcome.ok, outcome.reason
    yield agent
    agent.driver.cleanup()
    agent.manager.tracker.store.close()


def define(agent: Agent, xml: str, start: bool) -> None:
    def act(conn) -> None:
        dom = conn.defineXML(xml)
        if start:
            dom.create()
    agent.driver._conn.call(act)


def live_pins(agent: Agent, instance: str) -> list[str]:
    root = etree.fromstring(agent.driver.guest_definition(instance, live=True).encode())
    return [p.get("cpuset") for p in root.iterfind("cputune/vcpupin")]


def test_a_running_qemu_guest_the_store_does_not_know_keeps_its_cpu_and_pmem(
        qemu_agent, placement):
    agent = qemu_agent
    tree = placement_tree(placement.url, agent.policy.root_uuid)
    cell = tree[f"{agent.policy.host}_numa_0"]["uuid"]
    pmem = tree[f"{agent.policy.host}_pmem_64G_numa_0"]["uuid"]
    pcpu = {cell: {"resources": {"PCPU": 1, "MEMORY_MB": 64}}}
    # Running on QEMU, pinned to host CPU 0, defined by hand; and a build
    # of ours the store forgot, only defined, whose nvdimm is the
    # namespace's device: neither is in the store.
    running, defined = str(uuid.uuid4()), str(uuid.uuid4())
    define(agent, nova_domain_xml(running, 1, "running-by-hand", 1, 64, pinned=(0,)), True)
    define(agent, build_domain_xml(GuestSpec(defined, "forgotten", 1, 64, (
        GuestDevice(str(uuid.uuid4()), DeviceKind.PMEM, "ns0", detail=DeviceDetail(
            numa_node=0, size_bytes=64 << 20, dev_path="/dev/dax0.0")),))), False)

    built = str(uuid.uuid4())
    agent.manager.build_instance(built, {**SPEC, "memory_mb": 64}, pcpu)
    try:
        assert agent.driver.guest_is_running(built)
        assert held(agent, built)["pcpu"] == "1" and live_pins(agent, built) == ["1"]
        with pytest.raises(ClaimFailed, match="PCPU"):
            agent.manager.build_instance(str(uuid.uuid4()), {**SPEC, "memory_mb": 64}, pcpu)
        with pytest.raises(ClaimFailed, match=PMEM_64G):
            agent.manager.build_instance(
                str(uuid.uuid4()), {**SPEC, "memory_mb": 64},
                {cell: {"resources": {"MEMORY_MB": 64}},
                 pmem: {"resources": {PMEM_64G: 1}}})
        assert agent.manager.tracker.snapshot()[0].keys() == {built}
        assert [f for f in findings(agent) if f[0] == "device_held_outside_the_store"] == \
            sorted([("device_held_outside_the_store", running),
                    ("device_held_outside_the_store", defined)])
        # The operator stops and undefines the guest by hand: CPU 0 is free.
        agent.driver.destroy(running)
        other = str(uuid.uuid4())
        agent.manager.build_instance(other, {**SPEC, "memory_mb": 64}, pcpu)
        assert held(agent, other)["pcpu"] == "0" and live_pins(agent, other) == ["0"]
        agent.manager.delete_instance(other)
    finally:
        agent.manager.delete_instance(built)
        agent.driver.destroy(running)
        agent.driver.destroy(defined)
