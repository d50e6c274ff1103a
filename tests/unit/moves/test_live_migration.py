"""The live-migration pre-check rules: which devices may move."""
import json

from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, PciDevice, PciKind
from compute_agent.drivers.migration import DeviceMove, LiveMigrationTarget
from compute_agent.moves.live_migration import (
    live_migratable_devices,
    mdev_refusals,
    mdev_type_refusals,
    pci_refusals,
)
from compute_agent.tree.device_spec import parse_specs

INSTANCE = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01"
MARKED_VF = PciDevice("0000:3b:10.1", "8086", "154c", PciKind.VF, 0,
                      parent_address="0000:3b:00.0")
PLAIN_VF = PciDevice("0000:5e:10.0", "8086", "1889", PciKind.VF, 1,
                     parent_address="0000:5e:00.0")
STRANGER = PciDevice("0000:af:00.0", "10de", "1db4", PciKind.PCI, 1)
SPECS = parse_specs([json.dumps({"product_id": "154c", "live_migratable": "yes"}),
                     json.dumps({"product_id": "1889"})])
MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"


def test_each_device_reads_its_first_matching_spec():
    assert live_migratable_devices(SPECS, [MARKED_VF, PLAIN_VF, STRANGER]) == {
        "0000:3b:10.1": True, "0000:5e:10.0": False}


def test_whole_devices_move_only_when_marked():
    known = live_migratable_devices(SPECS, [MARKED_VF, PLAIN_VF, STRANGER])
    guest = [GuestDevice("a", DeviceKind.VF, "0000:3b:10.1"),
             GuestDevice("b", DeviceKind.VF, "0000:5e:10.0"),
             GuestDevice("c", DeviceKind.PCI, "0000:af:00.0"),
             GuestDevice("d", DeviceKind.MDEV, MDEV),
             GuestDevice("e", DeviceKind.PMEM, "ns0"),
             GuestDevice("f", DeviceKind.PCPU, "3", cpus=frozenset({3})),
             GuestDevice("g", DeviceKind.NUMA, "0")]
    assert pci_refusals("source", guest, known) == [
        "source vf 0000:5e:10.0 (assignment b): cannot live migrate; its [pci] "
        "device_spec entry does not say live_migratable",
        "source pci 0000:af:00.0 (assignment c): no [pci] device_spec entry matches "
        "it, so it is not known to be live migratable"]
    assert pci_refusals("destination", guest[:1] + guest[3:], known) == []


def test_an_mdev_must_exist_on_the_destination_first():
    guest = [GuestDevice("a", DeviceKind.MDEV, MDEV),
             GuestDevice("b", DeviceKind.VF, "0000:3b:10.1")]
    assert mdev_refusals(guest, frozenset({MDEV})) == []
    assert mdev_refusals(guest, frozenset()) == [
        f"destination mdev {MDEV} (assignment a): does not exist on the destination; "
        "it must be created before the migration starts"]


def mdev(assignment_id: str, mdev_type: str | None) -> GuestDevice:
    return GuestDevice(assignment_id, DeviceKind.MDEV, MDEV,
                       detail=DeviceDetail(mdev_type=mdev_type))


def test_an_mdev_moves_into_one_of_its_own_type():
    def target(source_type, destination_type):
        return LiveMigrationTarget(INSTANCE, (
            DeviceMove(mdev("s", source_type), mdev("d", destination_type)),))
    assert mdev_type_refusals(target("nvidia-35", "nvidia-35")) == []
    assert mdev_type_refusals(target("nvidia-35", "nvidia-36")) == [
        f"mdev {MDEV} (assignment s) of type nvidia-35 cannot migrate into the "
        f"destination's {MDEV} of type nvidia-36"]
    assert len(mdev_type_refusals(target(None, None))) == 1
