"""GuestManager against the real libvirt test driver, with mdevs written to
a fake sysfs tree. The test driver keeps state per connection, so each test
uses one Connection throughout."""
from dataclasses import replace
from pathlib import Path

import libvirt
import pytest
from lxml import etree

from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec
from compute_agent.drivers.errors import MdevError
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt import guests as guests_module
from compute_agent.drivers.libvirt.connection import Connection
from compute_agent.drivers.libvirt.guest_xml import vf_mac
from compute_agent.drivers.libvirt.guests import GuestManager
from compute_agent.drivers.libvirt.mdev import MdevSysfs
from tests.functional.earlier_guests import DERIVED_MAC, NO_MAC, earlier_domain_xml

PF = "0000:81:00.0"
GPU = "0000:06:00.0"
INSTANCE = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01"
OTHER = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a02"
EXISTING_MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"
NEW_MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c02"


@pytest.fixture
def host(tmp_path):
    builder = SysfsBuilder(tmp_path / "sys")
    builder.add_numa_node(0, "0-3", 8192)
    builder.add_numa_node(1, "4-7", 8192)
    builder.add_pf(PF, "8086", "10fb", "10ed", numa_node=1, total_vfs=8,
                   num_vfs=4, driver="ixgbe", vf_driver="ixgbevf")
    builder.add_mdev_parent(GPU, 0, {"nvidia-35": ("GRID M60-2Q", 4)})
    builder.add_mdev(EXISTING_MDEV, GPU, "nvidia-35")
    builder.add_pmem_namespace(0, 0, 1 << 30, 1, "ns0")
    return builder


@pytest.fixture
def conn(tmp_path, host):
    connection = Connection(host.write_test_driver_host_xml(
        tmp_path / "host.xml"))
    yield connection
    connection.close()


@pytest.fixture
def guests(conn, host):
    return GuestManager(conn, MdevSysfs(host.root), "kvm")


def spec(host, vf_index=0, instance=INSTANCE, vf_id="a-vf") -> GuestSpec:
    return GuestSpec(instance, f"instance-{instance[-2:]}", 4, 256, (
        GuestDevice(vf_id, DeviceKind.VF, host.vf_address(PF, vf_index),
                    detail=DeviceDetail(numa_node=1)),
        GuestDevice("a-mdev", DeviceKind.MDEV, NEW_MDEV, detail=DeviceDetail(
            numa_node=0, mdev_parent=GPU, mdev_type="nvidia-35")),
        GuestDevice("a-pmem", DeviceKind.PMEM, "ns0", detail=DeviceDetail(
            numa_node=1, size_bytes=1 << 30, dev_path="/dev/dax0.0")),
        GuestDevice("a-pcpu", DeviceKind.PCPU, "pcpus", amount=2,
                    cpus=frozenset({4, 5}), detail=DeviceDetail(numa_node=1)),
        GuestDevice("a-numa", DeviceKind.NUMA, "1")))


def domain_xml(conn, instance=INSTANCE, flags=0):
    return etree.fromstring(conn.call(
        lambda c: c.lookupByUUIDString(instance).XMLDesc(flags)))


def vfs(root) -> list[str]:
    """The VFs of <interface type='hostdev'>, as PCI addresses."""
    return ["{}:{}:{}.{}".format(*(a.get(k)[2:] for k in (
        "domain", "bus", "slot", "function")))
        for a in root.xpath("//interface[@type='hostdev']/source/address")]


def running(guests: GuestManager, instance: str) -> bool:
    state = guests.guest_state(instance)
    return state is not None and state.running


def saved_ids(guests: GuestManager) -> dict[str, frozenset[str]]:
    return {u: g.saved for u, g in guests.list_guests().items()}


def create_file(host, parent=GPU, type_id="nvidia-35") -> Path:
    return (Path(host.root) / "class" / "mdev_bus" / parent /
            "mdev_supported_types" / type_id / "create")


def test_spawn_defines_and_starts_with_every_device(guests, conn, host):
    guests.spawn(spec(host))

    every = frozenset({"a-vf", "a-mdev", "a-pmem", "a-pcpu", "a-numa"})
    state = guests.list_guests()[INSTANCE]
    assert state.running and state.live == state.saved == every
    root = domain_xml(conn)
    assert vfs(root) == [host.vf_address(PF, 0)]
    assert root.xpath("//hostdev[@type='mdev']/source/address/@uuid") == [
        NEW_MDEV]
    assert root.xpath("//memory[@model='nvdimm']/source/path/text()") == [
        "/dev/dax0.0"]
    assert [(p.get("vcpu"), p.get("cpuset"))
            for p in root.xpath("/domain/cputune/vcpupin")] == [
        ("0", "4"), ("1", "5")]
    assert root.xpath("/domain/numatune/memory/@nodeset") == ["1"]
    # The missing mdev was created through sysfs.
    assert create_file(host).read_text() == NEW_MDEV


def test_spawn_is_idempotent(guests, conn, host):
    guests.spawn(spec(host))
    first_id = conn.call(lambda c: c.lookupByUUIDString(INSTANCE).ID())
    guests.spawn(spec(host))

    # Still the same running domain: redefined, not restarted.
    assert conn.call(lambda c: c.lookupByUUIDString(INSTANCE).ID()) == \
        first_id
    assert list(guests.list_guests()) == [INSTANCE]
    assert conn.call(lambda c: c.numOfDefinedDomains()) == 0


class StartedByAnEarlierCall:
    """The domain as a retried build sees it while libvirtd still carries
    out the killed agent's start: not active when asked, running by the
    time the retry's own start arrives (which libvirt then refuses)."""

    def __init__(self, dom):
        self._dom = dom
        self._asked = False

    def isActive(self):
        if not self._asked:
            self._asked = True
            return False
        return self._dom.isActive()

    def create(self):
        self._dom.create()  # the earlier call's start completes first
        return self._dom.create()

    def __getattr__(self, name):
        return getattr(self._dom, name)


def test_bug_a_build_retried_while_libvirtd_finished_the_first_start(
        guests, conn, host, monkeypatch):
    """Found by the crash loop on QEMU: a build retried after its agent was
    killed during the start answered InternalError "domain is already
    running"."""
    call = conn.call

    class Defining:
        def __init__(self, c):
            self._c = c

        def defineXML(self, xml):
            return StartedByAnEarlierCall(self._c.defineXML(xml))

        def __getattr__(self, name):
            return getattr(self._c, name)

    monkeypatch.setattr(conn, "call", lambda fn: call(lambda c: fn(Defining(c))))
    guests.spawn(spec(host))
    monkeypatch.undo()
    assert running(guests, INSTANCE)
    assert list(guests.list_guests()) == [INSTANCE]


def test_spawn_starts_a_stopped_guest(guests, conn, host):
    guests.spawn(spec(host))
    conn.call(lambda c: c.lookupByUUIDString(INSTANCE).destroy())
    assert not running(guests, INSTANCE)
    guests.spawn(spec(host))
    assert running(guests, INSTANCE)


def test_update_guest_changes_devices_and_keeps_state(guests, conn, host):
    guests.spawn(spec(host))
    guests.update_guest(spec(host, vf_index=2, vf_id="a-vf-new"))

    assert running(guests, INSTANCE)
    persistent = domain_xml(conn, flags=libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert vfs(persistent) == [host.vf_address(PF, 2)]
    assert vfs(domain_xml(conn)) == [host.vf_address(PF, 0)]
    # While it runs, the live guest still holds the old VF: live and saved
    # are told apart, and both are in use.
    state = guests.list_guests()[INSTANCE]
    assert "a-vf" in state.live and "a-vf-new" not in state.live
    assert "a-vf-new" in state.saved and "a-vf" not in state.saved
    assert state.live | state.saved >= {"a-vf", "a-vf-new"}

    conn.call(lambda c: c.lookupByUUIDString(INSTANCE).destroy())
    guests.update_guest(spec(host, vf_index=2, vf_id="a-vf-new"))
    assert not running(guests, INSTANCE)
    assert saved_ids(guests) == {INSTANCE: frozenset(
        {"a-vf-new", "a-mdev", "a-pmem", "a-pcpu", "a-numa"})}
    assert guests.list_guests()[INSTANCE].live == frozenset()


def test_destroy_removes_the_guest(guests, conn, host):
    guests.spawn(spec(host))
    guests.spawn(spec(host, vf_index=1, instance=OTHER))
    guests.destroy(INSTANCE)

    assert list(guests.list_guests()) == [OTHER]
    assert not running(guests, INSTANCE)
    with pytest.raises(libvirt.libvirtError):
        conn.call(lambda c: c.lookupByUUIDString(INSTANCE))
    guests.destroy(INSTANCE)  # absent: nothing to do

    conn.call(lambda c: c.lookupByUUIDString(OTHER).destroy())
    guests.destroy(OTHER)  # defined but stopped
    assert guests.list_guests() == {}


def test_bug_a_guest_stopped_while_being_destroyed_failed_the_delete(guests, conn, host,
                                                                     monkeypatch):
    """The guest's QEMU exited between the check that it runs and the
    destroy: libvirt refused the destroy ("domain is not running") and the
    delete failed as an internal error, the guest left defined (the crash
    loop on QEMU, under the parallel suite's load)."""
    guests.spawn(spec(host))
    conn.call(lambda c: c.lookupByUUIDString(INSTANCE).destroy())
    monkeypatch.setattr(libvirt.virDomain, "isActive", lambda dom: 1)  # as seen just before
    guests.destroy(INSTANCE)
    with pytest.raises(libvirt.libvirtError):
        conn.call(lambda c: c.lookupByUUIDString(INSTANCE))


def test_domains_not_ours_are_not_listed(guests, conn, host):
    conn.call(lambda c: c.defineXML(
        "<domain type='test'><name>foreign</name><memory>65536</memory>"
        "<os><type>hvm</type></os></domain>"))
    guests.spawn(spec(host))
    assert list(guests.list_guests()) == [INSTANCE]
    assert not running(guests, OTHER)


def test_existing_mdev_is_not_created_again(guests, host):
    guests.ensure_mdev(EXISTING_MDEV, GPU, "nvidia-35")
    assert not create_file(host).exists()
    guests.ensure_mdev(NEW_MDEV, GPU, "nvidia-35")
    assert create_file(host).read_text() == NEW_MDEV


def test_missing_mdev_type_is_named(guests, host):
    with pytest.raises(MdevError, match=f"{GPU}.*nvidia-99"):
        guests.ensure_mdev(NEW_MDEV, GPU, "nvidia-99")
    with pytest.raises(MdevError, match="0000:99:00.0"):
        guests.ensure_mdev(NEW_MDEV, "0000:99:00.0", "nvidia-35")
    with pytest.raises(MdevError, match="invalid"):
        guests.ensure_mdev(NEW_MDEV, "../..", "nvidia-35")
    with pytest.raises(MdevError, match="UUID"):
        guests.ensure_mdev("../../x", GPU, "nvidia-35")


def test_remove_mdev(guests, host):
    guests.remove_mdev(EXISTING_MDEV)
    remove = (Path(host.root) / "bus" / "mdev" / "devices" / EXISTING_MDEV /
              "remove")
    assert remove.read_text() == "1"
    guests.remove_mdev(NEW_MDEV)  # absent: nothing to do
    assert not (Path(host.root) / "bus" / "mdev" / "devices" /
                NEW_MDEV).exists()


def test_spawn_refuses_a_missing_mdev_it_cannot_create(guests, host):
    bare = GuestSpec(INSTANCE, "instance-01", 1, 64, (
        GuestDevice("a-mdev", DeviceKind.MDEV, NEW_MDEV),))
    with pytest.raises(MdevError, match="parent and type are unknown"):
        guests.spawn(bare)
    assert guests.list_guests() == {}
    # An mdev that exists needs neither.
    guests.spawn(GuestSpec(INSTANCE, "instance-01", 1, 64, (
        GuestDevice("a-mdev", DeviceKind.MDEV, EXISTING_MDEV),)))
    assert saved_ids(guests) == {INSTANCE: frozenset({"a-mdev"})}


def test_mdev_model_comes_from_the_type(guests, conn, host):
    device_api = (Path(host.root) / "class" / "mdev_bus" / GPU /
                  "mdev_supported_types" / "nvidia-35" / "device_api")
    assert device_api.read_text().strip() == "vfio-pci"
    device_api.unlink()  # unreadable: the vfio-pci default
    guests.spawn(spec(host))
    assert domain_xml(conn).xpath("//hostdev[@type='mdev']/@model") == [
        "vfio-pci"]


# --- guests an earlier version defined ------------------------------------------

def define_earlier(conn, guest: GuestSpec, shape: str, start: bool = True) -> None:
    """``guest`` defined as the commit ``shape`` wrote it, and started."""
    def define(c):
        dom = c.defineXML(earlier_domain_xml(guest, shape))
        if start:
            dom.create()
    conn.call(define)


def domain_name_and_macs(conn, flags=libvirt.VIR_DOMAIN_XML_INACTIVE
                         ) -> tuple[str, list[str]]:
    root = domain_xml(conn, flags=flags)
    return (root.findtext("name"),
            root.xpath("//interface[@type='hostdev']/mac/@address"))


@pytest.mark.parametrize("shape", [NO_MAC, DERIVED_MAC])
def test_bug_spawn_of_a_running_guest_an_earlier_version_named_failed(
        guests, conn, host, shape):
    """Before 88f9c57 a domain was named after its instance; libvirt refuses
    a definition under another name for a UUID it knows ("domain 'web' is
    already defined with uuid ...")."""
    define_earlier(conn, replace(spec(host), name="web"), shape)
    _, macs = domain_name_and_macs(conn)

    guests.spawn(spec(host, vf_index=2, vf_id="a-vf-new"))

    state = guests.list_guests()[INSTANCE]
    assert state.running and "a-vf" in state.live and "a-vf-new" in state.saved
    # Redefined under the name it has; the running guest's VF kept its MAC.
    assert domain_name_and_macs(conn, flags=0) == ("web", macs)
    saved = domain_xml(conn, flags=libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert saved.findtext("name") == "web"
    assert saved.findtext("title") == spec(host).name
    assert vfs(saved) == [host.vf_address(PF, 2)]


@pytest.mark.parametrize("running_before", [True, False])
@pytest.mark.parametrize("shape", [NO_MAC, DERIVED_MAC])
def test_bug_update_guest_of_a_guest_an_earlier_version_named_failed(
        guests, conn, host, shape, running_before):
    define_earlier(conn, replace(spec(host), name="web"), shape, start=running_before)
    name, macs = domain_name_and_macs(conn)
    assert name == "web" and len(macs) == 1  # libvirt drew one where none was written

    # The same devices: nothing about the guest's identity changes, its
    # VF's MAC included (d1b250d's was libvirt's draw).
    guests.update_guest(spec(host))
    assert domain_name_and_macs(conn) == ("web", macs)
    assert running(guests, INSTANCE) is running_before

    # A new VF assignment gets the MAC derived from it, as a new guest's.
    guests.update_guest(spec(host, vf_index=2, vf_id="a-vf-new"))
    assert domain_name_and_macs(conn) == ("web", [vf_mac("a-vf-new")])
    assert saved_ids(guests) == {INSTANCE: frozenset(
        {"a-vf-new", "a-mdev", "a-pmem", "a-pcpu", "a-numa"})}


def test_a_guest_defined_now_is_named_by_its_uuid_with_its_name_as_title(guests, conn,
                                                                         host):
    guests.spawn(replace(spec(host), name="web"))
    root = domain_xml(conn, flags=libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert root.findtext("name") == f"instance-{INSTANCE}"
    assert root.findtext("title") == "web"


def test_bug_a_guest_forgotten_while_the_holdings_were_drawn_broke_the_read(
        guests, host, monkeypatch):
    """Seen under 64 concurrent builds: guest_holdings published its
    reads as the cache, then drew the answer from them while another
    thread's forget() deleted from that cache ("dictionary changed size
    during iteration"). Here drawing a holding forgets the other guest."""
    guests.spawn(spec(host))
    guests.spawn(GuestSpec(OTHER, "instance-other", 1, 256, (
        GuestDevice("b-vf", DeviceKind.VF, host.vf_address(PF, 1),
                    detail=DeviceDetail(numa_node=1)),)))

    class ForgettingRead:
        def __init__(self, name, domain_id, holding):
            self.name, self.domain_id, self._holding = name, domain_id, holding

        @property
        def holding(self):
            guests.forget(domain_uuid=OTHER)
            return self._holding

    monkeypatch.setattr(guests_module, "_Read", ForgettingRead)
    assert set(guests.guest_holdings(reread=True)) == {INSTANCE, OTHER}
