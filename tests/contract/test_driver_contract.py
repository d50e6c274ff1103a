"""The driver contract: one suite every driver must pass.

- ``fake``: compute_agent/drivers/fake.py, which our users' tests run against;
- ``libvirt-test``: the libvirt driver on libvirt's test driver, with a
  sysfs tree of our own (VFs, a GPU with mdev types);
- ``libvirt-qemu``: the libvirt driver on this machine's real libvirtd
  with QEMU/KVM. No host device may be given to a guest here, so its guests
  hold what QEMU can really run: pinned host CPUs, a NUMA cell, and
  persistent memory backed by a file standing in for a dax device.

What it pins is what the agent relies on: a running guest keeps the
devices it was started with until it is stopped and started again; its
live devices and its saved definition are told apart; stop, start and
destroy are idempotent; the assignment ids written into a guest come back.
A live migration moves a running guest whole to the destination's devices,
or refuses and leaves it where it was.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.drivers.base import (
    DeviceDetail,
    DeviceKind,
    ForeignGuest,
    GuestDevice,
    GuestHolding,
    GuestSpec,
    HostResource,
    HostResourceKind,
    Mdev,
    MigrationFailure,
    device_resources,
)
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import LiveMigrationError, MdevError
from compute_agent.drivers.fake import FakeDriver, FakeNetwork
from compute_agent.drivers.fake_sysfs import SysfsBuilder, VgpuCard, vf_address
from compute_agent.drivers.libvirt.driver import LibvirtDriver
from compute_agent.drivers.migration import DeviceMove, LiveMigrationTarget
from tests.functional.helpers import wait_for, write_conf
from tests.functional.nova_host import nova_domain_xml

PF = "0000:81:00.0"
GPU = "0000:06:00.0"
MDEV_TYPE = "nvidia-35"
# A GPU in NVIDIA's vendor-specific VFIO layout, and its first VF.
VGPU_PF = "0000:41:00.0"
VGPU_VF = "0000:41:10.0"
VGPU_TYPES = {557: "NVIDIA L40-12Q", 558: "NVIDIA L40-24Q"}


@dataclass
class Subject:
    """A driver under test and the two device sets its host can run (as a
    resize would move a guest from one to the other)."""

    driver: ComputeDriver
    devices: Callable[[str], tuple[GuestDevice, ...]]  # "a" or "b" -> devices
    mdev_parent: tuple[str, str]  # a parent and a type it offers
    # What a guest of nova's on this host can hold: PCI addresses, mdev
    # UUIDs, pinned CPUs ("a" or "b" -> them).
    foreign_devices: Callable[[str], tuple[tuple[str, ...], tuple[str, ...],
                                           tuple[int, ...]]] = lambda w: ((), (), ())
    # What the host's kernel does after the driver writes to sysfs: a fake
    # tree does nothing by itself.
    kernel: Callable[[], None] = lambda: None
    # A host reboot, the hypervisor's view of it: no VFs, no mdevs.
    reboot: Callable[[], None] = lambda: None
    # A vendor-specific VFIO VF and two types it lists.
    vgpu_vf: tuple[str, tuple[str, str]] = (VGPU_VF, ("nvidia-557", "nvidia-558"))

    def guest(self, which: str, instance: str | None = None) -> GuestSpec:
        instance = instance or str(uuid.uuid4())
        return GuestSpec(instance, f"contract-{instance[:8]}", 2, 64,
                         self.devices(which))


def device_set(which: str, vf: str, mdev: str | None, pmem_path: str, cpu: int,
               cell: int) -> tuple[GuestDevice, ...]:
    """Assignment ids are prefixed with the set's name, so a guest's ids
    say which set it holds."""
    devices = [GuestDevice(f"{which}-pcpu", DeviceKind.PCPU, str(cpu),
                           cpus=frozenset({cpu}), detail=DeviceDetail(numa_node=cell)),
               GuestDevice(f"{which}-numa", DeviceKind.NUMA, str(cell)),
               GuestDevice(f"{which}-pmem", DeviceKind.PMEM, f"ns-{which}",
                           detail=DeviceDetail(numa_node=cell, size_bytes=64 << 20,
                                               dev_path=pmem_path))]
    if vf:
        devices.append(GuestDevice(f"{which}-vf", DeviceKind.VF, vf,
                                   detail=DeviceDetail(numa_node=cell)))
    if mdev:
        devices.append(GuestDevice(f"{which}-mdev", DeviceKind.MDEV, mdev,
                                   detail=DeviceDetail(numa_node=cell, mdev_parent=GPU,
                                                       mdev_type=MDEV_TYPE)))
    return tuple(devices)


def device_host(root: Path) -> SysfsBuilder:
    b = SysfsBuilder(root)
    b.add_numa_node(0, "0-3", 8192)
    b.add_numa_node(1, "4-7", 8192)
    b.add_pf(PF, "8086", "10fb", "10ed", numa_node=1, total_vfs=8, num_vfs=4,
             driver="ixgbe", vf_driver="ixgbevf")
    b.add_mdev_parent(GPU, 1, {MDEV_TYPE: ("GRID M60-2Q", 4)})
    b.add_nvidia_vf_layout(VGPU_PF, "26b5", 1, VgpuCard(VGPU_TYPES), num_vfs=2)
    return b


def kernel_of(b: SysfsBuilder) -> Callable[[], None]:
    """The kernel's and the NVIDIA driver's answers to the driver's writes."""
    def answer() -> None:
        b.answer_mdev_writes()
        b.answer_vgpu_type_writes()
    return answer


def libvirt_driver(tmp_path: Path, uri: str, sysfs: Path) -> LibvirtDriver:
    sysfs.mkdir(parents=True, exist_ok=True)  # checked at load: it must exist
    path = write_conf(tmp_path, "http://127.0.0.1:9", "contract", None,
                      DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(sysfs)},
                      libvirt={"connection_uri": uri,
                               "instances_path": str(tmp_path / "instances")})
    driver = LibvirtDriver(load_config(["--config-file", str(path)]))
    driver.init_host()
    return driver


def make_fake(tmp_path: Path, state_file: Path | None = None) -> Subject:
    """``state_file``: the fake hypervisor keeps its state there, beyond
    the process."""
    host = {"numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 8192},
                           {"id": 1, "cpus": "4-7", "memory_mb": 8192}],
            "pci_devices": [{"address": PF, "vendor_id": "8086", "product_id": "10fb",
                             "numa_node": 1, "vfs": {"count": 4, "product_id": "10ed"}}],
            "gpus": [{"address": GPU, "numa_node": 1,
                      "mdev_types": {MDEV_TYPE: {"available_instances": 4}}},
                     {"address": VGPU_VF, "numa_node": 1, "vendor_vfio": True,
                      "mdev_types": {f"nvidia-{n}": {"available_instances": 1}
                                     for n in VGPU_TYPES}}]}
    driver = FakeDriver(host, state_file=state_file)
    vfs = [d.address for d in driver.host.pci_devices if d.parent_address == PF]
    return Subject(driver, lambda w: device_set(
        w, vfs[0 if w == "a" else 1], str(uuid.uuid5(uuid.NAMESPACE_OID, w)),
        f"/dev/dax0.{0 if w == 'a' else 1}", 4 if w == "a" else 5, 1), (GPU, MDEV_TYPE),
        lambda w: ((vfs[2 if w == "a" else 3],),
                   (str(uuid.uuid5(uuid.NAMESPACE_OID, "nova-" + w)),),
                   (6,) if w == "a" else (7,)), reboot=lambda: driver.reboot("fake-boot-2"))


def kernel_of(b: SysfsBuilder) -> Callable[[], None]:
    """What the kernel does within the driver's sysfs writes."""
    def answer() -> None:
        b.answer_mdev_writes()
        b.answer_sriov_writes()
    return answer


def make_libvirt_test(tmp_path: Path) -> Subject:
    b = device_host(tmp_path / "sys")
    uri = b.write_test_driver_host_xml(tmp_path / "host.xml")
    driver = libvirt_driver(tmp_path, uri, b.root)
    return Subject(driver, lambda w: device_set(
        w, b.vf_address(PF, 0 if w == "a" else 1), str(uuid.uuid5(uuid.NAMESPACE_OID, w)),
        f"/dev/dax0.{0 if w == 'a' else 1}", 4 if w == "a" else 5, 1), (GPU, MDEV_TYPE),
        lambda w: ((b.vf_address(PF, 2 if w == "a" else 3),),
                   (str(uuid.uuid5(uuid.NAMESPACE_OID, "nova-" + w)),),
                   (6,) if w == "a" else (7,)), kernel_of(b), b.reboot)


def make_libvirt_qemu(tmp_path: Path, uri: str) -> Subject:
    b = device_host(tmp_path / "sys")  # only for the mdev calls: sysfs writes
    driver = libvirt_driver(tmp_path, uri, b.root)
    files = {}
    for which in "ab":
        files[which] = tmp_path / f"pmem-{which}"
        with open(files[which], "wb") as f:
            f.truncate(64 << 20)
    # This machine has two CPUs and one NUMA cell.
    return Subject(driver, lambda w: device_set(
        w, "", None, str(files[w]), 0 if w == "a" else 1, 0), (GPU, MDEV_TYPE),
        lambda w: ((), (), (0,) if w == "a" else (1,)), kernel_of(b), b.reboot)


@pytest.fixture(params=["fake", "fake-persisted", "libvirt-qemu", "libvirt-test"])
def subject(request, tmp_path):
    if request.param == "fake-persisted":
        s = make_fake(tmp_path, tmp_path / "hypervisor.json")
    elif request.param == "libvirt-qemu":
        # A libvirtd of the test's own: no other agent's guests in it.
        uri = request.getfixturevalue("private_libvirtd").uri
        s = make_libvirt_qemu(tmp_path, uri)
    elif request.param == "libvirt-test":
        s = make_libvirt_test(tmp_path)
    else:
        s = make_fake(tmp_path)
    made: list[str] = []
    real_spawn = s.driver.spawn

    def spawn(guest: GuestSpec) -> None:
        made.append(guest.instance_uuid)
        real_spawn(guest)

    s.driver.spawn = spawn
    s.made = made
    yield s
    for instance in made:
        s.driver.destroy(instance)
    s.driver.cleanup()


def ids(guest: GuestSpec) -> frozenset[str]:
    return frozenset(d.assignment_id for d in guest.devices)


def resources(guest: GuestSpec) -> frozenset[HostResource]:
    return frozenset().union(*(device_resources(d) for d in guest.devices))


# --- spawn -------------------------------------------------------------------

def test_spawn_of_a_new_guest_runs_it_with_its_devices(subject):
    a = subject.guest("a")
    subject.driver.spawn(a)
    state = subject.driver.guest_state(a.instance_uuid)
    assert state.running
    assert state.live == state.saved == ids(a)
    assert state.live_resources == resources(a)
    assert HostResource(HostResourceKind.HOST_CPU, a.devices[0].device_id) \
        in state.live_resources


def test_spawn_again_leaves_the_running_guest_as_it_is(subject):
    a = subject.guest("a")
    subject.driver.spawn(a)
    before = subject.driver.guest_state(a.instance_uuid)
    subject.driver.spawn(a)
    assert subject.driver.guest_state(a.instance_uuid) == before


def test_spawn_of_a_running_guest_only_redefines_it(subject):
    """The running guest keeps the devices it was started with: a move
    that only redefines it leaves the old devices in use."""
    a = subject.guest("a")
    b = subject.guest("b", a.instance_uuid)
    subject.driver.spawn(a)
    subject.driver.spawn(b)
    state = subject.driver.guest_state(a.instance_uuid)
    assert state.running
    assert state.live == ids(a) and state.saved == ids(b)
    assert state.live_resources == resources(a)
    assert state.live | state.saved == ids(a) | ids(b)


def test_spawn_of_a_stopped_guest_starts_it_with_its_new_devices(subject):
    a = subject.guest("a")
    b = subject.guest("b", a.instance_uuid)
    subject.driver.spawn(a)
    subject.driver.power_off(a.instance_uuid)
    subject.driver.spawn(b)
    state = subject.driver.guest_state(a.instance_uuid)
    assert state.running
    assert state.live == state.saved == ids(b)
    assert state.live_resources == resources(b)


# --- update, power off, destroy -----------------------------------------------

def test_update_guest_keeps_running_state_and_live_devices(subject):
    a = subject.guest("a")
    b = subject.guest("b", a.instance_uuid)
    subject.driver.spawn(a)
    subject.driver.update_guest(b)
    state = subject.driver.guest_state(a.instance_uuid)
    assert state.running and state.live == ids(a) and state.saved == ids(b)

    subject.driver.power_off(a.instance_uuid)
    subject.driver.update_guest(a)
    state = subject.driver.guest_state(a.instance_uuid)
    assert not state.running and state.saved == ids(a)


def test_power_off_keeps_the_definition_and_is_idempotent(subject):
    a = subject.guest("a")
    subject.driver.spawn(a)
    subject.driver.power_off(a.instance_uuid)
    subject.driver.power_off(a.instance_uuid)
    state = subject.driver.guest_state(a.instance_uuid)
    assert not state.running
    assert state.live == frozenset() and state.live_resources == frozenset()
    assert state.saved == ids(a)
    assert not subject.driver.guest_is_running(a.instance_uuid)
    subject.driver.power_off(str(uuid.uuid4()))  # no such guest: nothing to do


def test_destroy_twice(subject):
    a = subject.guest("a")
    subject.driver.spawn(a)
    subject.driver.destroy(a.instance_uuid)
    subject.driver.destroy(a.instance_uuid)
    assert subject.driver.guest_state(a.instance_uuid) is None
    assert a.instance_uuid not in subject.driver.list_guests()


# --- listing and metadata -------------------------------------------------------

def test_list_guests_tells_live_from_saved(subject):
    a = subject.guest("a")
    b = subject.guest("b")
    subject.driver.spawn(a)
    subject.driver.spawn(b)
    subject.driver.power_off(b.instance_uuid)
    subject.driver.update_guest(subject.guest("a", b.instance_uuid))
    guests = subject.driver.list_guests()
    assert guests[a.instance_uuid].running
    assert guests[a.instance_uuid].live == guests[a.instance_uuid].saved == ids(a)
    assert not guests[b.instance_uuid].running
    assert guests[b.instance_uuid].live == frozenset()
    # Assignment ids round-trip through the guest's definition.
    assert guests[b.instance_uuid].saved == ids(a)


# --- mdevs ---------------------------------------------------------------------

def host_mdevs(subject: Subject) -> set[Mdev]:
    """The mdevs the driver reads on its host."""
    return set(subject.driver.get_host_inventory().mdevs)


def test_mdev_of_a_type_the_parent_offers_is_created_and_removed(subject):
    parent, type_id = subject.mdev_parent
    mdev = str(uuid.uuid4())
    before = host_mdevs(subject)
    subject.driver.ensure_mdev(mdev, parent, type_id)
    subject.kernel()
    assert host_mdevs(subject) == before | {Mdev(mdev, type_id, parent)}
    subject.driver.ensure_mdev(mdev, parent, type_id)  # idempotent
    subject.kernel()
    assert host_mdevs(subject) == before | {Mdev(mdev, type_id, parent)}
    subject.driver.remove_mdev(mdev)
    subject.kernel()
    assert host_mdevs(subject) == before
    subject.driver.remove_mdev(str(uuid.uuid4()))  # absent: nothing to do
    subject.kernel()
    assert host_mdevs(subject) == before


def test_mdev_of_a_type_the_parent_lacks_is_refused_naming_both(subject):
    parent, _ = subject.mdev_parent
    with pytest.raises(MdevError, match=f"{parent}.*nvidia-99|nvidia-99.*{parent}"):
        subject.driver.ensure_mdev(str(uuid.uuid4()), parent, "nvidia-99")


def test_a_vgpu_vf_takes_one_type_at_a_time_and_gives_it_back(subject):
    vf, (first, second) = subject.vgpu_vf
    driver = subject.driver
    driver.set_vgpu_type(vf, first)
    subject.kernel()
    driver.set_vgpu_type(vf, first)  # has it: nothing to do
    with pytest.raises(MdevError, match=vf):
        driver.set_vgpu_type(vf, second)
    driver.clear_vgpu_type(vf, second)  # not the type it has: left
    subject.kernel()
    with pytest.raises(MdevError, match=vf):
        driver.set_vgpu_type(vf, second)
    driver.clear_vgpu_type(vf, first)
    subject.kernel()
    driver.set_vgpu_type(vf, second)
    subject.kernel()
    driver.clear_vgpu_type(vf, second)
    subject.kernel()
    driver.clear_vgpu_type(vf, second)  # none: nothing to do


def test_a_vgpu_vf_refuses_a_type_it_does_not_list_and_stays_as_it_was(subject):
    vf, (first, _) = subject.vgpu_vf
    with pytest.raises(MdevError, match=vf):
        subject.driver.set_vgpu_type(vf, "nvidia-99")
    subject.kernel()
    subject.driver.set_vgpu_type(vf, first)  # it had none
    subject.kernel()
    subject.driver.clear_vgpu_type(vf, first)


# --- guests of others: adoption --------------------------------------------------
# A host nova-compute ran: its guests carry nova's metadata, not ours. The
# agent must see what each holds before it hands out any device.

def nova_guest(subject: Subject, which: str, running: bool,
               instance: str | None = None) -> ForeignGuest:
    """Define (and start) a guest of nova's holding device set ``which``;
    returns what the driver must report of it."""
    instance = instance or str(uuid.uuid4())
    pci, mdevs, pinned = subject.foreign_devices(which)
    held = frozenset(
        {HostResource(HostResourceKind.PCI_ADDRESS, a) for a in pci}
        | {HostResource(HostResourceKind.MDEV_UUID, m) for m in mdevs}
        | {HostResource(HostResourceKind.HOST_CPU, str(c)) for c in pinned})
    expected = ForeignGuest(instance, f"nova-{which}", running, 2, 64, held)
    if isinstance(subject.driver, FakeDriver):
        subject.driver.add_foreign_guest(expected)
        return expected
    # nova numbers its domains; one instance keeps its number.
    xml = nova_domain_xml(instance, int(instance[:7], 16), f"nova-{which}", 2, 64,
                          pci=pci, mdevs=mdevs, pinned=pinned)

    def define(conn) -> None:
        dom = conn.defineXML(xml)
        if running and not dom.isActive():
            dom.create()
    subject.made.append(instance)
    subject.driver._conn.call(define)
    return expected


def test_a_guest_of_novas_is_listed_as_foreign_with_what_it_holds(subject):
    ours = subject.guest("b")
    subject.driver.spawn(ours)
    running = nova_guest(subject, "a", running=True)
    stopped = nova_guest(subject, "b", running=False)
    found = subject.driver.list_foreign_guests()
    assert found == {running.instance_uuid: running, stopped.instance_uuid: stopped}
    # Each guest is one side's: ours are never foreign, nova's never ours.
    assert set(subject.driver.list_guests()) == {ours.instance_uuid}


def test_a_running_foreign_guest_holds_what_it_was_started_with(subject):
    """A redefinition of a running guest of nova's changes only its saved
    definition: what it holds is still what it runs with."""
    started = nova_guest(subject, "a", running=True)
    nova_guest(subject, "b", running=True, instance=started.instance_uuid)
    found = subject.driver.list_foreign_guests()[started.instance_uuid]
    assert found.running and found.resources == started.resources


# --- what every guest holds: the claims' veto ------------------------------------
# Claims never choose a device a guest on the host holds, whatever the store
# says: the driver names every guest, ours or not, running or only defined,
# with what its domain holds, as it is at the call.

def held(guest: ForeignGuest) -> GuestHolding:
    return GuestHolding(guest.instance_uuid, False, guest.running, guest.resources)


def test_guest_holdings_name_every_guest_ours_and_others_with_what_it_holds(subject):
    running = subject.guest("a")
    subject.driver.spawn(running)
    # Running on set a, defined with set b: it holds both.
    subject.driver.update_guest(subject.guest("b", running.instance_uuid))
    stopped = subject.guest("b")
    subject.driver.spawn(stopped)
    subject.driver.power_off(stopped.instance_uuid)
    nova_running = nova_guest(subject, "a", running=True)
    nova_stopped = nova_guest(subject, "b", running=False)
    expected = {
        running.instance_uuid: GuestHolding(running.instance_uuid, True, True,
                                            resources(running) | resources(stopped)),
        stopped.instance_uuid: GuestHolding(stopped.instance_uuid, True, False,
                                            resources(stopped)),
        nova_running.instance_uuid: held(nova_running),
        nova_stopped.instance_uuid: held(nova_stopped)}
    assert subject.driver.guest_holdings() == expected
    assert subject.driver.guest_holdings(reread=True) == expected
    subject.driver.destroy(stopped.instance_uuid)
    subject.driver.destroy(nova_stopped.instance_uuid)
    del expected[stopped.instance_uuid], expected[nova_stopped.instance_uuid]
    assert subject.driver.guest_holdings() == expected


def behind_its_back(subject: Subject, instance: str, change: str) -> None:
    """Another manager starts or undefines its guest, not through the driver."""
    if isinstance(subject.driver, FakeDriver):
        found = subject.driver.foreign[instance].saved
        if change == "start":
            subject.driver.add_foreign_guest(ForeignGuest(
                found.instance_uuid, found.name, True, found.vcpus, found.memory_mb,
                found.resources))
        else:
            del subject.driver.foreign[instance]
        return

    def act(conn) -> None:
        dom = conn.lookupByUUIDString(instance)
        if change == "start":
            dom.create()
        else:
            dom.destroy()
            dom.undefine()
    subject.driver._conn.call(act)


def test_guest_holdings_see_guests_changed_behind_the_drivers_back(subject):
    """Kept reads are no stale answer: a guest defined, started, redefined or
    undefined by another manager is seen (a redefinition once the
    hypervisor's event has come)."""
    ours = subject.guest("a")
    subject.driver.spawn(ours)
    assert set(subject.driver.guest_holdings()) == {ours.instance_uuid}
    nova = nova_guest(subject, "b", running=False)
    assert subject.driver.guest_holdings()[nova.instance_uuid] == held(nova)
    behind_its_back(subject, nova.instance_uuid, "start")
    assert subject.driver.guest_holdings()[nova.instance_uuid].running
    # Redefined while it runs on set b: it holds both sets.
    redefined = nova_guest(subject, "a", running=True, instance=nova.instance_uuid)
    both = nova.resources | redefined.resources
    assert both != nova.resources
    wait_for(lambda: subject.driver.guest_holdings()[nova.instance_uuid].resources == both,
             timeout=10)
    behind_its_back(subject, nova.instance_uuid, "undefine")
    assert set(subject.driver.guest_holdings()) == {ours.instance_uuid}


# --- live migration ------------------------------------------------------------
# Two hypervisors a guest moves between: two fake ones on one FakeNetwork,
# or two real libvirtds (QEMU/KVM) with distinct host UUIDs. libvirt's test
# driver cannot migrate at all; its contract is to refuse, pinned by the
# last test, so it has no pair here.

@dataclass
class Pair:
    source: ComputeDriver
    dest: ComputeDriver
    dest_uri: str
    unreachable_uri: str
    devices: Callable[[str], tuple[GuestDevice, ...]]  # "a" (source) or "b" (dest)

    def guests(self) -> tuple[GuestSpec, GuestSpec]:
        """A guest's spec on the source and on the destination."""
        instance = str(uuid.uuid4())
        return tuple(GuestSpec(instance, f"contract-{instance[:8]}", 2, 64, self.devices(w))
                     for w in "ab")


def target(a: GuestSpec, b: GuestSpec) -> LiveMigrationTarget:
    """Each of ``a``'s devices moved to ``b``'s in the same place."""
    return LiveMigrationTarget(a.instance_uuid, tuple(
        DeviceMove(s, d) for s, d in zip(a.devices, b.devices, strict=True)))


def make_fake_pair() -> Pair:
    network = FakeNetwork()
    hosts = [FakeDriver(boot_id=f"fake-{w}", network=network, uri=f"fake://{w}")
             for w in "ab"]
    return Pair(hosts[0], hosts[1], "fake://b", "fake://nowhere", lambda w: device_set(
        w, "", None, f"/dev/dax0.{0 if w == 'a' else 1}", 0 if w == "a" else 1, 0))


def make_persisted_fake_pair(tmp_path: Path) -> Pair:
    """Two fake hypervisors that keep their state in files, as those of two
    agent processes: the destination is reached through its file."""
    hosts = [FakeDriver(boot_id=f"fake-{w}", state_file=tmp_path / f"{w}.json")
             for w in "ab"]
    return Pair(hosts[0], hosts[1], hosts[1].migration_uri(),
                f"fake-file://{tmp_path / 'nowhere.json'}", lambda w: device_set(
                    w, "", None, f"/dev/dax0.{0 if w == 'a' else 1}",
                    0 if w == "a" else 1, 0))


def make_libvirt_qemu_pair(tmp_path: Path, daemons) -> Pair:
    drivers = [libvirt_driver(tmp_path / d.root.name, d.uri, tmp_path / "sys")
               for d in daemons]
    files = {}
    for which, daemon in zip("ab", daemons):
        files[which] = daemon.root / f"pmem-{tmp_path.name}"
        with open(files[which], "wb") as f:
            f.truncate(64 << 20)
    return Pair(drivers[0], drivers[1], daemons[1].uri,
                f"qemu+unix:///system?socket={tmp_path / 'no-libvirtd'}",
                lambda w: device_set(w, "", None, str(files[w]), 0 if w == "a" else 1, 0))


@pytest.fixture(params=["fake", "fake-persisted", "libvirt-qemu"])
def pair(request, tmp_path):
    if request.param == "libvirt-qemu":
        p = make_libvirt_qemu_pair(tmp_path, request.getfixturevalue("two_private_libvirtds"))
    elif request.param == "fake-persisted":
        p = make_persisted_fake_pair(tmp_path)
    else:
        p = make_fake_pair()
    yield p
    for driver in (p.source, p.dest):
        for instance in driver.list_guests():
            driver.destroy(instance)
        driver.cleanup()


def assert_unmoved(pair: Pair, a: GuestSpec, running: bool = True) -> None:
    state = pair.source.guest_state(a.instance_uuid)
    assert state.running is running and state.saved == ids(a)
    assert state.live == (ids(a) if running else frozenset())
    assert pair.dest.guest_state(a.instance_uuid) is None


def test_live_migration_moves_the_running_guest_to_the_destinations_devices(pair):
    a, b = pair.guests()
    pair.source.spawn(a)
    pair.source.live_migrate(a.instance_uuid, pair.dest_uri, target(a, b))
    state = pair.dest.guest_state(a.instance_uuid)
    assert state.running
    assert state.live == state.saved == ids(b)
    assert state.live_resources == resources(b)
    assert pair.source.guest_state(a.instance_uuid) is None
    assert a.instance_uuid not in pair.source.list_guests()


def test_no_migration_is_reported_out_of_a_guest_at_rest_or_of_one_moved(pair):
    """migrating_out tells a restarted agent whether the migration it left
    still runs; a guest at rest, one moved away and one never here have
    none. (One under way, which only QEMU can hold: test_live_migration_libvirt.)"""
    a, b = pair.guests()
    pair.source.spawn(a)
    assert not pair.source.migrating_out(a.instance_uuid)
    assert not pair.dest.migrating_out(a.instance_uuid)
    pair.source.live_migrate(a.instance_uuid, pair.dest_uri, target(a, b))
    assert not pair.source.migrating_out(a.instance_uuid)
    assert not pair.dest.migrating_out(a.instance_uuid)
    assert not pair.source.migrating_out(str(uuid.uuid4()))


def test_live_migration_of_a_guest_not_running_here_is_refused(pair):
    a, b = pair.guests()
    pair.source.spawn(a)
    moves = target(a, b)
    pair.source.power_off(a.instance_uuid)
    with pytest.raises(LiveMigrationError, match=a.instance_uuid) as caught:
        pair.source.live_migrate(a.instance_uuid, pair.dest_uri, moves)
    assert caught.value.cause is MigrationFailure.NO_RUNNING_GUEST
    assert_unmoved(pair, a, running=False)

    absent = str(uuid.uuid4())
    with pytest.raises(LiveMigrationError, match=absent) as caught:
        pair.source.live_migrate(absent, pair.dest_uri,
                                 LiveMigrationTarget(absent, moves.moves))
    assert caught.value.cause is MigrationFailure.NO_RUNNING_GUEST


def test_live_migration_to_an_unreachable_destination_is_refused(pair):
    a, b = pair.guests()
    pair.source.spawn(a)
    with pytest.raises(LiveMigrationError) as caught:
        pair.source.live_migrate(a.instance_uuid, pair.unreachable_uri, target(a, b))
    assert caught.value.cause is MigrationFailure.DESTINATION_UNREACHABLE
    assert pair.unreachable_uri in str(caught.value)
    assert_unmoved(pair, a)


def test_live_migration_with_a_target_not_made_for_the_guest_is_refused(pair):
    """Another guest's target, and one for devices the guest does not hold
    (a stale answer): refused before anything moves."""
    a, b = pair.guests()
    pair.source.spawn(a)
    others = LiveMigrationTarget(str(uuid.uuid4()), target(a, b).moves)
    stale = target(b, a)  # made for the devices b holds, not a's
    for wrong in (others, stale):
        with pytest.raises(LiveMigrationError) as caught:
            pair.source.live_migrate(a.instance_uuid, pair.dest_uri, wrong)
        assert caught.value.cause is MigrationFailure.DEFINITION_REFUSED
        assert_unmoved(pair, a)


def test_the_libvirt_test_driver_refuses_live_migration_as_unsupported(tmp_path):
    s = make_libvirt_test(tmp_path)
    a = s.guest("a")
    s.driver.spawn(a)
    try:
        with pytest.raises(LiveMigrationError) as caught:
            s.driver.live_migrate(a.instance_uuid, "test:///default",
                                  LiveMigrationTarget.identity(a.instance_uuid, a.devices))
        assert caught.value.cause is MigrationFailure.UNSUPPORTED
        state = s.driver.guest_state(a.instance_uuid)
        assert state.running and state.live == ids(a)
    finally:
        s.driver.destroy(a.instance_uuid)
        s.driver.cleanup()


# --- device health -------------------------------------------------------------


def test_device_health_reads_the_hosts_devices_as_present_and_others_as_gone(subject):
    absent = "0000:ee:00.0"
    signals = subject.driver.device_health([PF, GPU, absent])
    assert set(signals) == {PF, GPU, absent}
    assert (signals[PF].present, signals[PF].vendor_id) == (True, "8086")
    assert (signals[GPU].present, signals[GPU].vendor_id) == (True, "10de")
    assert not signals[absent].present


# --- SR-IOV after a reboot -------------------------------------------------------


def vf_ids(subject: Subject) -> list[tuple[str, str, str]]:
    return [(v.address, v.vendor_id, v.product_id)
            for v in subject.driver.sriov_functions(PF).vfs]


def test_a_reboot_leaves_a_pf_without_vfs_and_its_vf_count_brings_them_back(subject):
    before = subject.driver.sriov_functions(PF)
    assert (before.pf.num_vfs, before.pf.vendor_id) == (4, "8086")
    assert vf_ids(subject) == [(vf_address(PF, i), "8086", "10ed") for i in range(4)]
    subject.reboot()
    assert subject.driver.sriov_functions(PF).pf.num_vfs == 0 and vf_ids(subject) == []
    subject.driver.set_num_vfs(PF, 2)
    subject.kernel()
    assert subject.driver.sriov_functions(PF).pf.num_vfs == 2
    assert vf_ids(subject) == [(vf_address(PF, i), "8086", "10ed") for i in range(2)]
    assert subject.driver.sriov_functions("0000:ee:00.0") is None
