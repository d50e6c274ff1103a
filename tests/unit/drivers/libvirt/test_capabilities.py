import pytest

from compute_agent.drivers.base import NumaCell
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.libvirt import capabilities

CAPS = """<capabilities>
  <host>
    <uuid>5c8e1f3a-2b7d-4e09-9a61-0d3f2c7b8e14</uuid>
    <cpu><arch>x86_64</arch><vendor>Intel</vendor></cpu>
    <power_management><suspend_mem/></power_management>
    <topology>
      <cells num='2'>
        <cell id='0'>
          <memory unit='KiB'>16777216</memory>
          <pages unit='KiB' size='4'>3670016</pages>
          <pages unit='KiB' size='2048'>1024</pages>
          <distances><sibling id='0' value='10'/><sibling id='1' value='21'/></distances>
          <cpus num='4'>
            <cpu id='0' socket_id='0' die_id='0' core_id='0' siblings='0,2'/>
            <cpu id='1' socket_id='0' die_id='0' core_id='1' siblings='1,3'/>
            <cpu id='2' socket_id='0' die_id='0' core_id='0' siblings='0,2'/>
            <cpu id='3' socket_id='0' die_id='0' core_id='1' siblings='1,3'/>
          </cpus>
        </cell>
        <cell id='1'>
          <memory unit='KiB'>8388608</memory>
          <future-element>ignored</future-element>
          <cpus num='2'>
            <cpu id='4' socket_id='1' core_id='0' siblings='4-5'/>
            <cpu id='5' socket_id='1' core_id='0' siblings='4-5'/>
          </cpus>
        </cell>
      </cells>
    </topology>
  </host>
  <guest><os_type>hvm</os_type></guest>
</capabilities>"""


def test_parses_host_uuid_and_cells():
    caps = capabilities.parse_capabilities(CAPS)
    assert caps.uuid == "5c8e1f3a-2b7d-4e09-9a61-0d3f2c7b8e14"
    assert caps.warnings == ()
    assert caps.cpus == frozenset(range(6))
    cell0, cell1 = caps.cells
    assert cell0 == NumaCell(
        id=0, cpus=frozenset({0, 1, 2, 3}), memory_mb=16384,
        siblings=(frozenset({0, 2}), frozenset({1, 3})),
        pages=((4, 3670016), (2048, 1024)), distances=((0, 10), (1, 21)))
    assert cell1.memory_mb == 8192
    assert cell1.siblings == (frozenset({4, 5}),)


# libvirt leaves <memory> out of a cell that has none: a memory-less node
# (CPUs whose memory sits on another node), as on some AMD EPYC and
# POWER hosts. Its CPUs, siblings, pages and distances are still there.
MEMORYLESS = CAPS.replace(
    "<memory unit='KiB'>8388608</memory>",
    "<pages unit='KiB' size='4'>0</pages>"
    "<pages unit='KiB' size='2048'>0</pages>"
    "<distances><sibling id='0' value='21'/><sibling id='1' value='10'/>"
    "</distances>")


def test_cell_without_memory_is_kept_with_its_cpus():
    caps = capabilities.parse_capabilities(MEMORYLESS)
    assert caps.warnings == ()
    assert [c.id for c in caps.cells] == [0, 1]
    assert caps.cells[1] == NumaCell(
        id=1, cpus=frozenset({4, 5}), memory_mb=0,
        siblings=(frozenset({4, 5}),), pages=((4, 0), (2048, 0)),
        distances=((0, 21), (1, 10)))
    assert caps.cpus == frozenset(range(6))


# An arm64 host whose kernel uses 64 KiB base pages (its huge pages are
# then 2 MiB, 512 MiB and 16 GiB). libvirt lists the base page first.
CAPS_64K = """<capabilities>
  <host>
    <uuid>0b9d7c52-6a3e-4f1b-8d20-7e5a4c3b2a19</uuid>
    <cpu>
      <arch>aarch64</arch>
      <pages unit='KiB' size='64'/>
      <pages unit='KiB' size='2048'/>
      <pages unit='KiB' size='524288'/>
      <pages unit='KiB' size='16777216'/>
    </cpu>
    <topology>
      <cells num='1'>
        <cell id='0'>
          <memory unit='KiB'>33554432</memory>
          <pages unit='KiB' size='64'>516096</pages>
          <pages unit='KiB' size='2048'>0</pages>
          <pages unit='KiB' size='524288'>2</pages>
          <pages unit='KiB' size='16777216'>0</pages>
          <cpus num='2'>
            <cpu id='0' socket_id='0' cluster_id='0' core_id='0' siblings='0'/>
            <cpu id='1' socket_id='0' cluster_id='0' core_id='1' siblings='1'/>
          </cpus>
        </cell>
      </cells>
    </topology>
  </host>
</capabilities>"""


def test_base_page_size_of_a_64k_kernel():
    caps = capabilities.parse_capabilities(CAPS_64K)
    assert caps.warnings == ()
    assert caps.base_page_kib == 64
    assert dict(caps.cells[0].pages) == {64: 516096, 2048: 0, 524288: 2,
                                         16777216: 0}


def test_base_page_size_is_unknown_without_pages():
    caps = capabilities.parse_capabilities(
        CAPS_64K.replace("<pages unit='KiB' size='64'/>", "").replace(
            "<pages unit='KiB' size='2048'/>", "").replace(
            "<pages unit='KiB' size='524288'/>", "").replace(
            "<pages unit='KiB' size='16777216'/>", ""))
    assert caps.base_page_kib is None


def test_test_driver_capabilities_have_no_cells():
    caps = capabilities.parse_capabilities(
        "<capabilities><host><cpu><arch>i686</arch></cpu><topology>"
        "<cells num='0'></cells></topology></host></capabilities>")
    assert caps.cells == () and caps.uuid is None


@pytest.mark.parametrize("text", [
    CAPS[: len(CAPS) // 2],
    "",
    "<domain/>",
    "<capabilities><guest/></capabilities>",
    b"\xff\xfe<capabilities>",
])
def test_unusable_document_raises(text):
    with pytest.raises(InvalidHostData) as info:
        capabilities.parse_capabilities(text)
    assert info.value.device == "capabilities"


def test_bad_cell_is_skipped_with_warning_others_kept():
    bad = CAPS.replace("<memory unit='KiB'>8388608</memory>",
                       "<memory unit='KiB'>lots</memory>")
    caps = capabilities.parse_capabilities(bad)
    assert [c.id for c in caps.cells] == [0]
    assert len(caps.warnings) == 1
    assert caps.warnings[0].startswith("cell 1: memory: not an integer")
    assert "'lots'" in caps.warnings[0]


def test_bad_cpu_siblings_and_unit_name_the_field():
    bad = CAPS.replace("siblings='4-5'/>\n            <cpu id='5'",
                       "siblings='5-4'/>\n            <cpu id='5'")
    caps = capabilities.parse_capabilities(bad)
    assert "cell 1: cpu 4 siblings" in caps.warnings[0]
    bad = CAPS.replace("unit='KiB'>16777216", "unit='parsecs'>16777216")
    assert "cell 0: memory unit: unknown unit" in (
        capabilities.parse_capabilities(bad).warnings[0])


def test_bad_uuid_is_a_warning():
    caps = capabilities.parse_capabilities(
        CAPS.replace("5c8e1f3a-2b7d-4e09-9a61-0d3f2c7b8e14", "nope"))
    assert caps.uuid is None
    assert caps.warnings[0].startswith("capabilities: uuid:")
    assert len(caps.cells) == 2


def test_sysfs_numa_node():
    cell = capabilities.parse_sysfs_numa_node(
        1, "4-7,12", "Node 1 MemTotal:  4194304 kB\nNode 1 MemFree: 1 kB\n",
        {2048: "512", 1048576: "1"}, base_page_kib=4)
    assert cell.cpus == frozenset({4, 5, 6, 7, 12})
    assert cell.memory_mb == 4096
    # 4 GiB - 1 GiB of 2 MiB pages - one 1 GiB page = 2 GiB of 4 KiB pages
    assert dict(cell.pages) == {4: 524288, 2048: 512, 1048576: 1}


def test_sysfs_numa_node_without_memory():
    # The kernel writes MemTotal 0 for a memory-less node and gives it no
    # hugepages directory.
    cell = capabilities.parse_sysfs_numa_node(
        1, "4-7", "Node 1 MemTotal:              0 kB\n"
        "Node 1 MemFree:               0 kB\n", {}, base_page_kib=4)
    assert (cell.cpus, cell.memory_mb) == (frozenset({4, 5, 6, 7}), 0)


def test_sysfs_numa_node_of_a_64k_kernel():
    # 32 GiB - one 512 MiB huge page = 32256 MiB of 64 KiB pages
    cell = capabilities.parse_sysfs_numa_node(
        0, "0-1", "Node 0 MemTotal:       33554432 kB\n",
        {2048: "0", 524288: "1"}, base_page_kib=64)
    assert dict(cell.pages) == {64: 516096, 2048: 0, 524288: 1}


@pytest.mark.parametrize("cpulist,meminfo,field", [
    ("0-x", "Node 0 MemTotal: 1024 kB", "cpulist"),
    ("0-3", "Node 0 MemFree: 1024 kB", "meminfo"),
    ("0-3", "Node 7 MemTotal: 1024 kB", "meminfo"),
])
def test_sysfs_numa_node_errors_name_the_field(cpulist, meminfo, field):
    with pytest.raises(InvalidHostData) as info:
        capabilities.parse_sysfs_numa_node(0, cpulist, meminfo, {}, 4)
    assert (info.value.device, info.value.field) == ("node0", field)


def test_merge_cells_caps_win_sysfs_fills_missing_ids():
    caps_cell = NumaCell(0, frozenset({0}), 100)
    sysfs = [NumaCell(0, frozenset({0, 1}), 50),
             NumaCell(1, frozenset({2}), 7)]
    assert capabilities.merge_cells([caps_cell], sysfs) == (caps_cell,
                                                            sysfs[1])
    assert capabilities.merge_cells([], sysfs) == tuple(sysfs)


# The host CPU as libvirt's capabilities XML describes it: a named model,
# then the features that model does not already imply.
HOST_CPU = """<capabilities>
  <host>
    <uuid>5c8e1f3a-2b7d-4e09-9a61-0d3f2c7b8e14</uuid>
    <cpu>
      <arch>x86_64</arch>
      <model>Skylake-Client-IBRS</model>
      <vendor>Intel</vendor>
      <microcode version='240'/>
      <counter name='tsc' frequency='2112000000' scaling='no'/>
      <topology sockets='1' dies='1' cores='4' threads='2'/>
      <feature name='ds'/>
      <feature name='vmx'/>
      <feature name='avx2'/>
      <feature name='sse4.2'/>
      <feature name='md-clear'/>
      <feature name='pdpe1gb'/>
      <pages unit='KiB' size='4'/>
      <pages unit='KiB' size='2048'/>
    </cpu>
  </host>
</capabilities>"""


def test_host_cpu_features_are_read_by_libvirts_names():
    caps = capabilities.parse_capabilities(HOST_CPU)
    assert caps.cpu_features == {"ds", "vmx", "avx2", "sse4.2", "md-clear", "pdpe1gb"}
    assert caps.base_page_kib == 4


def test_a_feature_a_cpu_definition_disables_is_not_one():
    """baselineCPU's expanded CPU lists what the model lacks as disabled."""
    cpu = capabilities.parse_xml(
        "<cpu mode='custom' match='exact'><model>Skylake-Client</model>"
        "<feature policy='require' name='avx2'/>"
        "<feature policy='disable' name='hle'/><feature policy='forbid' name='rtm'/>"
        "</cpu>", "cpu")
    assert capabilities.cpu_features(cpu) == {"avx2"}


def test_a_host_without_cpu_features_has_none():
    assert capabilities.parse_capabilities(CAPS).cpu_features == frozenset()
