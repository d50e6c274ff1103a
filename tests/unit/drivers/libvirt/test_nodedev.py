import pytest

from compute_agent.drivers.base import Mdev, MdevType, PciKind
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.libvirt import nodedev

PF = """<device>
  <name>pci_0000_3b_00_0</name>
  <path>/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0</path>
  <parent>pci_0000_3a_00_0</parent>
  <driver><name>i40e</name></driver>
  <capability type='pci'>
    <class>0x020000</class>
    <domain>0</domain><bus>59</bus><slot>0</slot><function>0</function>
    <product id='0x1572'>Ethernet Controller X710</product>
    <vendor id='0x8086'>Intel Corporation</vendor>
    <capability type='virt_functions' maxCount='32'>
      <address domain='0x0000' bus='0x3b' slot='0x02' function='0x0'/>
      <address domain='0x0000' bus='0x3b' slot='0x02' function='0x1'/>
    </capability>
    <iommuGroup number='27'>
      <address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/>
    </iommuGroup>
    <numa node='1'/>
    <pci-express><link validity='cap' port='0' speed='8' width='8'/></pci-express>
    <vpd><name>a new element</name></vpd>
  </capability>
</device>"""

VF = """<device><name>pci_0000_3b_02_1</name><parent>pci_0000_3a_00_0</parent>
  <capability type='pci'>
    <domain>0</domain><bus>59</bus><slot>2</slot><function>1</function>
    <product id='0x154c'/><vendor id='0x8086'/>
    <capability type='phys_function'>
      <address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/>
    </capability>
    <numa node='-1'/>
  </capability></device>"""

GPU = """<device><name>pci_0000_af_00_0</name><parent>computer</parent>
  <capability type='pci'>
    <class>0x030000</class>
    <domain>0</domain><bus>175</bus><slot>0</slot><function>0</function>
    <product id='0x1db4'/><vendor id='0x10DE'/>
    <capability type='mdev_types'>
      <type id='nvidia-222'><name>GRID V100-1B</name>
        <deviceAPI>vfio-pci</deviceAPI><availableInstances>16</availableInstances></type>
      <type id='nvidia-228'><deviceAPI>vfio-pci</deviceAPI>
        <availableInstances>2</availableInstances></type>
    </capability>
  </capability></device>"""

MDEV_NEW = """<device>
  <name>mdev_9f7a1c2e_55d4_4b0e_8c3a_1e2d3f4a5b6c_0000_af_00_0</name>
  <parent>pci_0000_af_00_0</parent>
  <capability type='mdev'><type id='nvidia-222'/>
    <uuid>9f7a1c2e-55d4-4b0e-8c3a-1e2d3f4a5b6c</uuid><iommuGroup number='190'/>
  </capability></device>"""

MDEV_OLD = """<device><name>mdev_0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0</name>
  <parent>pci_0000_af_00_0</parent>
  <capability type='mdev'><type id='nvidia-228'/></capability></device>"""


def test_pf():
    device = nodedev.parse_node_device(PF)
    pci = device.pci
    assert device.name == "pci_0000_3b_00_0" and device.mdev is None
    assert (pci.address, pci.vendor_id, pci.product_id) == (
        "0000:3b:00.0", "8086", "1572")
    assert pci.kind is PciKind.PF
    assert (pci.total_vfs, pci.num_vfs, pci.numa_node) == (32, 2, 1)
    assert (pci.class_id, pci.iommu_group, pci.driver) == ("020000", 27,
                                                           "i40e")
    assert device.mdev_parent is None


def test_pf_with_no_vfs_is_still_a_pf():
    text = PF.replace(
        PF[PF.index("<capability type='virt_functions'"):
           PF.index("<iommuGroup")],
        "<capability type='virt_functions' maxCount='32'/>")
    pci = nodedev.parse_node_device(text).pci
    assert (pci.kind, pci.total_vfs, pci.num_vfs) == (PciKind.PF, 32, 0)


def test_vf_without_numa_affinity():
    pci = nodedev.parse_node_device(VF).pci
    assert pci.kind is PciKind.VF
    assert pci.parent_address == "0000:3b:00.0"
    assert pci.numa_node is None and pci.class_id is None


def test_gpu_with_mdev_types():
    device = nodedev.parse_node_device(GPU)
    assert device.pci.kind is PciKind.PCI
    assert device.pci.vendor_id == "10de"
    parent = device.mdev_parent
    assert parent.address == "0000:af:00.0" and parent.numa_node is None
    assert parent.types == (MdevType("nvidia-222", 16, "GRID V100-1B"),
                            MdevType("nvidia-228", 2, None))


@pytest.mark.parametrize("text,uuid", [
    (MDEV_NEW, "9f7a1c2e-55d4-4b0e-8c3a-1e2d3f4a5b6c"),
    (MDEV_OLD, "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"),
])
def test_mdev(text, uuid):
    device = nodedev.parse_node_device(text)
    assert device.pci is None
    assert device.mdev.uuid == uuid
    assert device.mdev.parent_address == "0000:af:00.0"


def test_bad_devices_are_skipped_with_warnings_naming_device_and_field():
    items = [
        ("pci_0000_3b_00_0", PF),
        ("pci_0000_3b_02_1", VF.replace("'0x154c'", "'0xzz'")),
        ("pci_0000_af_00_0", GPU.replace("<availableInstances>2<",
                                         "<availableInstances>two<")),
        ("pci_0000_00_01_0", PF[:200]),
        ("mdev_x", MDEV_OLD.replace("<parent>pci_0000_af_00_0", "<parent>css")),
        ("pci_0000_3b_02_2", VF.replace("<function>1", "<function>9")),
    ]
    devices, warnings = nodedev.parse_node_devices(items)
    assert [d.name for d in devices] == ["pci_0000_3b_00_0"]
    assert warnings[0].startswith("pci_0000_3b_02_1: product id:")
    assert warnings[1].startswith(
        "pci_0000_af_00_0: mdev type nvidia-228 availableInstances:")
    assert warnings[2].startswith("pci_0000_00_01_0: xml: malformed XML")
    assert warnings[3].startswith(
        "mdev_0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0: parent:")
    assert warnings[4].startswith("pci_0000_3b_02_1: function: out of range")
    assert len(warnings) == 5


def test_non_pci_device_is_rejected():
    with pytest.raises(InvalidHostData) as info:
        nodedev.parse_node_device(
            "<device><name>net_eth0</name><capability type='net'/></device>")
    assert (info.value.device, info.value.field) == ("net_eth0", "capability")


def test_pci_address_from_name():
    assert nodedev.pci_address_from_name("pci_0000_AF_00_0", "d", "f") == (
        "0000:af:00.0")
    with pytest.raises(InvalidHostData):
        nodedev.pci_address_from_name("usb_1_2", "d", "f")


def test_mdev_dataclass_equality():
    assert nodedev.parse_node_device(MDEV_NEW).mdev == Mdev(
        "9f7a1c2e-55d4-4b0e-8c3a-1e2d3f4a5b6c", "nvidia-222", "0000:af:00.0")


# A PF behind an Intel VMD controller, in PCI domain 0x10000, as libvirt
# writes it: <domain> in decimal, address attributes in hex, the name with
# the domain as printed by %04x.
VMD_PF = """<device>
  <name>pci_10000_e1_00_0</name>
  <path>/sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/10000:e1:00.0</path>
  <parent>pci_10000_e0_06_0</parent>
  <capability type='pci'>
    <class>0x020000</class>
    <domain>65536</domain><bus>225</bus><slot>0</slot><function>0</function>
    <product id='0x1572'/><vendor id='0x8086'/>
    <capability type='virt_functions' maxCount='4'>
      <address domain='0x10000' bus='0xe1' slot='0x02' function='0x0'/>
    </capability>
    <iommuGroup number='40'>
      <address domain='0x10000' bus='0xe1' slot='0x00' function='0x0'/>
    </iommuGroup>
    <numa node='0'/>
  </capability>
</device>"""

VMD_VF = """<device><name>pci_10000_e1_02_0</name><parent>pci_10000_e0_06_0</parent>
  <capability type='pci'>
    <domain>65536</domain><bus>225</bus><slot>2</slot><function>0</function>
    <product id='0x154c'/><vendor id='0x8086'/>
    <capability type='phys_function'>
      <address domain='0x10000' bus='0xe1' slot='0x00' function='0x0'/>
    </capability>
  </capability></device>"""

VMD_MDEV = """<device>
  <name>mdev_9f7a1c2e_55d4_4b0e_8c3a_1e2d3f4a5b6c_10000_e1_00_0</name>
  <parent>pci_10000_e1_00_0</parent>
  <capability type='mdev'><type id='nvidia-222'/>
    <uuid>9f7a1c2e-55d4-4b0e-8c3a-1e2d3f4a5b6c</uuid>
  </capability></device>"""


def test_devices_in_a_pci_domain_past_ffff_are_read():
    pf = nodedev.parse_node_device(VMD_PF).pci
    vf = nodedev.parse_node_device(VMD_VF).pci
    mdev = nodedev.parse_node_device(VMD_MDEV).mdev
    assert (pf.address, pf.kind, pf.num_vfs) == ("10000:e1:00.0", PciKind.PF,
                                                 1)
    assert (vf.address, vf.parent_address) == ("10000:e1:02.0",
                                               "10000:e1:00.0")
    assert mdev.parent_address == "10000:e1:00.0"


def test_domain_past_32_bits_is_refused_naming_the_field():
    text = VMD_PF.replace("<domain>65536<", "<domain>4294967296<")
    with pytest.raises(InvalidHostData) as info:
        nodedev.parse_node_device(text)
    assert info.value.field == "domain"


# A PF as libvirt 9.0 writes it when its VPD serial number holds "<" and
# ">": the text fields of <capability type='vpd'> come out unescaped.
PF_BAD_VPD = """<device>
  <name>pci_0000_a1_00_0</name>
  <parent>computer</parent>
  <driver><name>mlx5_core</name></driver>
  <capability type='pci'>
    <class>0x020000</class>
    <domain>0</domain><bus>161</bus><slot>0</slot><function>0</function>
    <product id='0xa2d6'/><vendor id='0x15b3'/>
    <capability type='virt_functions' maxCount='8'>
      <address domain='0x0000' bus='0xa1' slot='0x00' function='0x2'/>
    </capability>
    <capability type='vpd'>
      <name>Example DPU, two ports</name>
      <fields access='readonly'>
        <change_level>B2</change_level>
        <part_number>EX-7781-A</part_number>
        <serial_number>EX4420Z11111><</serial_number>
      </fields>
      <fields access='readwrite'><asset_tag>row4</asset_tag></fields>
    </capability>
    <numa node='1'/>
  </capability>
</device>"""


def test_a_pf_whose_vpd_is_malformed_is_read_without_it():
    device = nodedev.parse_node_device(PF_BAD_VPD)
    assert device.pci is not None
    assert (device.pci.address, device.pci.kind, device.pci.total_vfs,
            device.pci.numa_node) == ("0000:a1:00.0", PciKind.PF, 8, 1)
    assert device.warning.startswith("pci_0000_a1_00_0: vpd: malformed XML")
    assert device.warning.endswith("the device is read without its VPD")


def test_a_malformed_vpd_gives_the_device_and_one_warning():
    devices, warnings = nodedev.parse_node_devices(
        [("pci_0000_a1_00_0", PF_BAD_VPD), ("pci_0000_3b_02_1", VF)])
    assert [d.name for d in devices] == ["pci_0000_a1_00_0",
                                         "pci_0000_3b_02_1"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "pci_0000_a1_00_0: vpd: "), warnings


def test_a_document_malformed_outside_its_vpd_is_still_refused():
    text = PF_BAD_VPD.replace("<numa node='1'/>", "<numa node='1'>")
    with pytest.raises(InvalidHostData) as info:
        nodedev.parse_node_device(text)
    assert info.value.field == "xml" and "malformed XML" in info.value.reason
    devices, warnings = nodedev.parse_node_devices([("pci_0000_a1_00_0", text)])
    assert devices == [] and len(warnings) == 1
