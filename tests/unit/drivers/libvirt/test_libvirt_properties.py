"""Generated junk fed to every parser: the only exception allowed out is
InvalidHostData."""
import json
import os

from hypothesis import HealthCheck, given, settings, strategies as st

from drivers.libvirt import capabilities, nodedev, pmem
from drivers.errors import InvalidHostData
from drivers.libvirt.sysfs import SysfsReader

SETTINGS = settings(
    max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture])

_values = st.one_of(st.text(max_size=12), st.integers(-5, 1 << 40).map(str),
                    st.sampled_from(["0x8086", "-1", "0-3", "0x", "4-", ""]))


def _element(tags, attrs, depth=2):
    children = (st.lists(st.deferred(lambda: _element(tags, attrs, depth - 1)),
                         max_size=4) if depth else st.just([]))
    return st.builds(
        lambda tag, at, text, kids: "<{0}{1}>{2}{3}</{0}>".format(
            tag, "".join(f" {k}='{v}'" for k, v in at.items()),
            text, "".join(kids)),
        st.sampled_from(tags),
        st.dictionaries(st.sampled_from(attrs),
                        _values.map(lambda v: v.replace("'", "")
                                    .replace("<", "").replace("&", "")),
                        max_size=3),
        _values.map(lambda v: v.replace("<", "").replace("&", "")),
        children)


_NODEDEV_TAGS = ["name", "parent", "capability", "domain", "bus", "slot",
                 "function", "vendor", "product", "class", "numa", "address",
                 "iommuGroup", "type", "uuid", "availableInstances", "driver"]
_NODEDEV_ATTRS = ["type", "id", "node", "number", "maxCount", "domain", "bus",
                  "slot", "function"]
_CAPS_TAGS = ["host", "uuid", "topology", "cells", "cell", "memory", "cpus",
              "cpu", "pages", "distances", "sibling"]
_CAPS_ATTRS = ["id", "unit", "size", "siblings", "value", "num"]


def _allowed(fn, *args):
    try:
        fn(*args)
    except InvalidHostData:
        pass


@SETTINGS
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200),
                 _element(_NODEDEV_TAGS, _NODEDEV_ATTRS).map(
                     lambda x: f"<device><name>d</name>{x}</device>")))
def test_nodedev_parser(text):
    _allowed(nodedev.parse_node_device, text)
    nodedev.parse_node_devices([("d", text)])


@SETTINGS
@given(st.one_of(st.text(max_size=200),
                 _element(_CAPS_TAGS, _CAPS_ATTRS, depth=3).map(
                     lambda x: f"<capabilities><host>{x}</host>"
                               f"<host><topology><cells>{x}</cells>"
                               f"</topology></host></capabilities>")))
def test_capabilities_parser(text):
    _allowed(capabilities.parse_capabilities, text)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.sampled_from(["dev", "size", "mode", "name", "uuid", "numa_node",
                         "chardev"]), kids, max_size=7),
    max_leaves=12)


@SETTINGS
@given(st.one_of(_json.map(json.dumps), st.text(max_size=50)))
def test_ndctl_parser(text):
    _allowed(pmem.parse_ndctl_json, text)


_SYSFS_FILES = [
    "bus/pci/devices/0000:01:00.0/vendor",
    "bus/pci/devices/0000:01:00.0/device",
    "bus/pci/devices/0000:01:00.0/class",
    "bus/pci/devices/0000:01:00.0/numa_node",
    "bus/pci/devices/0000:01:00.0/sriov_totalvfs",
    "bus/pci/devices/0000:01:00.0/sriov_numvfs",
    "bus/pci/devices/junk/vendor",
    "bus/pci/devices/0000:01:00.0/nvidia/creatable_vgpu_types",
    "bus/pci/devices/0000:01:00.0/nvidia/current_vgpu_type",
    "class/mdev_bus/0000:01:00.0/mdev_supported_types/t1/available_instances",
    "class/mdev_bus/0000:01:00.0/mdev_supported_types/t1/name",
    "class/mdev_bus/0000:01:00.0/mdev_supported_types/t2",
    "bus/mdev/devices/not-a-uuid/mdev_type",
    "devices/system/node/node0/cpulist",
    "devices/system/node/node0/meminfo",
    "devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
    "devices/system/node/node1/cpulist",
    "bus/nd/devices/namespace0.0/size",
    "bus/nd/devices/namespace0.0/mode",
    "bus/nd/devices/namespace0.0/numa_node",
    "bus/nd/devices/namespace0.0/uuid",
]


@SETTINGS
@given(files=st.dictionaries(st.sampled_from(_SYSFS_FILES),
                             st.one_of(_values, st.binary(max_size=20)),
                             max_size=12))
def test_sysfs_reader(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("sys")
    for relative, content in files.items():
        path = root / relative
        if any(p.is_file() for p in path.parents):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            continue
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    reader = SysfsReader(os.fspath(root))
    reader.numa_cells(4)
    reader.pci_devices()
    reader.mdev_types()
    reader.mdevs()
    pmem.read_namespaces(reader, None)
