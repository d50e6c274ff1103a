"""Guests as earlier versions of this agent defined them, written by hand
from the code that wrote them (compute_agent/drivers/libvirt/guest_xml.py at d1b250d and
7563c52; the layout held until 88f9c57), never by importing it:

- the domain is named after the instance's name (which is not unique on a
  host), with no ``<title>``; 88f9c57 names it ``instance-<uuid>``;
- no ``<features>`` (88f9c57 added ACPI and APIC);
- a VF's ``<interface type='hostdev'>`` has no ``<mac>`` at d1b250d, so
  libvirt draws one and keeps it in the definition; from 7563c52 on the MAC
  is derived from the assignment id;
- our metadata's namespace and layout are today's.
"""
from __future__ import annotations

import hashlib
from xml.sax.saxutils import escape, quoteattr

from compute_agent.drivers.base import DeviceKind, GuestDevice, GuestSpec

NAMESPACE = "http://compute-agent.openstack.org/xmlns/instance/1"
# d1b250d wrote no MAC; 7563c52 wrote one derived from the assignment.
NO_MAC = "d1b250d"
DERIVED_MAC = "7563c52"


def derived_mac(assignment_id: str) -> str:
    """The MAC 7563c52 gave a VF: QEMU's prefix and the first three bytes of
    the assignment id's SHA-256."""
    digest = hashlib.sha256(assignment_id.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def _pci(address: str, with_type: bool) -> str:
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    kind = "type='pci' " if with_type else ""
    return (f"<address {kind}domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' "
            f"function='0x{function}'/>")


def _pmem_kib(device: GuestDevice) -> int:
    size = device.detail.size_bytes // 1024
    if device.detail.dev_path.startswith("/dev/dax"):
        size -= size % 2048
    return size


def earlier_domain_xml(guest: GuestSpec, shape: str = DERIVED_MAC,
                       domain_type: str = "kvm") -> str:
    """``guest``'s definition as the commit ``shape`` (NO_MAC or
    DERIVED_MAC) wrote it."""
    by_kind = {k: [d for d in guest.devices if d.kind is k] for k in DeviceKind}
    ram = guest.memory_mb * 1024
    pmem = [(d, _pmem_kib(d)) for d in by_kind[DeviceKind.PMEM]]
    total = ram + sum(size for _, size in pmem)
    assignments = "".join(
        f"<ca:assignment id={quoteattr(d.assignment_id)} kind='{d.kind.value}' "
        f"device={quoteattr(d.device_id)}/>" for d in guest.devices)
    cpus = sorted(frozenset().union(*(d.cpus for d in by_kind[DeviceKind.PCPU])))
    pins = "".join(f"<vcpupin vcpu='{i}' cpuset='{c}'/>" for i, c in enumerate(cpus))
    cells = sorted({int(d.device_id) for d in by_kind[DeviceKind.NUMA]})
    devices = "".join(
        "<hostdev mode='subsystem' type='pci' managed='yes'>"
        f"<source>{_pci(d.device_id, False)}</source></hostdev>"
        for d in by_kind[DeviceKind.PCI])
    for d in by_kind[DeviceKind.VF]:
        mac = (f"<mac address='{derived_mac(d.assignment_id)}'/>"
               if shape == DERIVED_MAC else "")
        devices += (f"<interface type='hostdev' managed='yes'>{mac}"
                    f"<source>{_pci(d.device_id, True)}</source></interface>")
    devices += "".join(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
        f"<source><address uuid='{d.device_id}'/></source></hostdev>"
        for d in by_kind[DeviceKind.MDEV])
    for d, size in pmem:
        dax = ("<alignsize unit='KiB'>2048</alignsize><pmem/>"
               if d.detail.dev_path.startswith("/dev/dax") else "")
        devices += ("<memory model='nvdimm' access='shared'><source>"
                    f"<path>{escape(d.detail.dev_path)}</path>{dax}</source>"
                    f"<target><size unit='KiB'>{size}</size><node>0</node></target>"
                    "</memory>")
    vcpus = "0" if guest.vcpus == 1 else f"0-{guest.vcpus - 1}"
    return f"""<domain type='{domain_type}'>
  <name>{escape(guest.name)}</name>
  <uuid>{guest.instance_uuid}</uuid>
  <metadata>
    <ca:instance xmlns:ca='{NAMESPACE}' uuid='{guest.instance_uuid}'>{assignments}</ca:instance>
  </metadata>
  {f"<maxMemory slots='{len(pmem)}' unit='KiB'>{total}</maxMemory>" if pmem else ""}
  <memory unit='KiB'>{total}</memory>
  <currentMemory unit='KiB'>{ram}</currentMemory>
  <vcpu placement='static'>{guest.vcpus}</vcpu>
  {f"<cputune>{pins}</cputune>" if pins else ""}
  {f"<numatune><memory mode='strict' nodeset='{','.join(map(str, cells))}'/></numatune>"
   if cells else ""}
  <os><type>hvm</type><boot dev='network'/></os>
  {f"<cpu><numa><cell id='0' cpus='{vcpus}' memory='{ram}' unit='KiB'/></numa></cpu>"
   if pmem else ""}
  <devices>{devices}<memballoon model='none'/></devices>
</domain>"""
