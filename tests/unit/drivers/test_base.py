"""The drivers' data types that carry rules of their own (compute_agent/
drivers/base.py): which device kinds are only counted, a device's detail
as the store keeps it, and what a guest given a device holds on the host."""
import json

import pytest

from compute_agent.drivers.base import (
    DeviceDetail,
    DeviceKind,
    GuestDevice,
    HostResource,
    HostResourceKind,
    device_resources,
)

VF = "0000:81:10.1"
MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"


def test_only_numa_and_host_resources_are_counted():
    assert {k for k in DeviceKind if k.counted} == {DeviceKind.NUMA,
                                                   DeviceKind.HOST_RESOURCES}


def test_detail_as_json_has_its_known_fields_sorted():
    detail = DeviceDetail(numa_node=1, size_bytes=4 << 30, dev_path="/dev/dax0.0")
    assert detail.to_json() == ('{"dev_path": "/dev/dax0.0", "numa_node": 1, '
                                '"size_bytes": 4294967296}')
    assert DeviceDetail().to_json() == "{}"


def test_numa_node_zero_is_a_node_and_kept():
    assert DeviceDetail(numa_node=0).to_json() == '{"numa_node": 0}'


@pytest.mark.parametrize("detail", [
    DeviceDetail(),
    DeviceDetail(numa_node=0),
    DeviceDetail(1, 4 << 30, "/dev/dax1.0"),
    DeviceDetail(0, mdev_parent="0000:06:00.0", mdev_type="nvidia-35"),
])
def test_detail_reads_back_what_it_wrote(detail):
    assert DeviceDetail.from_json(detail.to_json()) == detail


def test_detail_reads_the_plain_dict_agents_wrote_before_it():
    # Every key present, unknown ones as null.
    old = json.dumps({"numa_node": 1, "size_bytes": None, "dev_path": None,
                      "mdev_parent": "0000:06:00.0", "mdev_type": "nvidia-35"})
    assert DeviceDetail.from_json(old) == DeviceDetail(
        1, mdev_parent="0000:06:00.0", mdev_type="nvidia-35")


@pytest.mark.parametrize("text,message", [
    ("[1]", "detail: '[1]': not a JSON object"),
    ('{"colour": "red"}', "detail.colour: 'red': not a field of a device's detail"),
    ('{"numa_node": "0"}', "detail.numa_node: '0': must be int"),
    ('{"numa_node": true}', "detail.numa_node: True: must be int"),  # a bool is no node
    ('{"numa_node": 1.0}', "detail.numa_node: 1.0: must be int"),
    ('{"dev_path": 7}', "detail.dev_path: 7: must be str"),
])
def test_detail_refuses_what_is_not_its_own_naming_the_field(text, message):
    with pytest.raises(ValueError) as caught:
        DeviceDetail.from_json(text)
    assert str(caught.value) == message


def test_detail_that_is_not_json_is_a_value_error():
    with pytest.raises(ValueError):
        DeviceDetail.from_json("{numa_node: 1")


@pytest.mark.parametrize("kind,device_id", [(DeviceKind.PCI, "0000:3b:00.0"),
                                            (DeviceKind.VF, VF),
                                            (DeviceKind.VGPU_VF, "0000:41:00.4")])
def test_a_pci_function_is_held_by_its_address(kind, device_id):
    assert device_resources(GuestDevice("a", kind, device_id)) == {
        HostResource(HostResourceKind.PCI_ADDRESS, device_id)}


def test_an_mdev_is_held_by_its_uuid():
    assert device_resources(GuestDevice("a", DeviceKind.MDEV, MDEV)) == {
        HostResource(HostResourceKind.MDEV_UUID, MDEV)}


def test_a_namespace_is_held_by_the_device_the_guest_maps():
    ns = GuestDevice("a", DeviceKind.PMEM, "ns0",
                     detail=DeviceDetail(0, 4 << 30, "/dev/dax0.0"))
    assert device_resources(ns) == {HostResource(HostResourceKind.BACKING_PATH,
                                                 "/dev/dax0.0")}


def test_a_namespace_whose_device_is_unknown_holds_nothing_nameable():
    assert device_resources(GuestDevice("a", DeviceKind.PMEM, "ns0")) == frozenset()


def test_pinned_cpus_are_held_one_by_one_by_number():
    pinned = GuestDevice("a", DeviceKind.PCPU, "8", 2, frozenset({8, 12}))
    assert device_resources(pinned) == {HostResource(HostResourceKind.HOST_CPU, "8"),
                                        HostResource(HostResourceKind.HOST_CPU, "12")}


@pytest.mark.parametrize("kind", [DeviceKind.NUMA, DeviceKind.HOST_RESOURCES])
def test_shared_cpus_and_memory_hold_nothing(kind):
    assert device_resources(GuestDevice("a", kind, "1", 2048)) == frozenset()

