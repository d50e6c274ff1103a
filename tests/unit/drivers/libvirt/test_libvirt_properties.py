"""Generated junk fed to every parser: the only exception allowed out is
InvalidHostData. The node-device parser also gets valid documents, made
after libvirt's node-device XML format (formatnode), and must read back
what each says."""
import json
import os
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from lxml import etree

from compute_agent.common.pci_address import format_address, node_device_name
from compute_agent.drivers.base import Mdev, MdevParent, MdevType, PciDevice, PciKind
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.libvirt import capabilities, nodedev, pmem
from compute_agent.drivers.libvirt.sysfs import SysfsReader

SETTINGS = settings(
    max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture])

_values = st.one_of(st.text(max_size=12), st.integers(-5, 1 << 40).map(str),
                    st.sampled_from(["0x8086", "-1", "0-3", "0x", "4-", ""]))


def _element(tags, attrs, depth=2):
    children = (st.lists(st.deferred(lambda: _element(tags, attrs, depth - 1)),
                         max_size=4) if depth else st.just([]))
    return st.builds(
        lambda tag, at, text, kids: "<{0}{1}>{2}{3}</{0}>".format(
            tag, "".join(f" {k}='{v}'" for k, v in at.items()),
            text, "".join(kids)),
        st.sampled_from(tags),
        st.dictionaries(st.sampled_from(attrs),
                        _values.map(lambda v: v.replace("'", "")
                                    .replace("<", "").replace("&", "")),
                        max_size=3),
        _values.map(lambda v: v.replace("<", "").replace("&", "")),
        children)


_NODEDEV_TAGS = ["name", "parent", "capability", "domain", "bus", "slot",
                 "function", "vendor", "product", "class", "numa", "address",
                 "iommuGroup", "type", "uuid", "availableInstances", "driver"]
_NODEDEV_ATTRS = ["type", "id", "node", "number", "maxCount", "domain", "bus",
                  "slot", "function"]
_CAPS_TAGS = ["host", "uuid", "topology", "cells", "cell", "memory", "cpus",
              "cpu", "pages", "distances", "sibling"]
_CAPS_ATTRS = ["id", "unit", "size", "siblings", "value", "num"]


def _allowed(fn, *args):
    """``fn``'s answer, or None when it refused with InvalidHostData."""
    try:
        return fn(*args)
    except InvalidHostData:
        return None


def _well_formed(text: str) -> bool:
    try:
        etree.fromstring(text)
    except etree.XMLSyntaxError:
        return False
    return True


# --- valid node devices, as libvirt formats them ------------------------------

_addresses = st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFF),
                       st.integers(0, 0x1F), st.integers(0, 7))
_words = st.text(st.characters(codec="ascii", categories=("L", "N")),
                 min_size=1, max_size=12)


def _sub(parent: etree._Element, tag: str, text: object = None, **attrs) -> etree._Element:
    el = etree.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})
    if text is not None:
        el.text = str(text)
    return el


def _address_el(parent: etree._Element, tag: str, parts: tuple[int, int, int, int]) -> None:
    """libvirt writes an <address>'s attributes in hex."""
    domain, bus, slot, function = parts
    _sub(parent, tag, domain=f"0x{domain:04x}", bus=f"0x{bus:02x}",
         slot=f"0x{slot:02x}", function=f"0x{function:x}")


@st.composite
def valid_pci_devices(draw) -> tuple[str, nodedev.NodeDevice]:
    """A PCI function (a plain one, a PF with its VFs, or a VF), maybe
    offering mdev types, and what it must parse to."""
    parts = draw(_addresses)
    address = format_address(*parts)
    vendor, product = draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 0xFFFF))
    class_id = draw(st.none() | st.integers(0, 0xFFFFFF))
    numa = draw(st.none() | st.integers(-1, 7))
    group = draw(st.none() | st.integers(0, 1 << 16))
    driver = draw(st.none() | _words)
    kind = draw(st.sampled_from(PciKind))
    types = draw(st.lists(st.tuples(_words.map(lambda w: f"type-{w}"), st.integers(0, 64),
                                    st.none() | _words, st.sampled_from(["vfio-pci", "vfio-ccw"])),
                          max_size=3, unique_by=lambda t: t[0]))

    root = etree.Element("device")
    _sub(root, "name", node_device_name(address))
    _sub(root, "path", f"/sys/devices/pci{parts[0]:04x}:00/{address}")
    _sub(root, "parent", "computer")
    if driver is not None:
        _sub(_sub(root, "driver"), "name", driver)
    cap = _sub(root, "capability", type="pci")
    if class_id is not None:
        _sub(cap, "class", f"0x{class_id:06x}")
    for tag, value in zip(("domain", "bus", "slot", "function"), parts):
        _sub(cap, tag, value)  # in decimal, as libvirt writes these
    _sub(cap, "product", draw(_words), id=f"0x{product:04x}")
    _sub(cap, "vendor", draw(_words), id=f"0x{vendor:04x}")
    parent_address, total_vfs, num_vfs = None, 0, 0
    if kind is PciKind.PF:
        vfs = draw(st.lists(_addresses, max_size=4, unique=True))
        num_vfs = len(vfs)
        total_vfs = draw(st.integers(num_vfs, 256))
        functions = _sub(cap, "capability", type="virt_functions", maxCount=total_vfs)
        for vf in vfs:
            _address_el(functions, "address", vf)
    elif kind is PciKind.VF:
        pf = draw(_addresses)
        parent_address = format_address(*pf)
        _address_el(_sub(cap, "capability", type="phys_function"), "address", pf)
    if types:
        offered = _sub(cap, "capability", type="mdev_types")
        for type_id, available, name, api in types:
            el = _sub(offered, "type", id=type_id)
            if name is not None:
                _sub(el, "name", name)
            _sub(el, "deviceAPI", api)
            _sub(el, "availableInstances", available)
    if group is not None:
        _address_el(_sub(cap, "iommuGroup", number=group), "address", parts)
    if numa is not None:
        _sub(cap, "numa", node=numa)

    hex_vendor, hex_product = f"{vendor:04x}", f"{product:04x}"
    numa_node = None if numa in (None, -1) else numa
    pci = PciDevice(address, hex_vendor, hex_product, kind, numa_node, parent_address,
                    None if class_id is None else f"{class_id:06x}", group, driver,
                    total_vfs, num_vfs)
    parent = (MdevParent(address, numa_node, tuple(
        MdevType(type_id, available, name, api) for type_id, available, name, api in types),
        hex_vendor, hex_product) if types else None)
    return (etree.tostring(root, encoding="unicode"),
            nodedev.NodeDevice(node_device_name(address), pci=pci, mdev_parent=parent))


@st.composite
def valid_mdevs(draw) -> tuple[str, nodedev.NodeDevice]:
    """A mediated device under either name libvirt has given one (with its
    parent since 7.3), its uuid in the name, or also in <uuid>."""
    mdev_uuid = str(draw(st.uuids()))
    parent = format_address(*draw(_addresses))
    type_id = draw(_words.map(lambda w: f"nvidia-{w}"))
    name = f"mdev_{mdev_uuid.replace('-', '_')}"
    if draw(st.booleans()):
        name += f"_{parent.replace(':', '_').replace('.', '_')}"
    root = etree.Element("device")
    _sub(root, "name", name)
    _sub(root, "parent", node_device_name(parent))
    _sub(_sub(root, "driver"), "name", "vfio_mdev")
    cap = _sub(root, "capability", type="mdev")
    _sub(cap, "type", id=type_id)
    if draw(st.booleans()):
        _sub(cap, "uuid", mdev_uuid)
    _sub(cap, "iommuGroup", number=draw(st.integers(0, 1 << 16)))
    return (etree.tostring(root, encoding="unicode"),
            nodedev.NodeDevice(name, mdev=Mdev(mdev_uuid, type_id, parent)))


def test_nodedev_parser():
    """Junk is refused with InvalidHostData; a valid document parses to
    what it says. At least a quarter of the documents are valid ones, so
    the parser's way to a result is fuzzed too."""
    outcomes: Counter[str] = Counter()

    @SETTINGS
    @given(st.one_of(
        st.text(max_size=200).map(lambda t: (t, None)),
        st.binary(max_size=200).map(lambda b: (b, None)),
        _element(_NODEDEV_TAGS, _NODEDEV_ATTRS).map(
            lambda x: (f"<device><name>d</name>{x}</device>", None)),
        valid_pci_devices(), valid_mdevs()))
    def parse(case: tuple[object, nodedev.NodeDevice | None]) -> None:
        text, expected = case
        if expected is None:
            _allowed(nodedev.parse_node_device, text)
        else:
            assert nodedev.parse_node_device(text) == expected, text
        found, warnings = nodedev.parse_node_devices([("d", text)])
        if expected is not None:
            assert (found, warnings) == ([expected], [])
        outcomes["parsed" if found else "refused"] += 1

    parse()
    assert outcomes["parsed"] >= sum(outcomes.values()) / 4, outcomes


@SETTINGS
@given(st.one_of(st.text(max_size=200).map(lambda t: (t, False)),
                 _element(_CAPS_TAGS, _CAPS_ATTRS, depth=3).map(
                     lambda x: (f"<capabilities><host>{x}</host>"
                                f"<host><topology><cells>{x}</cells>"
                                f"</topology></host></capabilities>", True))))
@example(("<capabilities><host><topology><cells><cell id='x'/><cell id='0'/>"
          "<cell id='0'/></cells></topology></host></capabilities>", True))
def test_capabilities_parser(case: tuple[str, bool]):
    """Junk is refused; a well-formed <capabilities><host> never is: a cell
    that cannot be read is left out with a warning."""
    text, wrapped = case
    found = _allowed(capabilities.parse_capabilities, text)
    if wrapped and _well_formed(text):
        assert found is not None, text
        ids = [c.id for c in found.cells]
        assert len(ids) == len(set(ids))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.sampled_from(["dev", "size", "mode", "name", "uuid", "numa_node",
                         "chardev"]), kids, max_size=7),
    max_leaves=12)


@SETTINGS
@given(st.one_of(_json.map(json.dumps), st.text(max_size=50)))
def test_ndctl_parser(text):
    """Junk is refused; a JSON list never is: an entry that is not a
    namespace is left out with a warning."""
    found = _allowed(pmem.parse_ndctl_json, text)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, list):
        assert found is not None, text
        namespaces, warnings = found
        assert len(namespaces) + len(warnings) >= len(data)


_SYSFS_FILES = [
    "bus/pci/devices/0000:01:00.0/vendor",
    "bus/pci/devices/0000:01:00.0/device",
    "bus/pci/devices/0000:01:00.0/class",
    "bus/pci/devices/0000:01:00.0/numa_node",
    "bus/pci/devices/0000:01:00.0/sriov_totalvfs",
    "bus/pci/devices/0000:01:00.0/sriov_numvfs",
    "bus/pci/devices/junk/vendor",
    "bus/pci/devices/0000:01:00.0/nvidia/creatable_vgpu_types",
    "bus/pci/devices/0000:01:00.0/nvidia/current_vgpu_type",
    "class/mdev_bus/0000:01:00.0/mdev_supported_types/t1/available_instances",
    "class/mdev_bus/0000:01:00.0/mdev_supported_types/t1/name",
    "class/mdev_bus/0000:01:00.0/mdev_supported_types/t2",
    "bus/mdev/devices/not-a-uuid/mdev_type",
    "devices/system/node/node0/cpulist",
    "devices/system/node/node0/meminfo",
    "devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
    "devices/system/node/node1/cpulist",
    "bus/nd/devices/namespace0.0/size",
    "bus/nd/devices/namespace0.0/mode",
    "bus/nd/devices/namespace0.0/numa_node",
    "bus/nd/devices/namespace0.0/uuid",
]


@SETTINGS
@given(files=st.dictionaries(st.sampled_from(_SYSFS_FILES),
                             st.one_of(_values, st.binary(max_size=20)),
                             max_size=12))
def test_sysfs_reader(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("sys")
    for relative, content in files.items():
        path = root / relative
        if any(p.is_file() for p in path.parents):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            continue
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    reader = SysfsReader(os.fspath(root))
    # Whatever the files say, each reader answers: what it cannot read is
    # left out, with a warning, and what it gives is what the files name.
    cells, _ = reader.numa_cells(4)
    assert {c.id for c in cells} <= {0, 1}
    devices, warnings = reader.pci_devices()
    assert set(devices) <= {"0000:01:00.0"}
    if (root / "bus/pci/devices/junk").is_dir():
        assert any("junk" in w for w in warnings), warnings
    reader.mdev_types()
    mdevs, warnings = reader.mdevs()
    assert mdevs == []
    if (root / "bus/mdev/devices/not-a-uuid").is_dir():
        assert any("not-a-uuid" in w for w in warnings), warnings
    pmem.read_namespaces(reader, None)
