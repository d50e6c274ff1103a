"""Which of a guest's devices can be live migrated: the pre-check rules, pure.

A device given to a guest whole (a PCI device, an SR-IOV VF) carries state
the hypervisor cannot copy unless its driver migrates it (a VFIO variant
driver); only the operator knows that, so such a device migrates only when
its ``[pci] device_spec`` entry says ``live_migratable``, on the source and
on the destination alike (as nova requires). A mediated device migrates
into an mdev of the same type that exists on the destination before the
migration starts (libvirt 8.6 and QEMU 8.1 migrate an mdev's state; neither
creates the destination's). Persistent memory, pinned CPUs and NUMA cells
are the guest's memory and scheduling, which QEMU moves by itself.

Each rule returns one line per device in the way, so a pre-check refuses
with every reason at once and nothing moves.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from compute_agent.drivers.base import DeviceKind, GuestDevice, PciDevice
from compute_agent.drivers.migration import LiveMigrationTarget
from compute_agent.tree.device_spec import DeviceSpec, first_match

_WHOLE_DEVICES = (DeviceKind.PCI, DeviceKind.VF)


def live_migratable_devices(specs: tuple[DeviceSpec, ...],
                            devices: Iterable[PciDevice]) -> dict[str, bool]:
    """PCI address -> whether the first spec matching the device marks it
    live migratable; devices no spec matches are left out (unknown)."""
    return {d.address: spec.live_migratable for d in devices
            if (spec := first_match(specs, d)) is not None}


def pci_refusals(side: str, devices: Iterable[GuestDevice],
                 live_migratable: Mapping[str, bool]) -> list[str]:
    """The whole devices among ``devices`` that cannot live migrate, as
    ``side`` ("source", "destination") sees them; ``live_migratable`` is
    live_migratable_devices' answer on that side. A device it does not
    know is refused: unknown is not migratable."""
    refusals = []
    for d in devices:
        if d.kind not in _WHOLE_DEVICES:
            continue
        known = live_migratable.get(d.device_id)
        if known is None:
            refusals.append(f"{side} {d.kind.value} {d.device_id} (assignment "
                            f"{d.assignment_id}): no [pci] device_spec entry matches "
                            "it, so it is not known to be live migratable")
        elif not known:
            refusals.append(f"{side} {d.kind.value} {d.device_id} (assignment "
                            f"{d.assignment_id}): cannot live migrate; its [pci] "
                            "device_spec entry does not say live_migratable")
    return refusals


def mdev_refusals(destination_devices: Iterable[GuestDevice],
                  existing_mdevs: frozenset[str]) -> list[str]:
    """The destination's mdevs that do not exist yet: libvirt migrates an
    mdev only into one that is there when the migration starts."""
    return [f"destination mdev {d.device_id} (assignment {d.assignment_id}): does not "
            "exist on the destination; it must be created before the migration starts"
            for d in destination_devices
            if d.kind is DeviceKind.MDEV and d.device_id not in existing_mdevs]


def mdev_type_refusals(target: LiveMigrationTarget) -> list[str]:
    """Moves that would put an mdev's (or a vGPU VF's) state into one of
    another type (or of a type not known on either side): its vendor
    driver cannot read it."""
    return [f"{m.source.kind.value} {m.source.device_id} (assignment "
            f"{m.source.assignment_id}) of type {m.source.detail.mdev_type} cannot "
            f"migrate into the destination's {m.destination.device_id} of type "
            f"{m.destination.detail.mdev_type}"
            for m in target.moves
            if m.source.kind in (DeviceKind.MDEV, DeviceKind.VGPU_VF)
            and (m.source.detail.mdev_type is None
                 or m.source.detail.mdev_type != m.destination.detail.mdev_type)]
