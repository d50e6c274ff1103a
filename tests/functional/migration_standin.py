"""The destination XML the live-migration tests pass, made from the
source's live, migratable XML by changing only what the stand-in devices
name: the nvdimm backing files, the pinned host CPUs and our metadata.

A stand-in until drivers/libvirt/migration_xml.py (the pure rewrite, built
in parallel) takes its place: libvirt refuses a destination XML written
afresh by build_domain_xml, whose virtual hardware (device addresses, the
CPU check) is not the running guest's.
"""
from __future__ import annotations

from lxml import etree

from drivers.base import DeviceKind, GuestDevice, GuestSpec
from drivers.libvirt.guest_xml import build_domain_xml


def _of_kind(guest: GuestSpec, kind: DeviceKind) -> list[GuestDevice]:
    return [d for d in guest.devices if DeviceKind(d.kind) is kind]


def destination_xml(source_xml: str, source: GuestSpec, dest: GuestSpec) -> str:
    """``source_xml`` with each of ``source``'s pmem paths and pinned CPUs
    replaced by ``dest``'s device of the same kind and position, and the
    metadata ``dest``'s."""
    paths = {s.detail.dev_path: d.detail.dev_path for s, d in zip(
        _of_kind(source, DeviceKind.PMEM), _of_kind(dest, DeviceKind.PMEM), strict=True)}
    cpus = {str(s): str(d) for sd, dd in zip(
        _of_kind(source, DeviceKind.PCPU), _of_kind(dest, DeviceKind.PCPU), strict=True)
        for s, d in zip(sorted(sd.cpus), sorted(dd.cpus), strict=True)}
    root = etree.fromstring(source_xml.encode())
    for path in root.iterfind("devices/memory[@model='nvdimm']/source/path"):
        path.text = paths[path.text.strip()]
    for pin in root.iterfind("cputune/vcpupin"):
        pin.set("cpuset", cpus[pin.get("cpuset")])
    ours = etree.fromstring(build_domain_xml(dest).encode()).find("metadata")
    root.replace(root.find("metadata"), ours)
    return etree.tostring(root, encoding="unicode")
