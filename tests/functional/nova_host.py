"""A host as nova-compute left it: its guests' domain XML, as nova's libvirt
driver writes it (nova/virt/libvirt/config.py, LibvirtConfigGuest and
LibvirtConfigGuestMetaNovaInstance), reduced to what the agent reads and
what a hypervisor needs to run it."""
from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

NOVA_NAMESPACE = "http://openstack.org/xmlns/libvirt/nova/1.1"


def _pci_address(address: str) -> str:
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    return (f"<address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' "
            f"function='0x{function}'/>")


def nova_domain_xml(instance_uuid: str, index: int, display_name: str, vcpus: int,
                    memory_mb: int, *, pci: tuple[str, ...] = (),
                    mdevs: tuple[str, ...] = (), pinned: tuple[int, ...] = (),
                    domain_type: str = "kvm") -> str:
    """A guest of nova's: domain name ``instance-%08x``, the instance's
    UUID as the domain's, nova's metadata, hostdevs for whole PCI devices
    and VFs (a flavor's PCI alias) and mdevs (a vGPU), and one vcpupin per
    pinned CPU (hw:cpu_policy=dedicated)."""
    pins = "".join(f"<vcpupin vcpu='{i}' cpuset='{cpu}'/>" for i, cpu in enumerate(pinned))
    hostdevs = "".join(
        "<hostdev mode='subsystem' type='pci' managed='yes'>"
        f"<source>{_pci_address(a)}</source></hostdev>" for a in pci)
    hostdevs += "".join(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
        f"<source><address uuid='{u}'/></source></hostdev>" for u in mdevs)
    return f"""<domain type='{domain_type}'>
  <uuid>{instance_uuid}</uuid>
  <name>instance-{index:08x}</name>
  <memory>{memory_mb * 1024}</memory>
  <vcpu>{vcpus}</vcpu>
  <metadata>
    <nova:instance xmlns:nova='{NOVA_NAMESPACE}'>
      <nova:package version='29.0.0'/>
      <nova:name>{escape(display_name)}</nova:name>
      <nova:creationTime>2024-05-01 10:00:00</nova:creationTime>
      <nova:flavor name={quoteattr('f' + str(vcpus))}>
        <nova:memory>{memory_mb}</nova:memory><nova:disk>1</nova:disk>
        <nova:swap>0</nova:swap><nova:ephemeral>0</nova:ephemeral>
        <nova:vcpus>{vcpus}</nova:vcpus>
      </nova:flavor>
      <nova:owner>
        <nova:user uuid='8d9a1c2e-0a8b-4e1f-9d1a-0f2b3c4d5e6f'>demo</nova:user>
        <nova:project uuid='1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d'>demo</nova:project>
      </nova:owner>
    </nova:instance>
  </metadata>
  <os><type>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/></features>
  {f'<cputune>{pins}</cputune>' if pins else ''}
  <clock offset='utc'/>
  <devices>{hostdevs}<memballoon model='none'/></devices>
</domain>
"""
