import json

import pytest

from compute_agent.drivers.base import PmemNamespace
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt import pmem
from compute_agent.drivers.libvirt.sysfs import SysfsReader

NS = {"dev": "namespace0.0", "mode": "devdax", "map": "dev",
      "size": 4225761280, "uuid": "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9",
      "chardev": "dax0.0", "align": 2097152, "name": "ns_small",
      "numa_node": 0}


def test_ndctl_list():
    second = {"dev": "namespace1.0", "mode": "devdax", "size": 1 << 30,
              "chardev": "dax1.0", "numa_node": 1}
    found, warnings = pmem.parse_ndctl_json(json.dumps([NS, second]))
    assert warnings == []
    assert found == [
        PmemNamespace("ns_small", 4225761280, 0, "devdax",
                      "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9", "dax0.0"),
        PmemNamespace("namespace1.0", 1 << 30, 1, "devdax", None, "dax1.0")]


def test_ndctl_list_with_dax_regions():
    # ``ndctl list -N -X`` puts the character device in the dax region.
    entry = {key: value for key, value in NS.items() if key != "chardev"}
    entry["daxregion"] = {"id": 0, "size": 4225761280, "align": 2097152,
                          "devices": [{"chardev": "dax0.0",
                                       "size": 4225761280}]}
    found, warnings = pmem.parse_ndctl_json(json.dumps([entry]))
    assert warnings == [] and found[0].dev == "dax0.0"


def test_devdax_without_a_character_device_is_a_warning():
    entry = {key: value for key, value in NS.items() if key != "chardev"}
    fsdax = {**entry, "dev": "namespace1.0", "mode": "fsdax",
             "blockdev": "pmem1"}
    found, warnings = pmem.parse_ndctl_json(json.dumps([entry, fsdax]))
    assert [(n.name, n.mode, n.dev) for n in found] == [
        ("ns_small", "fsdax", None)]
    assert warnings[0].startswith("namespace0.0: chardev:")


def test_single_object_is_accepted():
    found, _ = pmem.parse_ndctl_json(json.dumps(NS))
    assert [n.name for n in found] == ["ns_small"]


@pytest.mark.parametrize("text,field", [
    ("{not json", "json"),
    ('"namespace0.0"', "json"),
    ('{"regions": []}', "dev"),
    ("42", "json"),
])
def test_wrong_shape_raises_naming_the_field(text, field):
    with pytest.raises(InvalidHostData) as info:
        pmem.parse_ndctl_json(text)
    assert info.value.field == field


def test_bad_entries_are_skipped_with_warnings():
    entries = [NS, {**NS, "dev": "namespace2.0", "size": "huge"}, "x",
               {**NS, "dev": "namespace3.0", "numa_node": "zero"},
               {"mode": "devdax", "size": 1}]
    found, warnings = pmem.parse_ndctl_json(json.dumps(entries))
    assert [n.name for n in found] == ["ns_small"]
    assert warnings[0].startswith("ndctl JSON: [2]: not an object")
    assert warnings[1].startswith("namespace2.0: size: not an integer")
    assert warnings[2].startswith("namespace3.0: numa_node:")
    assert warnings[3].startswith("ndctl JSON: dev:")


def test_from_sysfs_and_from_file(tmp_path):
    builder = SysfsBuilder(tmp_path / "sys")
    builder.add_pmem_namespace(0, 0, 1 << 30, 0, "ns0")
    builder.add_pmem_namespace(0, 1, 0, 0)  # the region's idle seed
    builder.add_pmem_namespace(1, 0, 2 << 30, None)
    # a devdax namespace's usable size is its dax device's
    (builder.root / "bus/dax/devices/dax1.0/size").write_text("x")
    reader = SysfsReader(str(builder.root))
    found, warnings = pmem.read_namespaces(reader, None)
    assert [(n.name, n.dev, n.numa_node) for n in found] == [
        ("ns0", "dax0.0", 0)]
    assert warnings[0].startswith(
        "namespace1.0: dax1.0/dax1.0/size: not an integer")

    path = tmp_path / "ndctl.json"
    path.write_text(json.dumps([NS]))
    found, _ = pmem.read_namespaces(reader, str(path))
    assert [n.name for n in found] == ["ns_small"]
    with pytest.raises(InvalidHostData):
        pmem.read_namespaces(reader, str(tmp_path / "missing.json"))


def test_fuzz_bug_an_ndctl_file_not_in_utf8_is_invalid_host_data(tmp_path):
    """Found by tests/reliability: a UnicodeDecodeError escaped discovery."""
    path = tmp_path / "ndctl.json"
    path.write_bytes(b"\x80" + json.dumps([NS]).encode())
    with pytest.raises(InvalidHostData) as caught:
        pmem.read_namespaces(SysfsReader(str(tmp_path)), str(path))
    assert str(caught.value).startswith("ndctl JSON: file: not UTF-8")


def test_fuzz_bug_ndctl_json_nested_past_the_decoders_limit_is_invalid(tmp_path):
    """Found by tests/reliability: json.loads' RecursionError escaped."""
    with pytest.raises(InvalidHostData) as caught:
        pmem.parse_ndctl_json("[" * 100_000 + "]" * 100_000)
    assert str(caught.value).startswith("ndctl JSON: json: nested too deep")
