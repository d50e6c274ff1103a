"""The domain XML a live-migrating guest is given on the destination: the
source's live XML with every host resource it names replaced by the one the
destination claimed in its place. Pure: text in, text out.

Only what names the host changes: the PCI address under a hostdev's or a
hostdev interface's ``<source>``, an mdev hostdev's UUID, an nvdimm's backing
path, the host CPUs of ``<vcpu cpuset>`` and ``<cputune>``'s pins, the host
cells of ``<numatune>`` and of a memory device's ``<nodemask>``, and our
metadata's assignment and device ids. What the guest sees stays: its PCI
addresses (the ``<address>`` directly under a device), a VF's MAC, an
nvdimm's size and ``<target><node>`` (a guest cell), the guest's NUMA cells
under ``<cpu><numa>``, and every other element and attribute in its order.

The source's XML and the target must describe the same devices. Anything
else is refused whole with MigrationXmlError: a device the XML holds that no
move replaces, a move for a device the XML does not hold, a move that
changes a device's kind; the caller gets either a complete XML or nothing.
"""
from __future__ import annotations

import uuid as uuid_lib
from collections.abc import Iterable
from dataclasses import dataclass, field

from lxml import etree

from compute_agent.common.cpuset import format_cpu_set
from compute_agent.drivers.base import DeviceKind, GuestDevice
from compute_agent.drivers.errors import InvalidHostData, MigrationXmlError
from compute_agent.drivers.host_data import parse_cpulist, parse_int, parse_pci_address
from compute_agent.drivers.libvirt.capabilities import _kib, parse_xml
from compute_agent.drivers.libvirt.guest_xml import NAMESPACE
from compute_agent.drivers.migration import DeviceMove, LiveMigrationTarget

_NS = f"{{{NAMESPACE}}}"
_PCI_SOURCES = ("devices/hostdev[@type='pci']/source/address",
                "devices/interface[@type='hostdev']/source/address[@type='pci']")
_MDEV_SOURCES = "devices/hostdev[@type='mdev']/source/address"
_NVDIMMS = "devices/memory[@model='nvdimm']"
# Attributes naming host CPUs. vcpupin's vcpu, vcpusched's vcpus and the
# like name the guest's own vCPUs and stay.
_CPUSETS = ("vcpu", "cputune/vcpupin", "cputune/emulatorpin",
            "cputune/iothreadpin")
_NODESETS = ("numatune/memory", "numatune/memnode")


@dataclass
class _Used:
    """A map from the source's resource to the destination's, remembering
    which entries the XML named, so an entry for something the XML does not
    hold is found."""

    what: str
    mapping: dict
    named: set = field(default_factory=set)

    def __getitem__(self, source):
        if source not in self.mapping:
            raise MigrationXmlError(f"the source XML holds {self.what} {source}, "
                                    "which no move of the target replaces")
        self.named.add(source)
        return self.mapping[source]

    def check_all_named(self) -> None:
        missing = sorted(set(self.mapping) - self.named, key=str)
        if missing:
            raise MigrationXmlError(f"the target moves {self.what} {missing[0]}, "
                                    "which the source XML does not hold")


def rewrite_for_destination(source_xml: str, target: LiveMigrationTarget) -> str:
    """The source's domain XML for the destination's devices. Raises
    MigrationXmlError naming the first device or field in the way."""
    try:
        root = parse_xml(source_xml, "source domain")
    except InvalidHostData as e:
        raise MigrationXmlError(str(e)) from None
    for move in target.moves:
        _check_kinds(move)
    _rewrite_metadata(root, target)
    pci = _Used("PCI device", _pairs(target.moves, (DeviceKind.PCI, DeviceKind.VF,
                                                    DeviceKind.VGPU_VF), _pci_id))
    mdevs = _Used("mdev", _pairs(target.moves, (DeviceKind.MDEV,), _mdev_id))
    paths = _Used("nvdimm backing path",
                  _pairs(target.moves, (DeviceKind.PMEM,), _backing_path))
    cpus = _Used("host CPU", _cpu_map(target.moves))
    cells = _Used("host NUMA cell", _cell_map(target.moves))
    _rewrite_pci(root, pci)
    _rewrite_mdevs(root, mdevs)
    # Every pmem move has its backing path: _backing_path refused it above.
    _rewrite_nvdimms(root, paths, {m.source.detail.dev_path: m.destination
                                   for m in target.moves
                                   if m.source.kind is DeviceKind.PMEM and m.source.detail.dev_path})
    _rewrite_sets(root, _CPUSETS, "cpuset", cpus, _cpu_image)
    _rewrite_sets(root, _NODESETS, "nodeset", cells, _cell_image)
    for nodemask in root.iterfind("devices/memory/source/nodemask"):
        new = _rewritten_set(nodemask.text, "memory nodemask", cells, _cell_image)
        if new is not None:
            nodemask.text = new
    for used in (pci, mdevs, paths, cpus, cells):
        used.check_all_named()
    # The root's trailing blanks are not part of the tree; keep them too.
    return (etree.tostring(root, encoding="unicode")
            + source_xml[len(source_xml.rstrip()):])


def _check_kinds(move: DeviceMove) -> None:
    if move.source.kind is not move.destination.kind:
        raise MigrationXmlError(
            f"assignment {move.source.assignment_id}: a {move.source.kind.value} "
            f"cannot be replaced by a {move.destination.kind.value} "
            f"({move.destination.assignment_id})")


def _rewrite_metadata(root: etree._Element, target: LiveMigrationTarget) -> None:
    """Our metadata names the destination's assignments; every entry must be
    one the target moves, unchanged in kind and device."""
    instance = root.find(f"metadata/{_NS}instance")
    if instance is None:
        raise MigrationXmlError("the source XML has no metadata of ours: "
                                "not a guest this agent defined")
    if _uuid(instance.get("uuid")) != _uuid(target.instance_uuid):
        raise MigrationXmlError(f"the source XML is instance {instance.get('uuid')}'s, "
                                f"the target instance {target.instance_uuid}'s")
    moves = {m.source.assignment_id: m for m in target.moves}
    entries = list(instance.iterfind(f"{_NS}assignment"))
    for entry in entries:
        assignment_id = (entry.get("id") or "").strip()
        move = moves.pop(assignment_id, None)
        if move is None:
            raise MigrationXmlError(f"the source XML holds assignment "
                                    f"{assignment_id!r}, which no move of the "
                                    "target replaces")
        if (entry.get("kind"), entry.get("device")) != (move.source.kind.value,
                                                         move.source.device_id):
            raise MigrationXmlError(
                f"assignment {assignment_id}: the source XML holds "
                f"{entry.get('kind')} {entry.get('device')}, the target moves "
                f"{move.source.kind.value} {move.source.device_id}")
        entry.set("id", move.destination.assignment_id)
        entry.set("device", move.destination.device_id)
    if moves:
        raise MigrationXmlError(f"the target moves assignment {sorted(moves)[0]}, "
                                "which the source XML does not hold")


def _pairs(moves: Iterable[DeviceMove], kinds: tuple[DeviceKind, ...],
           resource) -> dict:
    """source resource -> destination resource, for the moves of ``kinds``;
    ``resource`` reads one device's."""
    out: dict = {}
    for m in moves:
        if m.source.kind in kinds:
            _add_one_to_one(out, m.source.kind.value, resource(m.source),
                            resource(m.destination))
    return out


def _add_one_to_one(out: dict, what: str, source, destination) -> None:
    if source in out:
        raise MigrationXmlError(f"the target moves {what} {source} twice")
    if destination in out.values():
        raise MigrationXmlError(f"the target gives the destination's {what} "
                                f"{destination} to two devices")
    out[source] = destination


def _pci_id(device: GuestDevice) -> str:
    try:
        return parse_pci_address(device.device_id, device.assignment_id, "device_id")
    except InvalidHostData as e:
        raise MigrationXmlError(str(e)) from None


def _mdev_id(device: GuestDevice) -> str:
    return _uuid(device.device_id, f"mdev {device.assignment_id}")


def _backing_path(device: GuestDevice) -> str:
    if not device.detail.dev_path:
        raise MigrationXmlError(f"pmem {device.assignment_id} ({device.device_id}): "
                                "no backing path in its detail")
    return device.detail.dev_path


def _uuid(text: str | None, what: str = "instance") -> str:
    try:
        return str(uuid_lib.UUID((text or "").strip()))
    except (AttributeError, ValueError):
        raise MigrationXmlError(f"{what}: not a UUID: {text!r}") from None


def _cpu_map(moves: Iterable[DeviceMove]) -> dict[int, int]:
    """Source CPU -> destination CPU: within one move, in the order of their
    numbers."""
    out: dict[int, int] = {}
    for m in moves:
        if m.source.kind is not DeviceKind.PCPU:
            continue
        if len(m.source.cpus) != len(m.destination.cpus):
            raise MigrationXmlError(
                f"assignment {m.source.assignment_id}: {len(m.source.cpus)} pinned "
                f"CPUs replaced by {len(m.destination.cpus)}")
        for here, there in zip(sorted(m.source.cpus), sorted(m.destination.cpus)):
            _add_one_to_one(out, "host CPU", here, there)
    return out


def _cell_map(moves: Iterable[DeviceMove]) -> dict[int, frozenset[int]]:
    """Source cell -> the destination's cells in its place. An instance's
    CPUs and memory may come from one cell on the source and two on the
    destination, so one cell can become several."""
    out: dict[int, frozenset[int]] = {}
    for m in moves:
        if m.source.kind is DeviceKind.NUMA:
            here = _cell(m.source)
            out[here] = out.get(here, frozenset()) | {_cell(m.destination)}
    return out


def _cell(device: GuestDevice) -> int:
    try:
        return parse_int(device.device_id, device.assignment_id, "NUMA cell",
                         maximum=4095)
    except InvalidHostData as e:
        raise MigrationXmlError(str(e)) from None


def _rewrite_pci(root: etree._Element, pci: _Used) -> None:
    for path in _PCI_SOURCES:
        for address in root.iterfind(path):
            where = f"{address.getparent().getparent().tag} source address"
            try:
                parts = [parse_int(address.get(f), where, f, base=16)
                         for f in ("domain", "bus", "slot", "function")]
                source = parse_pci_address(
                    "{:04x}:{:02x}:{:02x}.{:x}".format(*parts), where, "address")
            except InvalidHostData as e:
                raise MigrationXmlError(str(e)) from None
            destination = pci[source]
            if destination != source:
                domain, bus, rest = destination.split(":")
                slot, function = rest.split(".")
                # libvirt's own spelling: 0x-prefixed, zero-padded hex.
                address.set("domain", f"0x{domain}")
                address.set("bus", f"0x{bus}")
                address.set("slot", f"0x{slot}")
                address.set("function", f"0x{function}")


def _rewrite_mdevs(root: etree._Element, mdevs: _Used) -> None:
    for address in root.iterfind(_MDEV_SOURCES):
        source = _uuid(address.get("uuid"), "hostdev mdev uuid")
        destination = mdevs[source]
        if destination != source:
            address.set("uuid", destination)


def _rewrite_nvdimms(root: etree._Element, paths: _Used,
                     destinations: dict[str, GuestDevice]) -> None:
    for memory in root.iterfind(_NVDIMMS):
        path = memory.find("source/path")
        if path is None or not (path.text or "").strip():
            raise MigrationXmlError("an nvdimm of the source XML has no backing path")
        source = path.text.strip()
        new = paths[source]
        _check_fits(memory, source, destinations[source])
        if new != source:
            path.text = new


def _check_fits(memory: etree._Element, source: str, destination: GuestDevice) -> None:
    """The guest's nvdimm keeps its size; the destination's namespace must
    hold it."""
    size = memory.find("target/size")
    have = destination.detail.size_bytes
    if size is None or have is None:
        return
    try:
        wanted = _kib(size, source, "nvdimm target size", int(size.text)) * 1024
    except InvalidHostData as e:
        raise MigrationXmlError(str(e)) from None
    except (TypeError, ValueError):
        raise MigrationXmlError(f"nvdimm {source}: target size: not an amount: "
                                f"{size.text!r}") from None
    if have < wanted:
        raise MigrationXmlError(
            f"pmem {destination.assignment_id} ({destination.device_id}): "
            f"{have} bytes cannot back the guest's {wanted}-byte nvdimm")


def _cpu_image(cpus: _Used, cpu: int) -> frozenset[int]:
    return frozenset({cpus[cpu]})


def _cell_image(cells: _Used, cell: int) -> frozenset[int]:
    return cells[cell]


def _rewrite_sets(root: etree._Element, paths: tuple[str, ...], attribute: str,
                  used: _Used, image) -> None:
    for path in paths:
        for element in root.iterfind(path):
            if element.get(attribute) is None:
                continue
            new = _rewritten_set(element.get(attribute), f"{path} {attribute}",
                                 used, image)
            if new is not None:
                element.set(attribute, new)


def _rewritten_set(text: object, where: str, used: _Used, image) -> str | None:
    """The list with each member replaced by its image; None when that is
    the same set, so an unchanged list keeps its spelling."""
    try:
        members = parse_cpulist(text, "source domain", where, allow_exclusions=True)
    except InvalidHostData as e:
        raise MigrationXmlError(str(e)) from None
    new = frozenset().union(*(image(used, m) for m in members))
    return None if new == members else format_cpu_set(new)
