"""Domain XML for a guest and the metadata that says which assignments it
holds. Pure: lxml in, text out, so every device kind is testable without
libvirt.

The assignment ids live in our own ``<metadata>`` namespace. libvirt keeps
custom metadata verbatim, so after a restart ``parse_metadata`` tells the
agent which domains are its own and which claims they still hold.

A guest defined again keeps its DomainIdentity: the name and VF MACs its
definition has, which earlier versions wrote differently (see
docs/drivers.md).
"""
from __future__ import annotations

import hashlib
import uuid as uuid_lib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lxml import etree

from compute_agent.drivers.base import (
    DeviceKind,
    ForeignGuest,
    GuestDevice,
    GuestHolding,
    GuestSpec,
    HostResource,
    HostResourceKind,
)
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.host_data import format_pci_address, parse_cpulist, parse_int, parse_pci_address
from compute_agent.drivers.libvirt.capabilities import _kib, parse_xml

NAMESPACE = "http://compute-agent.openstack.org/xmlns/instance/1"
PREFIX = "ca"
_NS = f"{{{NAMESPACE}}}"
# nova's own metadata, versions 1.0 to 1.2 alike: the instance's display
# name is its <name>.
NOVA_NAMESPACE_PREFIX = "http://openstack.org/xmlns/libvirt/nova/"
# The models libvirt accepts on <hostdev type='mdev'>, which are also the
# kernel's device_api strings.
MDEV_MODELS = frozenset({"vfio-pci", "vfio-ccw", "vfio-ap"})
DEFAULT_MDEV_MODEL = "vfio-pci"
# A devdax namespace maps in 2 MiB pages; QEMU refuses an nvdimm backed by
# /dev/daxX.Y whose size or alignment is not a multiple of it.
_DEVDAX_ALIGN_KIB = 2048
# The one guest NUMA cell every nvdimm is attached to.
_GUEST_CELL = 0


@dataclass(frozen=True)
class DomainIdentity:
    """What a guest's domain keeps when the agent defines it again.

    ``name``: libvirt refuses a definition under a new name for a UUID it
    knows, and renames only a domain that is shut off (and has no
    snapshots), so a guest keeps the name it has: ``instance-<uuid>`` when
    this version defined it, the instance's name when a version before
    88f9c57 did (until a live migration, which names it by its uuid where
    it arrives). ``vf_macs``: assignment id -> the MAC of the VF interface
    it holds; a guest's NIC keeps its MAC while it keeps the VF (before
    7563c52 libvirt drew it; a live migration carries it over)."""

    name: str
    vf_macs: Mapping[str, str] = field(default_factory=dict)


def build_domain_xml(spec: GuestSpec, domain_type: str = "kvm", *,
                     mdev_models: Mapping[str, str] | None = None,
                     identity: DomainIdentity | None = None) -> str:
    """The persistent definition of ``spec``. ``mdev_models`` maps an mdev
    UUID to its type's device_api; unknown ones are vfio-pci. ``identity``:
    that of the domain the guest has, when it has one."""
    if spec.vcpus < 1 or spec.memory_mb < 1:
        raise ValueError(f"{spec.instance_uuid}: needs at least one vCPU "
                         f"and 1 MiB, got {spec.vcpus}, {spec.memory_mb}")
    by_kind = _by_kind(spec.devices)
    ram_kib = spec.memory_mb * 1024
    pmem = [(d, _pmem_size_kib(d)) for d in by_kind[DeviceKind.PMEM]]
    total_kib = ram_kib + sum(size for _, size in pmem)

    root = etree.Element("domain", type=domain_type)
    # libvirt wants a name unique on the host; an instance's name is not
    # (two tenants' "web"), so a new domain is named by the instance's uuid
    # and its name is the title.
    _text(root, "name", identity.name if identity else domain_name(spec.instance_uuid))
    _text(root, "title", spec.name)
    _text(root, "uuid", str(uuid_lib.UUID(spec.instance_uuid)))
    root.append(_metadata(spec))
    if pmem:
        # Memory devices need hotplug room: one slot each, and a maximum
        # covering RAM plus every nvdimm.
        _text(root, "maxMemory", total_kib, slots=str(len(pmem)), unit="KiB")
    # With a guest NUMA cell libvirt recomputes <memory> as cells plus
    # memory devices; writing that figure keeps our XML equal to its view.
    _text(root, "memory", total_kib, unit="KiB")
    _text(root, "currentMemory", ram_kib, unit="KiB")
    _text(root, "vcpu", spec.vcpus, placement="static")
    _cputune(root, spec, by_kind[DeviceKind.PCPU])
    _numatune(root, by_kind[DeviceKind.NUMA])
    os_el = etree.SubElement(root, "os")
    _text(os_el, "type", "hvm")
    # Diskless: the guest boots from the network.
    etree.SubElement(os_el, "boot", dev="network")
    # QEMU refuses an nvdimm without ACPI ("memory hotplug is not
    # enabled"), and a guest OS expects both, as nova gives them.
    features = etree.SubElement(root, "features")
    etree.SubElement(features, "acpi")
    etree.SubElement(features, "apic")
    if pmem:
        # An nvdimm's <target><node> must name a guest NUMA cell.
        numa = etree.SubElement(etree.SubElement(root, "cpu"), "numa")
        etree.SubElement(numa, "cell", id=str(_GUEST_CELL),
                         cpus=_cpu_range(spec.vcpus), memory=str(ram_kib),
                         unit="KiB")

    devices = etree.SubElement(root, "devices")
    for device in by_kind[DeviceKind.PCI]:
        hostdev = etree.SubElement(devices, "hostdev", mode="subsystem",
                                   type="pci", managed="yes")
        _pci_source(hostdev, device, with_type=False)
    for device in by_kind[DeviceKind.VGPU_VF]:
        # NVIDIA's vendor-specific VFIO: the VF stays bound to the nvidia
        # driver, which is its VFIO driver; libvirt must not rebind it
        # to vfio-pci, so it is not managed.
        hostdev = etree.SubElement(devices, "hostdev", mode="subsystem",
                                   type="pci", managed="no")
        _pci_source(hostdev, device, with_type=False)
    for device in by_kind[DeviceKind.VF]:
        # An SR-IOV VF as a NIC, so libvirt sets its MAC (and VLAN) on the
        # PF before handing it over, which a plain hostdev does not.
        interface = etree.SubElement(devices, "interface", type="hostdev",
                                     managed="yes")
        kept = identity.vf_macs.get(device.assignment_id) if identity else None
        etree.SubElement(interface, "mac", address=kept or vf_mac(device.assignment_id))
        _pci_source(interface, device, with_type=True)
    for device in by_kind[DeviceKind.MDEV]:
        mdev_uuid = str(uuid_lib.UUID(device.device_id))
        model = (mdev_models or {}).get(mdev_uuid, DEFAULT_MDEV_MODEL)
        if model not in MDEV_MODELS:
            raise ValueError(f"mdev {mdev_uuid}: device_api {model!r} is "
                             f"not one of {sorted(MDEV_MODELS)}")
        hostdev = etree.SubElement(devices, "hostdev", mode="subsystem",
                                   type="mdev", model=model)
        etree.SubElement(etree.SubElement(hostdev, "source"), "address",
                         uuid=mdev_uuid)
    for device, size_kib in pmem:
        _nvdimm(devices, device, size_kib)
    etree.SubElement(devices, "memballoon", model="none")
    return etree.tostring(root, pretty_print=True, encoding="unicode")


def domain_name(instance_uuid: str) -> str:
    return f"instance-{uuid_lib.UUID(instance_uuid)}"


def vf_mac(assignment_id: str) -> str:
    """A MAC fixed by the assignment, so that redefining the guest (a
    retried spawn, a move finishing) keeps it; libvirt would draw a new one.
    QEMU's locally administered prefix 52:54:00."""
    digest = hashlib.sha256(assignment_id.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def domain_identity(domain_xml: str) -> DomainIdentity:
    """The identity of a defined domain, from its saved definition. Raises
    InvalidHostData naming the domain and the element that cannot be read."""
    root = parse_xml(domain_xml, "domain")
    where = (root.findtext("uuid") or "domain").strip()
    name = (root.findtext("name") or "").strip()
    if not name:
        raise InvalidHostData(where, "name", "missing")
    return DomainIdentity(name, _vf_macs(root, where))


def _vf_macs(root: etree._Element, where: str) -> dict[str, str]:
    """Assignment id -> the MAC of the VF interface on the device our
    metadata says the assignment holds."""
    mac_at: dict[str, str] = {}
    for interface in root.iterfind("devices/interface[@type='hostdev']"):
        address = interface.find("source/address[@type='pci']")
        mac = (interface.find("mac[@address]") if address is not None else None)
        if mac is not None and mac.get("address").strip():
            mac_at[_pci_resource(address, where).id] = mac.get("address").strip()
    vf_macs = {}
    instance = root.find(f"metadata/{_NS}instance")
    for entry in () if instance is None else instance.iterfind(f"{_NS}assignment"):
        if entry.get("kind") != DeviceKind.VF.value or not (entry.get("id") or "").strip():
            continue
        try:
            address = parse_pci_address(entry.get("device") or "", where,
                                        "metadata assignment device")
        except InvalidHostData:
            # No device it can be matched to: the guest's saved devices are
            # the store's again after this definition, whose VFs then get
            # the MAC derived from their assignment.
            continue
        if address in mac_at:
            vf_macs[entry.get("id").strip()] = mac_at[address]
    return vf_macs


def parse_metadata(domain_xml: str) -> tuple[str | None, frozenset[str]]:
    """(instance uuid, assignment ids) from a domain's XML; (None, empty)
    when the domain carries no usable metadata of ours. Raises
    InvalidHostData only when the text is not XML."""
    return _metadata_of(parse_xml(domain_xml, "domain"))


def parse_live(domain_xml: str) -> tuple[str | None, frozenset[str],
                                          frozenset[HostResource]]:
    """A running domain's XML read once: parse_metadata's answer and
    held_resources'."""
    root = parse_xml(domain_xml, "domain")
    return (*_metadata_of(root), _held_by(root))


def _metadata_of(root: etree._Element) -> tuple[str | None, frozenset[str]]:
    instance = root.find(f"metadata/{_NS}instance")
    if root.tag != "domain" or instance is None:
        return None, frozenset()
    try:
        instance_uuid = str(uuid_lib.UUID((instance.get("uuid") or "")
                                          .strip()))
    except ValueError:
        return None, frozenset()
    ids = frozenset(
        a.get("id").strip() for a in instance.iterfind(f"{_NS}assignment")
        if (a.get("id") or "").strip())
    return instance_uuid, ids


def held_resources(domain_xml: str) -> frozenset[HostResource]:
    """The host resources a domain's XML holds exclusively, read from its
    devices and CPU pinning (not from our metadata), so a guest we did not
    define is read the same way. Raises InvalidHostData naming the element
    that cannot be read."""
    return _held_by(parse_xml(domain_xml, "domain"))


def parse_holding(domain_uuid: str, live_xml: str | None, saved_xml: str | None
                  ) -> GuestHolding:
    """A domain's holding, ours or not: what its live XML (None when it
    does not run) and its persistent definition (None for a transient
    domain) hold. Raises InvalidHostData naming the domain and the element
    that cannot be read."""
    roots = [parse_xml(text, "domain") for text in (live_xml, saved_xml) if text is not None]
    return GuestHolding(str(uuid_lib.UUID(domain_uuid)),
                        any(_metadata_of(root)[0] is not None for root in roots),
                        live_xml is not None,
                        frozenset().union(*(_held_by(root) for root in roots)))


def _held_by(root: etree._Element) -> frozenset[HostResource]:
    name = root.findtext("uuid") or "domain"
    held: set[HostResource] = set()
    for address in root.iterfind("devices/hostdev[@type='pci']/source/address"):
        held.add(_pci_resource(address, name))
    for address in root.iterfind(
            "devices/interface[@type='hostdev']/source/address[@type='pci']"):
        held.add(_pci_resource(address, name))
    for address in root.iterfind("devices/hostdev[@type='mdev']/source/address"):
        try:
            mdev = str(uuid_lib.UUID(address.get("uuid") or ""))
        except ValueError:
            raise InvalidHostData(name, "hostdev mdev uuid", "not a UUID",
                                  address.get("uuid")) from None
        held.add(HostResource(HostResourceKind.MDEV_UUID, mdev))
    for path in root.iterfind("devices/memory[@model='nvdimm']/source/path"):
        held.add(HostResource(HostResourceKind.BACKING_PATH, (path.text or "").strip()))
    for pin in root.iterfind("cputune/vcpupin"):
        for cpu in parse_cpulist(pin.get("cpuset"), name, "vcpupin cpuset",
                                 allow_exclusions=True):
            held.add(HostResource(HostResourceKind.HOST_CPU, str(cpu)))
    return frozenset(held)


def _pci_resource(address: etree._Element, name: str) -> HostResource:
    domain, bus, slot, function = (
        parse_int(address.get(f), name, f"source address {f}", base=16)
        for f in ("domain", "bus", "slot", "function"))
    return HostResource(HostResourceKind.PCI_ADDRESS,
                        format_pci_address((domain, bus, slot, function), name,
                                           "source address"))


def parse_guest(domain_xml: str) -> GuestSpec | None:
    """The guest as build_domain_xml wrote it, read back: name, vCPUs,
    memory (currentMemory, without nvdimms) and, from our metadata, each
    device's assignment id, kind and device id. None when the domain has
    no usable metadata of ours, or an entry lacks its kind or device."""
    root = parse_xml(domain_xml, "domain")
    instance_uuid, _ = _metadata_of(root)
    if instance_uuid is None:
        return None
    devices = []
    for entry in root.find(f"metadata/{_NS}instance").iterfind(f"{_NS}assignment"):
        try:
            kind = DeviceKind(entry.get("kind"))
        except ValueError:
            return None
        if not entry.get("id") or not entry.get("device"):
            return None
        devices.append(GuestDevice(entry.get("id").strip(), kind,
                                   entry.get("device").strip()))
    memory = root.find("currentMemory")
    if memory is None:
        memory = root.find("memory")
    try:
        kib = _kib(memory, instance_uuid, "currentMemory", int(memory.text))
        return GuestSpec(instance_uuid, root.findtext("title") or root.findtext("name"),
                         int(root.findtext("vcpu")), kib // 1024, tuple(devices))
    except (AttributeError, TypeError, ValueError, InvalidHostData):
        return None


def parse_foreign(domain_xml: str, running: bool) -> ForeignGuest | None:
    """A guest someone else defined (nova's), read from its devices and
    pinning: uuid, name (nova's display name when its metadata has one,
    else the title, else the domain's name), vCPUs, memory and what it
    holds. None when the domain carries metadata of ours. Raises
    InvalidHostData naming the domain and the element that cannot be read."""
    root = parse_xml(domain_xml, "domain")
    if _metadata_of(root)[0] is not None:
        return None
    where = root.findtext("name") or "domain"
    try:
        instance_uuid = str(uuid_lib.UUID((root.findtext("uuid") or "").strip()))
    except ValueError:
        raise InvalidHostData(where, "uuid", "not a UUID", root.findtext("uuid")) from None
    memory = root.find("currentMemory")
    if memory is None:
        memory = root.find("memory")
    if memory is None:
        raise InvalidHostData(instance_uuid, "memory", "missing")
    kib = _kib(memory, instance_uuid, memory.tag,
               parse_int(memory.text, instance_uuid, memory.tag))
    vcpus = parse_int(root.findtext("vcpu"), instance_uuid, "vcpu", minimum=1)
    return ForeignGuest(instance_uuid, _foreign_name(root, where), running, vcpus,
                        kib // 1024, _held_by(root))


def _foreign_name(root: etree._Element, domain_name_: str) -> str:
    for element in root.iterfind("metadata/*"):
        namespace = etree.QName(element).namespace or ""
        if namespace.startswith(NOVA_NAMESPACE_PREFIX) and \
                etree.QName(element).localname == "instance":
            name = (element.findtext(f"{{{namespace}}}name") or "").strip()
            if name:
                return name
    return (root.findtext("title") or "").strip() or domain_name_


def _by_kind(devices: Iterable[GuestDevice]
             ) -> dict[DeviceKind, list[GuestDevice]]:
    by_kind: dict[DeviceKind, list[GuestDevice]] = {k: [] for k in DeviceKind}
    for device in devices:
        by_kind[DeviceKind(device.kind)].append(device)
    return by_kind


def _text(parent: etree._Element, tag: str, text: object,
          **attrs: str) -> etree._Element:
    el = etree.SubElement(parent, tag, **attrs)
    el.text = str(text)
    return el


def _metadata(spec: GuestSpec) -> etree._Element:
    metadata = etree.Element("metadata")
    instance = etree.SubElement(metadata, f"{_NS}instance",
                                nsmap={PREFIX: NAMESPACE},
                                uuid=str(uuid_lib.UUID(spec.instance_uuid)))
    for device in spec.devices:
        etree.SubElement(instance, f"{_NS}assignment",
                         id=device.assignment_id,
                         kind=DeviceKind(device.kind).value,
                         device=device.device_id)
    return metadata


def _pci_source(parent: etree._Element, device: GuestDevice,
                with_type: bool) -> None:
    address = parse_pci_address(device.device_id, device.assignment_id,
                                "device_id")
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    attrs = {"type": "pci"} if with_type else {}
    attrs.update(domain=f"0x{domain}", bus=f"0x{bus}", slot=f"0x{slot}",
                 function=f"0x{function}")
    etree.SubElement(etree.SubElement(parent, "source"), "address", **attrs)


def _pmem_size_kib(device: GuestDevice) -> int:
    if not device.detail.dev_path:
        raise ValueError(f"pmem {device.device_id}: no device path")
    if device.detail.size_bytes is None:
        raise ValueError(f"pmem {device.device_id}: no size")
    size_kib = device.detail.size_bytes // 1024
    if _is_devdax(device):
        size_kib -= size_kib % _DEVDAX_ALIGN_KIB
    if size_kib <= 0:
        raise ValueError(f"pmem {device.device_id}: size "
                         f"{device.detail.size_bytes} bytes is too small")
    return size_kib


def _is_devdax(device: GuestDevice) -> bool:
    return (device.detail.dev_path or "").startswith("/dev/dax")


def _nvdimm(devices: etree._Element, device: GuestDevice,
            size_kib: int) -> None:
    memory = etree.SubElement(devices, "memory", model="nvdimm",
                              access="shared")
    source = etree.SubElement(memory, "source")
    _text(source, "path", device.detail.dev_path)
    if _is_devdax(device):
        # Real persistent memory: tell QEMU so it keeps writes durable.
        _text(source, "alignsize", _DEVDAX_ALIGN_KIB, unit="KiB")
        etree.SubElement(source, "pmem")
    target = etree.SubElement(memory, "target")
    _text(target, "size", size_kib, unit="KiB")
    _text(target, "node", _GUEST_CELL)


def _cputune(root: etree._Element, spec: GuestSpec,
             pcpus: list[GuestDevice]) -> None:
    host_cpus = sorted(frozenset().union(*(d.cpus for d in pcpus)))
    if not host_cpus:
        return
    if len(host_cpus) > spec.vcpus:
        raise ValueError(f"{spec.instance_uuid}: {len(host_cpus)} pinned "
                         f"CPUs for {spec.vcpus} vCPUs")
    cputune = etree.SubElement(root, "cputune")
    # vCPU i runs on the i-th pinned host CPU; any vCPUs beyond them (a
    # mixed instance) float.
    for vcpu, cpu in enumerate(host_cpus):
        etree.SubElement(cputune, "vcpupin", vcpu=str(vcpu), cpuset=str(cpu))


def _numatune(root: etree._Element, cells: list[GuestDevice]) -> None:
    nodes = sorted({int(d.device_id) for d in cells})
    if nodes:
        numatune = etree.SubElement(root, "numatune")
        etree.SubElement(numatune, "memory", mode="strict",
                         nodeset=",".join(map(str, nodes)))


def _cpu_range(vcpus: int) -> str:
    return "0" if vcpus == 1 else f"0-{vcpus - 1}"
