"""The live-migration rewrite of a guest's domain XML, on XML our own writer
made: each host name changes to the destination's, nothing else does."""
import libvirt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec, device_resources
from compute_agent.drivers.errors import MigrationXmlError
from compute_agent.drivers.libvirt.guest_xml import (
    NAMESPACE,
    DomainIdentity,
    build_domain_xml,
    domain_identity,
    held_resources,
    parse_metadata,
    vf_mac,
)
from compute_agent.drivers.libvirt.migration_xml import rewrite_for_destination
from compute_agent.drivers.migration import DeviceMove, LiveMigrationTarget

INSTANCE = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01"
SOURCE_MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"
DEST_MDEV = "9d0e5c6a-3f1b-4e2a-8c7d-51a2b3c4d5e6"
CA = f"{{{NAMESPACE}}}"


def pcpu(assignment_id: str, cpu: int) -> GuestDevice:
    # As the agent gives them: one pinned CPU per assignment.
    return GuestDevice(assignment_id, DeviceKind.PCPU, str(cpu), cpus=frozenset({cpu}))


SOURCE = (
    GuestDevice("s-pci", DeviceKind.PCI, "0000:06:00.0"),
    GuestDevice("s-vf", DeviceKind.VF, "0000:81:10.1"),
    GuestDevice("s-mdev", DeviceKind.MDEV, SOURCE_MDEV,
                detail=DeviceDetail(0, mdev_parent="0000:07:00.0", mdev_type="nvidia-35")),
    GuestDevice("s-pmem", DeviceKind.PMEM, "ns0",
                detail=DeviceDetail(1, (1 << 30) + 4096, "/dev/dax0.0")),
    pcpu("s-cpu3", 3), pcpu("s-cpu9", 9),
    GuestDevice("s-vcpu", DeviceKind.NUMA, "1", amount=2),
    GuestDevice("s-mem", DeviceKind.NUMA, "1", amount=512),
)
DESTINATION = (
    GuestDevice("d-pci", DeviceKind.PCI, "10000:e1:1f.7"),
    GuestDevice("d-vf", DeviceKind.VF, "0000:3b:02.3"),
    GuestDevice("d-mdev", DeviceKind.MDEV, DEST_MDEV,
                detail=DeviceDetail(0, mdev_parent="0000:41:00.0", mdev_type="nvidia-35")),
    GuestDevice("d-pmem", DeviceKind.PMEM, "ns7",
                detail=DeviceDetail(0, 2 << 30, "/dev/dax3.1")),
    pcpu("d-cpu20", 20), pcpu("d-cpu21", 21),
    GuestDevice("d-vcpu", DeviceKind.NUMA, "0", amount=2),
    GuestDevice("d-mem", DeviceKind.NUMA, "0", amount=512),
)
TARGET = LiveMigrationTarget(INSTANCE, tuple(
    DeviceMove(s, d) for s, d in zip(SOURCE, DESTINATION)))


def source_xml(devices=SOURCE, vcpus: int = 4) -> str:
    return build_domain_xml(GuestSpec(INSTANCE, "web-1", vcpus, 512, devices))


def differences(before: str, after: str) -> set[tuple[str, str, str | None, str | None]]:
    """(element path, attribute or 'text', old, new) of every value that
    differs; the two trees must have the same elements in the same order."""
    out = set()
    a, b = etree.fromstring(before), etree.fromstring(after)
    tree_a, tree_b = a.getroottree(), b.getroottree()
    elements_a, elements_b = list(a.iter()), list(b.iter())
    assert [e.tag for e in elements_a] == [e.tag for e in elements_b]
    for x, y in zip(elements_a, elements_b):
        path = tree_a.getpath(x)
        assert path == tree_b.getpath(y)
        assert list(x.attrib) == list(y.attrib), path  # same attributes, same order
        for name in x.attrib:
            if x.get(name) != y.get(name):
                out.add((path, name, x.get(name), y.get(name)))
        for what in ("text", "tail"):
            if getattr(x, what) != getattr(y, what):
                out.add((path, what, getattr(x, what), getattr(y, what)))
    return out


def metadata_paths(xml: str) -> list[str]:
    root = etree.fromstring(xml)
    return [root.getroottree().getpath(e)
            for e in root.iterfind(f"metadata/{CA}instance/{CA}assignment")]


def test_every_host_name_changes_and_nothing_else():
    before = source_xml()
    after = rewrite_for_destination(before, TARGET)
    assert differences(before, after) == {
        ("/domain/devices/hostdev[1]/source/address", "domain", "0x0000", "0x10000"),
        ("/domain/devices/hostdev[1]/source/address", "bus", "0x06", "0xe1"),
        ("/domain/devices/hostdev[1]/source/address", "slot", "0x00", "0x1f"),
        ("/domain/devices/hostdev[1]/source/address", "function", "0x0", "0x7"),
        ("/domain/devices/interface/source/address", "bus", "0x81", "0x3b"),
        ("/domain/devices/interface/source/address", "slot", "0x10", "0x02"),
        ("/domain/devices/interface/source/address", "function", "0x1", "0x3"),
        ("/domain/devices/hostdev[2]/source/address", "uuid", SOURCE_MDEV, DEST_MDEV),
        ("/domain/devices/memory/source/path", "text", "/dev/dax0.0", "/dev/dax3.1"),
        ("/domain/cputune/vcpupin[1]", "cpuset", "3", "20"),
        ("/domain/cputune/vcpupin[2]", "cpuset", "9", "21"),
        ("/domain/numatune/memory", "nodeset", "1", "0"),
        *{(path, name, old, new)
          for path, s, d in zip(metadata_paths(before), SOURCE, DESTINATION)
          for name, old, new in (("id", s.assignment_id, d.assignment_id),
                                 ("device", s.device_id, d.device_id))
          if old != new},
    }
    # The VF keeps its MAC, the nvdimm its size and guest cell, the guest
    # its NUMA cell: what the guest sees does not move.
    assert parse_metadata(after) == (
        INSTANCE, frozenset(d.assignment_id for d in DESTINATION))
    assert held_resources(after) == frozenset().union(
        *(device_resources(d) for d in DESTINATION)) == TARGET.destination_resources()


def test_libvirt_s_own_xml_is_rewritten_and_accepted():
    """The XML as libvirt formats it back (its quoting, its element order,
    its added defaults), rewritten, and defined again by libvirt's test
    driver: what it then reports holds the destination's devices."""
    conn = libvirt.open("test:///default")
    try:
        domain = conn.defineXML(source_xml())
        after = rewrite_for_destination(domain.XMLDesc(0), TARGET)
        redefined = conn.defineXML(after).XMLDesc(0)
        assert held_resources(redefined) == TARGET.destination_resources()
        assert parse_metadata(redefined)[1] == {d.assignment_id for d in DESTINATION}
        conn.lookupByUUIDString(INSTANCE).undefine()
    finally:
        conn.close()


def test_the_vf_mac_carried_over_is_kept_when_the_destination_defines_the_guest_again():
    """The destination's assignment id derives another MAC; a redefinition
    there keeps the one the guest arrived with."""
    after = rewrite_for_destination(source_xml(), TARGET)
    assert domain_identity(after) == DomainIdentity(f"instance-{INSTANCE}",
                                                    {"d-vf": vf_mac("s-vf")})


def test_the_guests_own_addresses_stay():
    """libvirt's live XML gives each device the address the guest sees it
    at, directly under the device: only the one under <source> names the
    host."""
    root = etree.fromstring(source_xml())
    for device in root.iterfind("devices/*"):
        etree.SubElement(device, "alias", name=f"{device.tag}0")
        etree.SubElement(device, "address", type="pci", domain="0x0000", bus="0x06",
                         slot="0x00", function="0x0")
    before = etree.tostring(root, encoding="unicode")
    after = etree.fromstring(rewrite_for_destination(before, TARGET))
    assert {(a.get("bus"), a.get("slot")) for a in after.iterfind("devices/*/address")} \
        == {("0x06", "0x00")}
    assert after.find("devices/hostdev[@type='pci']/source/address").get("bus") == "0xe1"


def test_identity_is_a_no_op():
    before = source_xml()
    identity = LiveMigrationTarget.identity(INSTANCE, SOURCE)
    assert rewrite_for_destination(before, identity) == before
    # A list libvirt spelled its own way keeps its spelling when its CPUs stay.
    spelled = with_extra(before, "cputune", "emulatorpin", cpuset="3-9,^4-8")
    assert rewrite_for_destination(spelled, identity) == spelled


def test_one_cell_can_become_two():
    """The source gave CPUs and memory from cell 1; the destination gives
    CPUs from cell 0 and memory from cell 1."""
    destination = DESTINATION[:-1] + (GuestDevice("d-mem", DeviceKind.NUMA, "1",
                                                  amount=512),)
    target = LiveMigrationTarget(INSTANCE, tuple(
        DeviceMove(s, d) for s, d in zip(SOURCE, destination)))
    after = etree.fromstring(rewrite_for_destination(source_xml(), target))
    assert after.find("numatune/memory").get("nodeset") == "0-1"


def test_host_cpusets_and_cells_beyond_our_writer():
    """emulatorpin, <vcpu cpuset>, memnode and a ranged cpuset as libvirt
    may write them: each host CPU and cell is mapped; guest vCPU numbers and
    cells stay."""
    root = etree.fromstring(source_xml())
    root.find("vcpu").set("cpuset", "3,9")
    etree.SubElement(root.find("cputune"), "emulatorpin", cpuset="3-9,^4-8")
    etree.SubElement(root.find("numatune"), "memnode", cellid="0", mode="strict",
                     nodeset="1")
    after = etree.fromstring(rewrite_for_destination(
        etree.tostring(root, encoding="unicode"), TARGET))
    assert after.find("vcpu").get("cpuset") == "20-21"
    assert after.find("cputune/emulatorpin").get("cpuset") == "20-21"
    assert after.find("numatune/memnode").attrib == {"cellid": "0", "mode": "strict",
                                                    "nodeset": "0"}
    assert [p.get("vcpu") for p in after.iterfind("cputune/vcpupin")] == ["0", "1"]


# --- refusals: never a half-rewritten XML --------------------------------

def moves_but(index: int, replacement=None) -> LiveMigrationTarget:
    moves = list(TARGET.moves)
    if replacement is None:
        del moves[index]
    else:
        moves[index] = replacement
    return LiveMigrationTarget(INSTANCE, tuple(moves))


@pytest.mark.parametrize("target,message", [
    (moves_but(1), "holds assignment 's-vf', which no move of the target replaces"),
    (LiveMigrationTarget(INSTANCE, TARGET.moves + (DeviceMove(
        GuestDevice("s-gone", DeviceKind.VF, "0000:81:10.2"),
        GuestDevice("d-gone", DeviceKind.VF, "0000:3b:02.4")),)),
     "moves assignment s-gone, which the source XML does not hold"),
    (moves_but(2, DeviceMove(SOURCE[2], DESTINATION[1])),
     "s-mdev: a mdev cannot be replaced by a vf (d-vf)"),
    (moves_but(1, DeviceMove(GuestDevice("s-vf", DeviceKind.VF, "0000:81:10.2"),
                             DESTINATION[1])),
     "s-vf: the source XML holds vf 0000:81:10.1, the target moves vf 0000:81:10.2"),
    (moves_but(4, DeviceMove(SOURCE[4], GuestDevice("d-x", DeviceKind.PCPU, "21-22",
                                                    cpus=frozenset({21, 22})))),
     "s-cpu3: 1 pinned CPUs replaced by 2"),
    (moves_but(4, DeviceMove(SOURCE[4], DESTINATION[5])),
     "gives the destination's host CPU 21 to two devices"),
    (moves_but(1, DeviceMove(SOURCE[1], GuestDevice("d-vf", DeviceKind.VF,
                                                    "10000:e1:1f.7"))),
     "gives the destination's vf 10000:e1:1f.7 to two devices"),
    (moves_but(3, DeviceMove(SOURCE[3], GuestDevice(
        "d-pmem", DeviceKind.PMEM, "ns7", detail=DeviceDetail(0, (1 << 30) - 4096, "/dev/dax3.1")))),
     "1073737728 bytes cannot back the guest's 1073741824-byte nvdimm"),
    (moves_but(3, DeviceMove(SOURCE[3], GuestDevice("d-pmem", DeviceKind.PMEM, "ns7"))),
     "pmem d-pmem (ns7): no backing path in its detail"),
    (moves_but(6, DeviceMove(SOURCE[6], GuestDevice("d-vcpu", DeviceKind.NUMA, "x"))),
     "d-vcpu: NUMA cell: not an integer"),
    (LiveMigrationTarget("11111111-2222-3333-4444-555555555555", TARGET.moves),
     f"the source XML is instance {INSTANCE}'s, the target instance "
     "11111111-2222-3333-4444-555555555555's"),
])
def test_refused(target, message):
    with pytest.raises(MigrationXmlError) as e:
        rewrite_for_destination(source_xml(), target)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def with_extra(xml: str, path: str, tag: str, **attrs) -> str:
    root = etree.fromstring(xml)
    parent = root.find(path)
    element = etree.SubElement(parent, tag, **attrs)
    if tag == "hostdev":
        etree.SubElement(etree.SubElement(element, "source"), "address",
                         domain="0x0000", bus="0x06", slot="0x00", function="0x1")
    return etree.tostring(root, encoding="unicode")


@pytest.mark.parametrize("xml,message", [
    # A device the metadata does not name, held all the same.
    (with_extra(source_xml(), "devices", "hostdev", mode="subsystem", type="pci"),
     "holds PCI device 0000:06:00.1, which no move of the target replaces"),
    # Emulator threads on a CPU the guest does not own.
    (with_extra(source_xml(), "cputune", "emulatorpin", cpuset="4"),
     "holds host CPU 4, which no move of the target replaces"),
    (with_extra(source_xml(), "numatune", "memnode", cellid="0", nodeset="2"),
     "holds host NUMA cell 2, which no move of the target replaces"),
    # Pinned CPUs the XML does not pin.
    (source_xml().replace('<vcpupin vcpu="1" cpuset="9"/>', ""),
     "moves host CPU 9, which the source XML does not hold"),
    (source_xml().replace("<numatune>", "<numatune_gone>")
     .replace("</numatune>", "</numatune_gone>"),
     "moves host NUMA cell 1, which the source XML does not hold"),
    (source_xml().replace('uuid="4b20', 'uuid="zz20'), "hostdev mdev uuid: not a UUID"),
    (source_xml().replace('<metadata>', '<metadata_gone>')
     .replace('</metadata>', '</metadata_gone>'), "no metadata of ours"),
    ("<domain", "malformed XML"),
])
def test_refused_xml(xml, message):
    with pytest.raises(MigrationXmlError) as e:
        rewrite_for_destination(xml, TARGET)
    assert message in str(e.value)


# --- any device set ------------------------------------------------------

_addresses = st.builds("{:04x}:{:02x}:{:02x}.{:x}".format, st.sampled_from([0, 0x10000]),
                       st.integers(0, 255), st.integers(0, 31), st.integers(0, 7))


@st.composite
def device_sets(draw, prefix: str):
    """Devices of every kind with distinct host names, as one host claims
    them for one guest (counts fixed by ``draw``'s caller)."""
    counts = draw(st.shared(st.tuples(*(st.integers(0, 3) for _ in range(5))),
                            key="counts"))
    n_pci, n_vf, n_mdev, n_pmem, n_cpu = counts
    pci = draw(st.lists(_addresses, min_size=n_pci + n_vf, max_size=n_pci + n_vf,
                        unique=True))
    mdevs = draw(st.lists(st.uuids().map(str), min_size=n_mdev, max_size=n_mdev,
                          unique=True))
    paths = draw(st.lists(st.integers(0, 99).map("/dev/dax{}.0".format), min_size=n_pmem,
                          max_size=n_pmem, unique=True))
    cpus = draw(st.lists(st.integers(0, 255), min_size=n_cpu, max_size=n_cpu,
                         unique=True))
    cell = draw(st.integers(0, 7))
    devices = [GuestDevice(f"{prefix}-pci{i}", DeviceKind.PCI, a)
               for i, a in enumerate(pci[:n_pci])]
    devices += [GuestDevice(f"{prefix}-vf{i}", DeviceKind.VF, a)
                for i, a in enumerate(pci[n_pci:])]
    devices += [GuestDevice(f"{prefix}-mdev{i}", DeviceKind.MDEV, u)
                for i, u in enumerate(mdevs)]
    devices += [GuestDevice(f"{prefix}-pmem{i}", DeviceKind.PMEM, f"ns{i}",
                            detail=DeviceDetail(size_bytes=1 << 30, dev_path=p))
                for i, p in enumerate(paths)]
    devices += [pcpu(f"{prefix}-cpu{c}", c) for c in cpus]
    devices += [GuestDevice(f"{prefix}-numa", DeviceKind.NUMA, str(cell))]
    return tuple(devices)


@settings(max_examples=150, deadline=None)
@given(device_sets("s"), device_sets("d"))
def test_any_device_set(source, destination):
    before = source_xml(source, vcpus=4)
    target = LiveMigrationTarget(INSTANCE, tuple(
        DeviceMove(s, d) for s, d in zip(source, destination)))
    after = rewrite_for_destination(before, target)
    assert held_resources(after) == target.destination_resources()
    assert parse_metadata(after) == (
        INSTANCE, frozenset(d.assignment_id for d in destination))
    assert rewrite_for_destination(before, LiveMigrationTarget.identity(
        INSTANCE, source)) == before
    # And back: the destination's XML rewritten for the source's devices.
    back = LiveMigrationTarget(INSTANCE, tuple(
        DeviceMove(d, s) for s, d in zip(source, destination)))
    assert rewrite_for_destination(after, back) == before
