"""The PCI allowlist: ``[pci] device_spec`` entries and how they match (pure).

Each entry is a JSON object. Every key it sets must match:

- ``vendor_id``, ``product_id``: hex, compared without case;
- ``address``: either a string ``[domain:]bus:slot.function`` where any part
  may be ``*`` (the domain is 4 to 8 hex digits: past ffff for devices
  behind Intel VMD), or an object of ``domain``/``bus``/``slot``/``function``
  where each part is hex, ``*`` or a hex range ``a-b``. A VF also matches
  through its PF's address, so ``{"address": <PF>, "product_id": <VF id>}``
  allowlists exactly that PF's VFs, as in nova.
- ``resource_class`` and ``traits`` (a list or a comma-separated string)
  say how matching devices are reported; they never affect matching. So
  does ``physical_network``, the neutron physical network a NIC's VFs
  reach (null: none), which nova reads from the same spec.
- ``live_migratable``: "yes" or "no" (nova's spelling; JSON true and false
  too), default no. Whether a guest given a matching device may be live
  migrated: only devices whose driver migrates their state (a VFIO variant
  driver) can be, and only the operator knows that.
- ``one_time_use``: "yes" or "no" (JSON true and false too), default no,
  nova's key (2025.2): a device used once is not offered again until it is
  cleaned. Its provider gets ``HW_PCI_ONE_TIME_USE``; compute_agent/cleaning/
  says what a used device does to the tree.
- ``clean_command``: how the agent cleans such a device, run with the
  device's PCI address appended as the last argument: a list of arguments,
  or a string split as a shell would (no shell runs it). Without it a used
  device waits for an operator's ``compute-agent-manage device release``.
- ``clean_timeout``: seconds the command may run, default 600.
"""
from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, TypedDict

import os_resource_classes as orc
import os_traits

from compute_agent.common.pci_address import PARTS as _ADDRESS_PARTS
from compute_agent.common.pci_address import split_address
from compute_agent.drivers.base import PciDevice
from compute_agent.exception import ConfigError, shown

OPTION = "[pci] device_spec"
_KNOWN_KEYS = {"vendor_id", "product_id", "address", "resource_class", "traits",
               "physical_network", "live_migratable", "one_time_use", "clean_command",
               "clean_timeout"}
_YES_NO = {"yes": True, "no": False, True: True, False: False}
DEFAULT_CLEAN_TIMEOUT = 600.0
_HEX = re.compile(r"^(0x)?[0-9a-fA-F]{1,4}$")


@dataclass(frozen=True)
class HexRange:
    low: int
    high: int

    def __contains__(self, value: int) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True)
class DeviceSpec:
    text: str  # the entry as the operator wrote it, for messages
    vendor_id: int | None
    product_id: int | None
    address: tuple[HexRange, ...] | None  # domain, bus, slot, function
    resource_class: str | None
    traits: frozenset[str]
    physical_network: str | None = None
    live_migratable: bool = False
    one_time_use: bool = False
    # The cleaning command's arguments, the device's address still to
    # append; None: cleaned by hand (compute-agent-manage device release).
    clean_command: tuple[str, ...] | None = None
    clean_timeout: float = DEFAULT_CLEAN_TIMEOUT

    def matches(self, device: PciDevice) -> bool:
        if self.vendor_id is not None and int(device.vendor_id, 16) != self.vendor_id:
            return False
        if self.product_id is not None and int(device.product_id, 16) != self.product_id:
            return False
        if self.address is None:
            return True
        candidates = [device.address]
        if device.parent_address:
            candidates.append(device.parent_address)
        return any(self._address_matches(a) for a in candidates)

    def _address_matches(self, address: str) -> bool:
        parts = split_address(address)
        return self.address is not None and all(v in r for v, r in zip(parts, self.address))


# Placement's limit on a trait's name.
PLACEMENT_NAME_LENGTH = 255


def _fail(text: str, field: str, value: object, reason: str) -> ConfigError:
    entry = text if len(text) <= 60 else f"{text[:57]}... ({len(text)} characters)"
    return ConfigError(f"{OPTION}: {field}: {reason} (value: {shown(value)}; "
                       f"entry: {entry})")


def _hex_id(text: str, field: str, value: object) -> int:
    if not isinstance(value, str) or not _HEX.match(value):
        raise _fail(text, field, value, "must be up to four hex digits")
    return int(value, 16)


def _address_part(text: str, name: str, limit: int, value: object) -> HexRange:
    if value is None or value == "*" or value == "":
        return HexRange(0, limit)
    if not isinstance(value, str):
        raise _fail(text, f"address.{name}", value, "must be a string")
    low, _, high = value.partition("-")
    try:
        lo, hi = int(low, 16), int(high or low, 16)
    except ValueError:
        raise _fail(text, f"address.{name}", value,
                    "must be hex, '*' or a range 'a-b'") from None
    if not 0 <= lo <= hi <= limit:
        raise _fail(text, f"address.{name}", value,
                    f"must lie within 0-{limit:x}, low before high")
    return HexRange(lo, hi)


def _address(text: str, value: object) -> tuple[HexRange, ...]:
    if isinstance(value, dict):
        unknown = set(value) - {n for n, _ in _ADDRESS_PARTS}
        if unknown:
            raise _fail(text, "address", value,
                        f"unknown parts {sorted(unknown)}")
        parts: list[object] = [value.get(n) for n, _ in _ADDRESS_PARTS]
    elif isinstance(value, str):
        m = re.match(r"^(?:([^:]*):)?([^:]*):([^.:]*)\.([^.:]*)$", value)
        if not m:
            raise _fail(text, "address", value,
                        "must look like [domain:]bus:slot.function")
        parts = list(m.groups())
    else:
        raise _fail(text, "address", value, "must be a string or an object")
    return tuple(_address_part(text, name, limit, part)
                 for (name, limit), part in zip(_ADDRESS_PARTS, parts))


def _traits(text: str, value: object) -> frozenset[str]:
    if isinstance(value, str):
        value = [t for t in value.split(",") if t.strip()]
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise _fail(text, "traits", value, "must be a list of names")
    out: set[str] = set()
    for t in value:
        t = t.strip().upper()
        known = t in os_traits.get_traits() or os_traits.is_custom(t)
        name = t if known else os_traits.normalize_name(t)
        if len(name) > PLACEMENT_NAME_LENGTH:
            raise _fail(text, "traits", name, f"longer than Placement's "
                        f"{PLACEMENT_NAME_LENGTH} characters")
        out.add(name)
    return frozenset(out)


def _resource_class(text: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(text, "resource_class", value, "must be a name")
    value = value.strip().upper()
    if value in orc.STANDARDS or orc.is_custom(value):
        return value
    normalized: str = orc.normalize_name(value)  # os_resource_classes is untyped
    return normalized


def _physical_network(text: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(text, "physical_network", value, "must be a name or null")
    return value.strip()


def _yes_no(text: str, field: str, value: object) -> bool:
    key = value.strip().lower() if isinstance(value, str) else value
    if type(key) not in (str, bool) or key not in _YES_NO:
        raise _fail(text, field, value, 'must be "yes" or "no"')
    return _YES_NO[key]


def _clean_command(text: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as e:
            raise _fail(text, "clean_command", value, f"cannot be split: {e}") from None
    if (not isinstance(value, list) or not value
            or not all(isinstance(a, str) and a for a in value)):
        raise _fail(text, "clean_command", value,
                    "must be a command: a list of arguments or a string")
    return tuple(value)


def _clean_timeout(text: str, value: object) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise _fail(text, "clean_timeout", value, "must be a number of seconds above 0")
    return float(value)


def parse_spec(text: str) -> DeviceSpec:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{OPTION}: not valid JSON: {e} (value: {shown(text)})") from None
    if not isinstance(data, dict):
        raise _fail(text, "entry", data, "must be a JSON object")
    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise _fail(text, sorted(unknown)[0], data[sorted(unknown)[0]],
                    f"unknown key; known keys are {sorted(_KNOWN_KEYS)}")
    if not {"vendor_id", "product_id", "address"} & set(data):
        raise _fail(text, "entry", data, "must name vendor_id, product_id or "
                    "address, so that it cannot allowlist every device")
    return DeviceSpec(
        text=text,
        vendor_id=(_hex_id(text, "vendor_id", data["vendor_id"])
                   if "vendor_id" in data else None),
        product_id=(_hex_id(text, "product_id", data["product_id"])
                    if "product_id" in data else None),
        address=_address(text, data["address"]) if "address" in data else None,
        resource_class=(_resource_class(text, data["resource_class"])
                        if "resource_class" in data else None),
        traits=_traits(text, data.get("traits", [])),
        physical_network=_physical_network(text, data.get("physical_network")),
        live_migratable=_yes_no(text, "live_migratable", data.get("live_migratable", "no")),
        **_one_time_use(text, data),
    )


class _OneTimeUse(TypedDict):
    one_time_use: bool
    clean_command: tuple[str, ...] | None
    clean_timeout: float


def _one_time_use(text: str, data: dict[str, Any]) -> _OneTimeUse:
    """The one-time-use keys; cleaning is said only of one-time-use
    devices (any other is given back at once)."""
    one_time_use = _yes_no(text, "one_time_use", data.get("one_time_use", "no"))
    cleaning = sorted({"clean_command", "clean_timeout"} & set(data))
    if cleaning and not one_time_use:
        raise _fail(text, cleaning[0], data[cleaning[0]],
                    'only a one-time-use device is cleaned: add "one_time_use": "yes"')
    if "clean_timeout" in data and "clean_command" not in data:
        raise _fail(text, "clean_timeout", data["clean_timeout"],
                    "times a clean_command, which the entry does not name")
    return {"one_time_use": one_time_use,
            "clean_command": (_clean_command(text, data["clean_command"])
                              if "clean_command" in data else None),
            "clean_timeout": (_clean_timeout(text, data["clean_timeout"])
                              if "clean_timeout" in data else DEFAULT_CLEAN_TIMEOUT)}


def parse_specs(texts: list[str]) -> tuple[DeviceSpec, ...]:
    return tuple(parse_spec(t) for t in texts)


def first_match(specs: tuple[DeviceSpec, ...], device: PciDevice) -> DeviceSpec | None:
    return next((s for s in specs if s.matches(device)), None)
