"""The validators every host-data parser uses (compute_agent/drivers/
host_data.py): values as the kernel's sysfs and libvirt's XML write them,
and each complaint an InvalidHostData naming the device, the field and the
value."""
import pytest

from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.host_data import (
    format_pci_address,
    parse_cpulist,
    parse_hex_id,
    parse_int,
    parse_numa_node,
    parse_pci_address,
)

PF = "0000:81:00.0"


def complaint(call) -> InvalidHostData:
    with pytest.raises(InvalidHostData) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("text,kwargs,value", [
    ("8\n", {}, 8),  # a sysfs attribute, newline and all
    (" 12 ", {}, 12),
    (7, {}, 7),  # libvirt's Python binding hands some numbers over as ints
    ("0", {}, 0),
    ("0x1003", {"base": 0}, 0x1003),  # a net interface's flags
    ("64", {"base": 0}, 64),
    ("4095", {"maximum": 4095}, 4095),
    ("-1", {"minimum": -1}, -1),
])
def test_integers_as_the_host_writes_them(text, kwargs, value):
    assert parse_int(text, PF, "sriov_numvfs", **kwargs) == value


@pytest.mark.parametrize("text,kwargs,reason", [
    ("many", {}, "not an integer"),
    ("", {}, "not an integer"),
    ("0x10", {}, "not an integer"),  # hex only where the file is hex
    ("3.5", {}, "not an integer"),
    (None, {}, "not an integer"),
    (True, {}, "not an integer"),  # a bool is an int to Python, not to us
    (["1"], {}, "not an integer"),
    ("-1", {}, "out of range"),
    ("9", {"maximum": 8}, "out of range"),
    (2, {"minimum": 3}, "out of range"),
])
def test_integers_refused_name_device_field_and_value(text, kwargs, reason):
    error = complaint(lambda: parse_int(text, PF, "sriov_numvfs", **kwargs))
    assert (error.device, error.field, error.reason, error.value) == (
        PF, "sriov_numvfs", reason, text)


@pytest.mark.parametrize("text,node", [("-1\n", None), ("0", 0), ("3", 3),
                                       ("4095", 4095)])
def test_numa_node_minus_one_is_no_affinity(text, node):
    assert parse_numa_node(text, PF) == node


@pytest.mark.parametrize("text", ["-2", "4096", "", "node0"])
def test_numa_node_out_of_the_kernels_range_is_refused(text):
    error = complaint(lambda: parse_numa_node(text, PF))
    assert (error.field, error.value) == ("numa_node", text)


@pytest.mark.parametrize("text,hex_id", [
    ("0x8086\n", "8086"),  # sysfs's vendor file
    ("0x10DE", "10de"),  # libvirt's <vendor id='0x10DE'>
    ("10fb", "10fb"),
    ("0X15b3", "15b3"),
])
def test_hex_ids_become_four_lower_case_digits(text, hex_id):
    assert parse_hex_id(text, PF, "vendor") == hex_id


@pytest.mark.parametrize("text", ["0x80866", "0x808", "8086\n10fb", "0xzz86", "",
                                  0x8086, None])
def test_hex_ids_that_are_not_four_digits_are_refused(text):
    error = complaint(lambda: parse_hex_id(text, PF, "vendor"))
    assert (error.field, error.reason, error.value) == (
        "vendor", "not a 4-digit hex id", text)


@pytest.mark.parametrize("text,address", [
    ("0000:81:00.0\n", PF),
    ("0000:3B:02.7", "0000:3b:02.7"),
    ("10000:E1:00.0", "10000:e1:00.0"),  # behind Intel VMD, past domain ffff
])
def test_pci_addresses_become_canonical(text, address):
    assert parse_pci_address(text, "pci_0000_81_00_0", "address") == address


@pytest.mark.parametrize("text", ["0000:81:00", "81:00.0", "0000:81:20.0",
                                  "0000:81:00.8", "", None])
def test_text_that_is_no_pci_address_is_refused(text):
    error = complaint(lambda: parse_pci_address(text, "virtfn0", "physfn"))
    assert (error.device, error.field, error.reason, error.value) == (
        "virtfn0", "physfn", "not a PCI address", text)


def test_address_parts_are_formatted_canonically():
    assert format_pci_address((0, 0x81, 0x10, 1), PF, "address") == "0000:81:10.1"
    assert format_pci_address((0x10000, 0xE1, 0, 0), PF, "address") == "10000:e1:00.0"


@pytest.mark.parametrize("parts", [(0, 0x100, 0, 0), (0, 0, 0x20, 0), (0, 0, 0, 8),
                                   (1 << 32, 0, 0, 0), (-1, 0, 0, 0)])
def test_address_parts_out_of_range_are_refused_with_all_parts(parts):
    error = complaint(lambda: format_pci_address(parts, PF, "address"))
    assert (error.reason, error.value) == ("PCI address out of range", parts)


@pytest.mark.parametrize("text,kwargs,cpus", [
    ("0-3,8-11\n", {}, {0, 1, 2, 3, 8, 9, 10, 11}),  # a node's cpulist
    ("0,4", {}, {0, 4}),
    ("", {}, set()),  # a memory-only node
    ("0-3,^2", {"allow_exclusions": True}, {0, 1, 3}),  # a domain's cpuset
])
def test_cpu_lists_in_the_kernels_and_libvirts_syntax(text, kwargs, cpus):
    assert parse_cpulist(text, "node1", "cpulist", **kwargs) == frozenset(cpus)


@pytest.mark.parametrize("text,reason", [
    ("0-3,^2", "exclusion not allowed here: '^2'"),  # sysfs never excludes
    ("3-0", "not a valid CPU range: '3-0'"),
    ("a", "not a CPU number or range: 'a'"),
    (None, "not a CPU list"),
])
def test_cpu_lists_refused_say_which_part(text, reason):
    error = complaint(lambda: parse_cpulist(text, "node1", "cpulist"))
    assert (error.device, error.field, error.reason, error.value) == (
        "node1", "cpulist", reason, text)
