"""held_resources: what a domain's XML holds exclusively, read from its
devices and pinning as libvirt's domain format writes them (formatdomain:
hostdev source address, interface type='hostdev', mdev hostdev by uuid,
nvdimm source path, cputune vcpupin cpuset)."""
import pytest

from compute_agent.drivers.base import HostResource
from compute_agent.drivers.base import HostResourceKind as K
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.libvirt.guest_xml import held_resources

DOMAIN = """<domain type='kvm'>
  <name>instance-x</name>
  <uuid>0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01</uuid>
  <cputune>
    <vcpupin vcpu='0' cpuset='4'/>
    <vcpupin vcpu='1' cpuset='6-7,^7'/>
    <emulatorpin cpuset='0-3'/>
  </cputune>
  <devices>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x10000' bus='0x3b' slot='0x00' function='0x0'/></source>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
    </hostdev>
    <interface type='hostdev' managed='yes'>
      <mac address='52:54:00:6d:90:02'/>
      <source><address type='pci' domain='0x0000' bus='0x81' slot='0x10' function='0x1'/></source>
    </interface>
    <interface type='network'><source network='default'/></interface>
    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
      <source><address uuid='4B20D080-1B54-4048-85B3-A6A62D165C01'/></source>
    </hostdev>
    <memory model='nvdimm' access='shared'>
      <source><path>/dev/dax0.0</path><alignsize unit='KiB'>2048</alignsize><pmem/></source>
      <target><size unit='KiB'>1048576</size><node>0</node></target>
    </memory>
    <memory model='dimm'><target><size unit='KiB'>524288</size><node>0</node></target></memory>
  </devices>
</domain>"""


def test_every_exclusive_resource_is_read_and_shared_ones_are_not():
    assert held_resources(DOMAIN) == {
        HostResource(K.PCI_ADDRESS, "10000:3b:00.0"),
        HostResource(K.PCI_ADDRESS, "0000:81:10.1"),
        HostResource(K.MDEV_UUID, "4b20d080-1b54-4048-85b3-a6a62d165c01"),
        HostResource(K.BACKING_PATH, "/dev/dax0.0"),
        HostResource(K.HOST_CPU, "4"),
        HostResource(K.HOST_CPU, "6"),
    }


def test_a_domain_with_nothing_assigned_holds_nothing():
    assert held_resources("<domain type='kvm'><name>n</name><devices/></domain>") \
        == frozenset()


@pytest.mark.parametrize("fragment, field", [
    ("<devices><hostdev mode='subsystem' type='mdev'><source>"
     "<address uuid='nope'/></source></hostdev></devices>", "hostdev mdev uuid"),
    ("<devices><hostdev mode='subsystem' type='pci'><source>"
     "<address domain='0x0000' bus='0xzz' slot='0x00' function='0x0'/></source>"
     "</hostdev></devices>", "source address bus"),
    ("<cputune><vcpupin vcpu='0' cpuset='a-b'/></cputune>", "vcpupin cpuset"),
])
def test_an_unreadable_device_is_an_error_naming_it_not_an_empty_guest(fragment, field):
    with pytest.raises(InvalidHostData, match=field):
        held_resources(f"<domain type='kvm'><name>n</name>{fragment}</domain>")
