"""Persistent-memory namespaces, from sysfs or from ``ndctl list -N`` JSON.

Both sources are reduced to ndctl's keys (dev, mode, size, uuid, name,
numa_node, chardev) and validated by one function, so a namespace means the
same whichever way it was read. ``size`` is what a guest can use: for a
devdax namespace, its dax device's size, as ndctl reports it.
"""
from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Iterable, Mapping

from compute_agent.drivers.base import PmemNamespace
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.host_data import parse_int, parse_numa_node
from compute_agent.drivers.libvirt.sysfs import NvdimmReader

NDCTL = "ndctl JSON"


class PmemMode(str, enum.Enum):
    """A namespace's mode, by ndctl's names."""

    SECTOR = "sector"
    FSDAX = "fsdax"
    DEVDAX = "devdax"
    RAW = "raw"


# What the kernel's namespace ``mode`` file says for each (namespace_devs.c).
KERNEL_MODES = {"safe": PmemMode.SECTOR, "memory": PmemMode.FSDAX,
                "dax": PmemMode.DEVDAX, "raw": PmemMode.RAW}


def namespace_from_record(record: Mapping[str, object]
                          ) -> PmemNamespace | None:
    """One namespace, or None for an unconfigured one (size 0, the seed
    namespace every region keeps)."""
    dev = record.get("dev")
    if not isinstance(dev, str) or not dev.strip():
        raise InvalidHostData(NDCTL, "dev", "missing or not a string", dev)
    dev = dev.strip()
    size = parse_int(record.get("size"), dev, "size")
    if size == 0:
        return None
    mode = _mode(record.get("mode"), dev)
    name = record.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidHostData(dev, "name", "not a string", name)
    numa = record.get("numa_node")
    ns_uuid = record.get("uuid")
    if ns_uuid is not None:
        try:
            ns_uuid = str(uuid.UUID(str(ns_uuid).strip()))
        except ValueError:
            raise InvalidHostData(dev, "uuid", "not a UUID", ns_uuid) from None
    chardev = _chardev(record, dev) if mode is PmemMode.DEVDAX else None
    return PmemNamespace(
        name=(name or "").strip() or dev, size_bytes=size,
        numa_node=None if numa is None else parse_numa_node(numa, dev),
        mode=mode, uuid=ns_uuid, dev=chardev)


def _mode(value: object, dev: str) -> PmemMode:
    try:
        return PmemMode(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise InvalidHostData(
            dev, "mode", f"not one of {[m.value for m in PmemMode]}",
            value) from None


def _chardev(record: Mapping[str, object], dev: str) -> str:
    """A devdax namespace's character device, "dax0.0": ndctl's
    ``chardev``, or with ``ndctl list -X`` its dax region's one device."""
    chardev = record.get("chardev")
    region = record.get("daxregion")
    if chardev is None and isinstance(region, dict):
        devices = region.get("devices")
        if isinstance(devices, list) and len(devices) == 1 and isinstance(
                devices[0], dict):
            chardev = devices[0].get("chardev")
    if not isinstance(chardev, str) or not chardev.strip():
        raise InvalidHostData(dev, "chardev", "a devdax namespace with no "
                              "character device", chardev)
    return chardev.strip()


def namespaces_from_records(records: Iterable[Mapping[str, object]]
                            ) -> tuple[list[PmemNamespace], list[str]]:
    found, warnings = [], []
    for record in records:
        try:
            namespace = namespace_from_record(record)
        except InvalidHostData as exc:
            warnings.append(str(exc))
            continue
        if namespace is not None:
            found.append(namespace)
    return found, warnings


def _namespaces_from_sysfs(records: Iterable[Mapping[str, str | None]]
                           ) -> tuple[list[PmemNamespace], list[str]]:
    """Records from sysfs, whose mode is the kernel's word."""
    in_ndctl_terms, warnings = [], []
    for record in records:
        kernel_mode = (record.get("mode") or "").strip()
        if kernel_mode not in KERNEL_MODES:
            warnings.append(str(InvalidHostData(
                str(record.get("dev")), "mode",
                f"not one of the kernel's {sorted(KERNEL_MODES)}",
                record.get("mode"))))
            continue
        in_ndctl_terms.append({**record, "mode": KERNEL_MODES[kernel_mode]})
    found, more = namespaces_from_records(in_ndctl_terms)
    return found, warnings + more


def parse_ndctl_json(text: str) -> tuple[list[PmemNamespace], list[str]]:
    """``ndctl list -N`` prints a list, or a bare object for a single
    namespace. Anything else raises InvalidHostData."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise InvalidHostData(NDCTL, "json", f"not JSON: {exc}",
                              text) from None
    except RecursionError:
        # ndctl nests three levels; Python's decoder gives up near 1000.
        raise InvalidHostData(NDCTL, "json", "nested too deep to be ndctl's",
                              text) from None
    if isinstance(data, dict):
        if "dev" not in data:
            raise InvalidHostData(NDCTL, "dev", "not a namespace object",
                                  data)
        data = [data]
    if not isinstance(data, list):
        raise InvalidHostData(NDCTL, "json", "not a list of namespaces",
                              data)
    records, warnings = [], []
    for index, entry in enumerate(data):
        if isinstance(entry, dict):
            records.append(entry)
        else:
            warnings.append(str(InvalidHostData(
                NDCTL, f"[{index}]", "not an object", entry)))
    found, more = namespaces_from_records(records)
    return found, warnings + more


def read_namespaces(reader: NvdimmReader, ndctl_json: str | None
                    ) -> tuple[list[PmemNamespace], list[str]]:
    """From the ndctl JSON file when one is configured, else from sysfs."""
    if not ndctl_json:
        records, warnings = reader.nd_namespaces()
        found, more = _namespaces_from_sysfs(records)
        return found, warnings + more
    try:
        with open(ndctl_json, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise InvalidHostData(NDCTL, "file", exc.strerror or str(exc),
                              ndctl_json) from None
    except UnicodeDecodeError as exc:
        raise InvalidHostData(NDCTL, "file", f"not UTF-8: {exc.reason} at "
                              f"byte {exc.start}", ndctl_json) from None
    return parse_ndctl_json(text)
