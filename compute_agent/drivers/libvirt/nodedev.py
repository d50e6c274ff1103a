"""Parsing of libvirt node-device XML (``virNodeDevice.XMLDesc()``).

Pure functions: XML text in, compute_agent.drivers.base dataclasses out. Elements this
module does not know are ignored, because libvirt adds new ones over time.
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from lxml import etree

from compute_agent.common.pci_address import PARTS, address_from_node_device_name
from compute_agent.drivers.base import Mdev, MdevParent, MdevType, PciDevice, PciKind
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.host_data import format_pci_address, parse_hex_id, parse_int, parse_numa_node
from compute_agent.drivers.libvirt.capabilities import parse_xml

# libvirt >= 7.3 names an mdev "mdev_<uuid>_<parent>"; before, "mdev_<uuid>".
_MDEV_NAME = re.compile(r"^mdev_([0-9a-fA-F_]{36})(?:_.*)?$")
# A PCI device's VPD sub-capability. libvirt 9.0 writes its text fields
# unescaped (a serial number "MT2113X00000><" comes out as is), which
# makes the whole document malformed; the agent uses nothing in it. Its
# fields hold no elements of the same name, so the first closing tag
# after the opening one ends it.
_VPD = re.compile(r"<capability\s+type\s*=\s*(['\"])vpd\1\s*>.*?</capability\s*>",
                  re.DOTALL)


@dataclass(frozen=True)
class NodeDevice:
    """What one node device contributes; exactly one of pci and mdev is
    set. mdev_parent is set for a PCI device that offers mdev types."""

    name: str
    pci: PciDevice | None = None
    mdev_parent: MdevParent | None = None
    mdev: Mdev | None = None
    # What was left out of a device that is kept (its malformed VPD).
    warning: str | None = None


def pci_address_from_name(name: str, device: str, field: str) -> str:
    """"pci_0000_81_00_0" -> "0000:81:00.0"."""
    try:
        return address_from_node_device_name(name)
    except ValueError:
        raise InvalidHostData(device, field, "not a PCI node-device name",
                              name) from None


def parse_node_device(text: object) -> NodeDevice:
    """One node device. Raises InvalidHostData naming the device and the
    field when the XML cannot be used. A document malformed only inside
    its VPD is read without it, the device kept with a warning."""
    root, vpd_error = _parse_document(text)
    name = (root.findtext("name") or "").strip()
    device = name or "node device"
    if root.tag != "device" or not name:
        raise InvalidHostData(device, "name", "not a node device", text)
    warning = (f"{device}: vpd: {vpd_error} (libvirt wrote a field unescaped);"
               " the device is read without its VPD" if vpd_error else None)
    for cap in root.iterfind("capability"):
        kind = cap.get("type")
        if kind == "pci":
            pci, parent = _parse_pci(cap, device, root.findtext("driver/name"))
            return NodeDevice(name, pci=pci, mdev_parent=parent,
                              warning=warning)
        if kind == "mdev":
            return NodeDevice(name, mdev=_parse_mdev(cap, device, root))
    raise InvalidHostData(device, "capability", "neither pci nor mdev",
                          [c.get("type") for c in root.iterfind("capability")])


def _parse_document(text: object) -> tuple[etree._Element, str | None]:
    """The document's root, and what the parser said of the whole document
    when its VPD element had to be cut out for the rest to parse. Any
    other malformed XML is refused with the error the whole document
    gave."""
    try:
        return parse_xml(text, "node device"), None
    except InvalidHostData as whole:
        if not isinstance(text, str) or not (match := _VPD.search(text)):
            raise
        try:
            root = parse_xml(text[:match.start()] + text[match.end():],
                             "node device")
        except InvalidHostData:
            raise whole from None
        return root, whole.reason


def parse_node_devices(items: Iterable[tuple[str, object]]
                       ) -> tuple[list[NodeDevice], list[str]]:
    """Many (name, XML) pairs; a device that cannot be read is left out
    with a warning and the others are kept."""
    devices, warnings = [], []
    for name, text in items:
        try:
            device = parse_node_device(text)
        except InvalidHostData as exc:
            if exc.device == "node device":
                exc = InvalidHostData(name, exc.field, exc.reason, exc.value)
            warnings.append(str(exc))
            continue
        devices.append(device)
        if device.warning:
            warnings.append(device.warning)
    return devices, warnings


def _int_text(text: str | None, device: str, field: str, maximum: int) -> int:
    """libvirt writes <bus> in decimal but <address bus=> in 0x hex."""
    return parse_int(text, device, field, maximum=maximum, base=0
                     if (text or "").strip().lower().startswith("0x") else 10)


def _address(el: etree._Element, device: str, field: str) -> str:
    """An <address domain= bus= slot= function=/> element."""
    domain, bus, slot, function = (_int_text(el.get(part), device, f"{field} {part}", limit)
                                   for part, limit in PARTS)
    return format_pci_address((domain, bus, slot, function), device=device, field=field)


def _parse_pci(cap: etree._Element, device: str, driver: str | None
               ) -> tuple[PciDevice, MdevParent | None]:
    domain, bus, slot, function = (_int_text(cap.findtext(part), device, part, limit)
                                   for part, limit in PARTS)
    address = format_pci_address((domain, bus, slot, function), device=device,
                                 field="address")
    vendor_el, product_el = cap.find("vendor"), cap.find("product")
    vendor = parse_hex_id(None if vendor_el is None else vendor_el.get("id"),
                          device, "vendor id")
    product = parse_hex_id(
        None if product_el is None else product_el.get("id"),
        device, "product id")
    class_text = cap.findtext("class")
    class_id = None
    if class_text is not None:
        class_id = f"{_int_text(class_text, device, 'class', 0xFFFFFF):06x}"
    numa_el = cap.find("numa")
    numa_node = (None if numa_el is None else
                 parse_numa_node(numa_el.get("node"), device, "numa node"))
    group_el = cap.find("iommuGroup")
    iommu_group = (None if group_el is None else parse_int(
        group_el.get("number"), device, "iommuGroup number"))

    kind, parent_address, total_vfs, num_vfs = PciKind.PCI, None, 0, 0
    types: list[MdevType] = []
    for sub in cap.iterfind("capability"):
        sub_type = sub.get("type")
        if sub_type == "virt_functions":
            kind = PciKind.PF
            vfs = [_address(a, device, "virt_functions address")
                   for a in sub.iterfind("address")]
            num_vfs = len(vfs)
            max_count = sub.get("maxCount")
            total_vfs = (num_vfs if max_count is None else parse_int(
                max_count, device, "virt_functions maxCount"))
        elif sub_type == "phys_function":
            address_el = sub.find("address")
            if address_el is None:
                raise InvalidHostData(device, "phys_function address",
                                      "missing", None)
            kind = PciKind.VF
            parent_address = _address(address_el, device,
                                      "phys_function address")
        elif sub_type == "mdev_types":
            types.extend(_parse_mdev_type(t, device)
                         for t in sub.iterfind("type"))
    pci = PciDevice(
        address=address, vendor_id=vendor, product_id=product, kind=kind,
        numa_node=numa_node, parent_address=parent_address,
        class_id=class_id, iommu_group=iommu_group,
        driver=driver.strip() if driver else None,
        total_vfs=total_vfs, num_vfs=num_vfs)
    parent = (MdevParent(address, numa_node, tuple(types), vendor, product)
              if types else None)
    return pci, parent


def _parse_mdev_type(el: etree._Element, device: str) -> MdevType:
    type_id = (el.get("id") or "").strip()
    if not type_id:
        raise InvalidHostData(device, "mdev_types type id", "missing",
                              el.get("id"))
    field = f"mdev type {type_id}"
    available = parse_int(el.findtext("availableInstances"), device,
                          f"{field} availableInstances")
    name = el.findtext("name")
    api = (el.findtext("deviceAPI") or "").strip()
    return MdevType(id=type_id, available_instances=available,
                    name=name.strip() if name else None,
                    device_api=api or "vfio-pci")


def _parse_mdev(cap: etree._Element, device: str, root: etree._Element
                ) -> Mdev:
    type_el = cap.find("type")
    type_id = ((type_el.get("id") if type_el is not None else None)
               or "").strip()
    if not type_id:
        raise InvalidHostData(device, "mdev type", "missing", None)
    uuid_text = cap.findtext("uuid")
    if uuid_text is None:
        match = _MDEV_NAME.match(device)
        uuid_text = match.group(1).replace("_", "-") if match else device
    try:
        mdev_uuid = str(uuid.UUID(uuid_text.strip()))
    except ValueError:
        raise InvalidHostData(device, "uuid", "not a UUID",
                              uuid_text) from None
    parent = pci_address_from_name(
        (root.findtext("parent") or "").strip(), device, "parent")
    return Mdev(uuid=mdev_uuid, type_id=type_id, parent_address=parent)
