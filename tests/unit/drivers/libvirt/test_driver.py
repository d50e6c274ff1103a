"""The LibvirtDriver against the real libvirt test driver, reading a host
file and a sysfs tree that SysfsBuilder wrote for the same host."""
import os
import threading

import libvirt
import pytest
from oslo_config import cfg

from compute_agent import config
from compute_agent.drivers.base import Mdev, PciKind
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt.connection import Connection
from compute_agent.drivers.libvirt.driver import LibvirtDriver
from tests.unit.drivers.libvirt.test_capabilities import CAPS_64K

PF = "0000:81:00.0"
GPU = "0000:06:00.0"
NO_NUMA = "0000:00:1f.0"
UUID = "4b20d080-1b54-4048-85b3-a6a62d165c01"


@pytest.fixture
def host(tmp_path):
    builder = SysfsBuilder(tmp_path / "sys")
    builder.add_numa_node(0, "0-3", 8192)
    builder.add_numa_node(1, "4-7", 8192)
    builder.add_pf(PF, "8086", "10fb", "10ed", numa_node=1, total_vfs=8,
                   num_vfs=2, driver="ixgbe", vf_driver="ixgbevf")
    builder.add_mdev_parent(GPU, 0, {"nvidia-35": ("GRID M60-2Q", 4),
                                     "nvidia-36": ("GRID M60-4Q", 2)})
    builder.add_mdev(UUID, GPU, "nvidia-35")
    builder.add_pci_device(NO_NUMA, "8086", "a1c1", "060100")
    builder.add_pmem_namespace(0, 0, 1 << 30, 0, "ns0")
    return builder


def make_driver(tmp_path, builder, uri=None):
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf([], default_config_files=[])
    conf.set_override("sysfs_root", str(builder.root))
    uri = uri or builder.write_test_driver_host_xml(tmp_path / "host.xml")
    conf.set_override("connection_uri", uri, "libvirt")
    conf.set_override("instances_path", str(tmp_path / "not" / "yet"),
                      "libvirt")
    return LibvirtDriver(conf)


@pytest.fixture
def driver(tmp_path, host):
    driver = make_driver(tmp_path, host)
    driver.init_host()
    yield driver
    driver.cleanup()


def test_inventory(driver):
    inv = driver.get_host_inventory()
    assert inv.warnings == ()
    assert inv.cpus == frozenset(range(8)) and inv.memory_mb == 16384
    assert inv.disk_gb > 0
    assert [(c.id, sorted(c.cpus), c.memory_mb) for c in inv.numa_cells] == [
        (0, [0, 1, 2, 3], 8192), (1, [4, 5, 6, 7], 8192)]
    pci = {d.address: d for d in inv.pci_devices}
    assert sorted(pci) == [NO_NUMA, GPU, PF, "0000:81:10.0", "0000:81:10.1"]
    assert (pci[PF].kind, pci[PF].num_vfs, pci[PF].total_vfs) == (
        PciKind.PF, 2, 8)
    # The test driver drops <driver> from its XML; sysfs supplies it.
    assert pci[PF].driver == "ixgbe"
    vf = pci["0000:81:10.1"]
    assert (vf.kind, vf.parent_address, vf.numa_node) == (PciKind.VF, PF, 1)
    assert pci[NO_NUMA].numa_node is None
    (parent,) = inv.mdev_parents
    assert (parent.address, parent.numa_node) == (GPU, 0)
    assert [(t.id, t.available_instances) for t in parent.types] == [
        ("nvidia-35", 3), ("nvidia-36", 2)]
    assert inv.mdevs == (Mdev(UUID, "nvidia-35", GPU),)
    assert [n.name for n in inv.pmem_namespaces] == ["ns0"]


def test_sysfs_cells_count_base_pages_of_the_size_libvirt_reports(
        driver, monkeypatch):
    # A 64 KiB-page kernel: libvirt's capabilities list 64 KiB first. The
    # test driver describes no cells, so they come from sysfs.
    caps = CAPS_64K.replace(
        CAPS_64K[CAPS_64K.index("<cells"):CAPS_64K.index("</cells>") + 8],
        "<cells num='0'></cells>")
    monkeypatch.setattr(libvirt.virConnect, "getCapabilities",
                        lambda conn: caps)
    cells = driver.get_host_inventory().numa_cells
    # 8192 MiB of 64 KiB pages, none of them huge
    assert [dict(c.pages) for c in cells] == [
        {64: 131072, 2048: 0, 1048576: 0}] * 2


def test_base_page_size_is_the_local_kernels_when_libvirt_lists_none(
        driver, monkeypatch):
    monkeypatch.setattr(libvirt.virConnect, "getCapabilities", lambda conn: (
        "<capabilities><host><cpu><arch>aarch64</arch></cpu><topology>"
        "<cells num='0'></cells></topology></host></capabilities>"))
    real_sysconf = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 65536 if name in (
        "SC_PAGE_SIZE", "SC_PAGESIZE") else real_sysconf(name))
    cells = driver.get_host_inventory().numa_cells
    assert [dict(c.pages)[64] for c in cells] == [131072] * 2
    assert all(4 not in dict(c.pages) for c in cells)


DEFINED = "0c9f1d4e-7a2b-4c3d-9e8f-1a2b3c4d5e6f"
ORPHAN = "5d6e7f80-91a2-4b3c-8d4e-5f60718293a4"


class DefinedMdev:
    """A node device as libvirt >= 7.3 lists an mdev that mdevctl defined
    but nobody started: in listAllDevices unless the ACTIVE flag is given,
    absent from sysfs."""

    def __init__(self, mdev_uuid: str, parent: str) -> None:
        self.mdev_uuid, self.parent = mdev_uuid, parent

    def name(self) -> str:
        suffix = self.parent[4:] if self.parent.startswith("pci_") else ""
        return f"mdev_{self.mdev_uuid.replace('-', '_')}_{suffix}".rstrip("_")

    def XMLDesc(self, flags=0) -> str:
        return (f"<device><name>{self.name()}</name>"
                f"<parent>{self.parent}</parent>"
                "<capability type='mdev'><type id='nvidia-35'/>"
                f"<uuid>{self.mdev_uuid}</uuid></capability></device>")


@pytest.fixture
def libvirt_with_defined_mdevs(monkeypatch):
    """The test driver's listing, as libvirt >= 7.3 gives it when mdevctl
    defined two mdevs that are not started: one on the GPU, one whose
    parent is gone (libvirt then names "computer" as its parent)."""
    real = libvirt.virConnect.listAllDevices

    def listing(conn, flags=0):
        devices = real(conn, flags & ~libvirt.VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE)
        if flags & libvirt.VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE:
            return devices
        return devices + [DefinedMdev(DEFINED, "pci_0000_06_00_0"),
                          DefinedMdev(ORPHAN, "computer")]

    monkeypatch.setattr(libvirt.virConnect, "listAllDevices", listing)


def test_mdevs_defined_but_not_started_are_not_counted(
        driver, libvirt_with_defined_mdevs):
    inv = driver.get_host_inventory()
    assert inv.mdevs == (Mdev(UUID, "nvidia-35", GPU),)
    assert inv.warnings == ()


def test_test_driver_without_the_active_flag_still_lists_devices(
        driver, monkeypatch):
    # libvirt's test driver refuses VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE
    # (and, like libvirt < 7.3, lists no defined-only device): its list is
    # taken whole, and the flag is not tried again on this connection.
    real = libvirt.virConnect.listAllDevices
    calls = []
    monkeypatch.setattr(libvirt.virConnect, "listAllDevices",
                        lambda conn, flags=0: calls.append(flags)
                        or real(conn, flags))
    for _ in range(3):
        inv = driver.get_host_inventory()
        assert inv.mdevs == (Mdev(UUID, "nvidia-35", GPU),)
        assert len(inv.pci_devices) == 5
    active = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE
    assert [bool(f & active) for f in calls] == [True, False, False, False]


def count_xmldesc(monkeypatch):
    calls = []
    real = libvirt.virNodeDevice.XMLDesc

    def counting(self, flags=0):
        calls.append(self.name())
        return real(self, flags)

    monkeypatch.setattr(libvirt.virNodeDevice, "XMLDesc", counting)
    return calls


def test_unchanged_cycle_reads_no_node_device_xml(driver, monkeypatch):
    calls = count_xmldesc(monkeypatch)
    first = driver.get_host_inventory()
    assert len(calls) == 6  # five PCI devices and the mdev
    calls.clear()
    assert driver.get_host_inventory() == first
    assert calls == []


def test_node_device_event_drops_cache_and_notifies(driver, monkeypatch):
    calls = count_xmldesc(monkeypatch)
    notified = threading.Event()
    driver.register_change_listener(notified.set)
    driver.get_host_inventory()
    # The test driver emits no node-device events for its devices, so this
    # is the call Connection makes when libvirtd reports one.
    driver._on_event("nodedev", "pci_0000_81_10_2",
                     libvirt.VIR_NODE_DEVICE_EVENT_CREATED)
    assert notified.is_set()
    calls.clear()
    driver.get_host_inventory()
    assert len(calls) == 6


def test_hot_change_raising_num_vfs(driver, host):
    assert {d.address: d for d in driver.get_host_inventory().pci_devices
            }[PF].num_vfs == 2
    host.set_num_vfs(PF, 6)
    pf = {d.address: d for d in driver.get_host_inventory().pci_devices}[PF]
    assert pf.num_vfs == 6


def test_mdev_available_instances_are_reread_from_sysfs(driver, host):
    driver.get_host_inventory()
    host.add_mdev("0c6b5e2a-9d41-4f37-8e20-5a1b3c4d5e6f", GPU, "nvidia-36")
    inv = driver.get_host_inventory()
    assert [(t.id, t.available_instances)
            for t in inv.mdev_parents[0].types] == [("nvidia-35", 3),
                                                    ("nvidia-36", 1)]
    assert len(inv.mdevs) == 2


def test_warnings_from_sysfs_reach_the_inventory(driver, host, caplog):
    (host.device_dir(PF) / "sriov_numvfs").write_text("lots")
    inv = driver.get_host_inventory()
    assert [w.split(":")[0:4] for w in inv.warnings] == [
        ["0000", "81", "00.0", " sriov_numvfs"]]
    assert PF in {d.address for d in inv.pci_devices}  # libvirt's view kept
    assert sum("sriov_numvfs" in r.message for r in caplog.records) == 1


def test_a_device_warning_is_logged_once_while_it_lasts(driver, host,
                                                       caplog):
    numvfs = host.device_dir(PF) / "sriov_numvfs"

    def cycles(count):
        caplog.clear()
        for _ in range(count):
            inv = driver.get_host_inventory()
            # the inventory still says it every cycle
            assert any("sriov_numvfs" in w for w in inv.warnings)
        return [r.getMessage() for r in caplog.records
                if "sriov_numvfs" in r.getMessage()]

    numvfs.write_text("lots")
    logged = cycles(3)
    assert len(logged) == 1 and "'lots'" in logged[0]
    numvfs.write_text("-1")  # another reason: said again, once
    logged = cycles(3)
    assert len(logged) == 1 and "'-1'" in logged[0]
    numvfs.write_text("2")  # recovered ...
    caplog.clear()
    assert driver.get_host_inventory().warnings == ()
    numvfs.write_text("lots")  # ... and failed again: said again
    assert len(cycles(2)) == 1


def test_sysfs_only_devices_are_ignored(tmp_path, host):
    uri = host.write_test_driver_host_xml(tmp_path / "host.xml")
    host.add_pci_device("0000:c1:00.0", "15b3", "1017", "020000", 1)
    driver = make_driver(tmp_path, host, uri)
    addresses = {d.address for d in driver.get_host_inventory().pci_devices}
    assert "0000:c1:00.0" not in addresses and PF in addresses
    driver.cleanup()


def test_reconnects_after_the_connection_drops(driver, monkeypatch):
    driver.get_host_inventory()
    calls = count_xmldesc(monkeypatch)
    # What a libvirtd restart looks like from here: the handle is dead.
    driver._conn.call(lambda conn: conn).close()
    inv = driver.get_host_inventory()
    assert len(inv.pci_devices) == 5
    assert len(calls) == 6  # the cache went with the old connection


def test_unreachable_libvirt_raises_driver_unavailable(tmp_path, host):
    driver = make_driver(tmp_path, host, f"test://{tmp_path}/no/such/host.xml")
    with pytest.raises(DriverUnavailable, match="no/such/host.xml"):
        driver.init_host()


def test_connection_delivers_domain_events(tmp_path, host):
    events = []
    arrived = threading.Event()
    uri = host.write_test_driver_host_xml(tmp_path / "host.xml")

    def on_event(kind, name, event):
        events.append((kind, name, event))
        arrived.set()

    conn = Connection(uri, on_event=on_event)
    conn.call(lambda c: c.defineXML(
        "<domain type='test'><name>vm1</name><memory>65536</memory>"
        "<os><type>hvm</type></os></domain>"))
    assert arrived.wait(5)
    assert events == [("domain", "vm1", libvirt.VIR_DOMAIN_EVENT_DEFINED)]
    conn.close()

