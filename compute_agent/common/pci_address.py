"""PCI addresses as the kernel and libvirt write them: "dddd:bb:ss.f".

The domain is 32 bits in libvirt and in the kernel, and real hosts use
domains past ffff (Intel VMD puts the devices behind it at 10000: and up),
so a domain has 4 to 8 hex digits. The canonical form is lower case with
the domain zero-padded to at least four digits, as the kernel's sysfs
names and libvirt's ``%04x`` print it.
"""
from __future__ import annotations

import re

# (name, largest value) of each part, in address order.
PARTS = (("domain", 0xFFFFFFFF), ("bus", 0xFF), ("slot", 0x1F),
         ("function", 0x7))
# A slot is five bits: 00-1f.
_ADDRESS = re.compile(
    r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])")
# libvirt's node-device name of a PCI function: pci_%04x_%02x_%02x_%x.
_NODE_DEVICE_NAME = re.compile(
    r"pci_([0-9a-fA-F]{4,8})_([0-9a-fA-F]{2})_([01][0-9a-fA-F])_([0-7])")

Parts = tuple[int, int, int, int]


def split_address(text: object) -> Parts:
    """(domain, bus, slot, function) of an address; ValueError when the
    text is not one (no surrounding blanks are allowed)."""
    match = _ADDRESS.fullmatch(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"not a PCI address dddd:bb:ss.f: {text!r}")
    return _ints(match.groups())


def format_address(domain: int, bus: int, slot: int, function: int) -> str:
    """The canonical text; ValueError naming the part out of range."""
    for (name, limit), value in zip(PARTS, (domain, bus, slot, function)):
        if not 0 <= value <= limit:
            raise ValueError(f"PCI address {name} out of range 0-{limit:x}: "
                             f"{value}")
    return f"{domain:04x}:{bus:02x}:{slot:02x}.{function:x}"


def canonical_address(text: object) -> str:
    return format_address(*split_address(text))


def node_device_name(address: str) -> str:
    """libvirt's node-device name: "0000:81:00.0" -> "pci_0000_81_00_0"."""
    domain, bus, slot, function = split_address(address)
    return f"pci_{domain:04x}_{bus:02x}_{slot:02x}_{function:x}"


def address_from_node_device_name(name: str) -> str:
    """"pci_0000_81_00_0" -> "0000:81:00.0"; ValueError for any other
    name."""
    match = (_NODE_DEVICE_NAME.fullmatch(name) if isinstance(name, str)
             else None)
    if not match:
        raise ValueError(f"not a PCI node-device name: {name!r}")
    return format_address(*_ints(match.groups()))


def _ints(groups: tuple[str, ...]) -> Parts:
    domain, bus, slot, function = (int(g, 16) for g in groups)
    return domain, bus, slot, function
