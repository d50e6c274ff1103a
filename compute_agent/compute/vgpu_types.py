"""The vGPU types of NVIDIA's vendor-specific VFIO VFs, written back after
a host reboot.

A reboot clears every VF's current_vgpu_type. The store records the type
each VF was claimed with (an assignment of kind vgpu_vf, its detail's
mdev_type), so before the first cycle reports inventory and before any
claim is served, the types of the VFs that live assignments hold are
written back: otherwise the cycle would offer their siblings sizes an
equal-size card can no longer create, and the guests could not start.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from compute_agent.compute.manager import ComputeManager
from compute_agent.drivers.base import DeviceKind
from compute_agent.drivers.errors import DriverUnavailable, MdevError

LOG = logging.getLogger(__name__)


def restore_vgpu_types_after_reboot(manager: ComputeManager, boot_id: str
                                    ) -> dict[str, str]:
    """Write back the type of every vGPU VF a live assignment made before
    this boot holds. Returns the VFs that did not take it back, each with
    why, one WARNING line each: their units stay reserved with the reason
    (compute_agent/health/rules.py hold_vgpu_vfs_not_restored) until they hold a
    type or are given back. The assignments move to this boot with the
    reconciliation (its mdev_after_reboot rule), so a restart before that
    writes the types again, which changes nothing."""
    _, rows, _ = manager.tracker.snapshot()
    not_restored: dict[str, str] = {}
    for a in rows:
        if a.kind is not DeviceKind.VGPU_VF or a.boot_id == boot_id:
            continue
        try:
            manager.driver.set_vgpu_type(a.device_id, a.detail.mdev_type or "")
        except (MdevError, DriverUnavailable) as e:
            not_restored[a.device_id] = str(e)
            LOG.warning("vGPU VF %s of instance %s: type %s not restored after the "
                        "host's reboot; its unit stays reserved: %s", a.device_id,
                        a.consumer_uuid, a.detail.mdev_type, e)
        else:
            LOG.info("vGPU VF %s of instance %s: type %s restored after the host's "
                     "reboot", a.device_id, a.consumer_uuid, a.detail.mdev_type)
    return not_restored


def still_not_restored(not_restored: dict[str, str], typed: frozenset[str],
                       holds: Callable[[str], bool]) -> dict[str, str]:
    """Those of ``not_restored`` still waiting: a VF that holds a type now
    (``typed``: a guest's start wrote it) or that no live assignment holds
    any more (``holds(vf)``) is no longer held back."""
    return {vf: why for vf, why in not_restored.items()
            if vf not in typed and holds(vf)}
