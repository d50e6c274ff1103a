"""The small value validators every host-data parser uses, so every parser
words its complaints the same way: each raises InvalidHostData
(compute_agent/drivers/errors.py), the declared exception of every host-data parser."""
from __future__ import annotations

import re

from compute_agent.common.cpuset import parse_cpu_set
from compute_agent.common.pci_address import canonical_address, format_address
from compute_agent.drivers.errors import InvalidHostData

_HEX_ID = re.compile(r"^(?:0[xX])?([0-9a-fA-F]{4})$")


def parse_int(text: object, device: str, field: str, *, minimum: int = 0,
              maximum: int | None = None, base: int = 10) -> int:
    """An integer from host text. ``base=0`` accepts a 0x prefix."""
    if not isinstance(text, (str, int)) or isinstance(text, bool):
        raise InvalidHostData(device, field, "not an integer", text)
    try:
        value = text if isinstance(text, int) else int(text.strip(), base)
    except ValueError:
        raise InvalidHostData(device, field, "not an integer", text) from None
    if value < minimum or (maximum is not None and value > maximum):
        raise InvalidHostData(device, field, "out of range", text)
    return value


def parse_numa_node(text: object, device: str, field: str = "numa_node"
                    ) -> int | None:
    """A NUMA node id; -1 (the kernel's "no affinity") becomes None."""
    value = parse_int(text, device, field, minimum=-1, maximum=4095)
    return None if value == -1 else value


def parse_hex_id(text: object, device: str, field: str) -> str:
    """A vendor or product id as four lower-case hex digits ("0x8086" ->
    "8086")."""
    match = _HEX_ID.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise InvalidHostData(device, field, "not a 4-digit hex id", text)
    return match.group(1).lower()


def parse_pci_address(text: object, device: str, field: str) -> str:
    """A PCI address in canonical lower case, "0000:81:00.0" or, past
    domain ffff, "10000:e1:00.0"."""
    try:
        return canonical_address(text.strip() if isinstance(text, str)
                                 else text)
    except ValueError:
        raise InvalidHostData(device, field, "not a PCI address",
                              text) from None


def format_pci_address(parts: tuple[int, int, int, int], device: str, field: str) -> str:
    """A PCI address from its domain, bus, slot and function."""
    try:
        return format_address(*parts)
    except ValueError:
        raise InvalidHostData(device, field, "PCI address out of range", parts) from None


def parse_cpulist(text: object, device: str, field: str, *,
                  allow_exclusions: bool = False) -> frozenset[int]:
    """The kernel's and libvirt's CPU list syntax, "0-3,8-11" or "0,4";
    libvirt's domain cpusets may also exclude, "0-3,^2"."""
    if not isinstance(text, str):
        raise InvalidHostData(device, field, "not a CPU list", text)
    try:
        return parse_cpu_set(text, allow_exclusions=allow_exclusions)
    except ValueError as e:
        raise InvalidHostData(device, field, str(e), text) from None
