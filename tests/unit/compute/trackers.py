"""Trackers and managers on stores of their own, a tracker's view of the
claims alone, and the hosts they hold, for the unit tests of the compute
package and of what the tracker keeps (the cleaning package)."""
from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compute_agent.claims.choice import Pool, Slot
from compute_agent.claims.model import Assignment, RequestDigest
from compute_agent.compute.claims_view import Applied, Change, ClaimsView, InstanceRecord
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.base import DeviceKind
from compute_agent.drivers.fake import FakeDriver
from compute_agent.store.store import Store

SPEC = {"name": "vm", "vcpus": 1, "memory_mb": 512}

# A NIC's PF with two VFs on NUMA node 0, one provider for their class.
PF = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"
VF0, VF1 = "0000:81:10.0", "0000:81:10.1"
ONE_VF = {PF: {"resources": {"SRIOV_NET_VF": 1}}}
TWO_VFS = {PF: {"resources": {"SRIOV_NET_VF": 2}}}


def vf_pools() -> dict[str, dict[str, Pool]]:
    return {PF: {"SRIOV_NET_VF": Pool(
        "cmp_0000:81:00.0", "SRIOV_NET_VF", DeviceKind.VF, 2,
        (Slot(VF0, numa_node=0), Slot(VF1, numa_node=0)), 0)}}


# Two VFs of an NVIDIA GPU in its vendor-specific VFIO layout (each takes
# one vGPU type whole, written to nvidia/current_vgpu_type), a provider
# each, as the fake driver describes such a host.
VGPU_VF0, VGPU_VF1 = "0000:41:10.0", "0000:41:10.1"
VGPU_PROVIDERS = {VGPU_VF0: "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c40",
                  VGPU_VF1: "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c41"}
VGPU_HOST = {"numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 8192}],
             "gpus": [{"address": vf, "numa_node": 0, "vendor_vfio": True,
                       "mdev_types": {"nvidia-557": {"available_instances": 1},
                                      "nvidia-558": {"available_instances": 1}}}
                      for vf in (VGPU_VF0, VGPU_VF1)]}


def vgpu_pools() -> dict[str, dict[str, Pool]]:
    """Each VF a provider of one VGPU of type nvidia-557."""
    return {VGPU_PROVIDERS[vf]: {"VGPU": Pool(f"gpu_{vf}", "VGPU", DeviceKind.VGPU_VF, 1,
                                              (Slot(vf, 0),), 0, mdev_type="nvidia-557")}
            for vf in (VGPU_VF0, VGPU_VF1)}


def on_vgpu_vf(vf: str) -> dict:
    """The allocations of one vGPU on ``vf``."""
    return {VGPU_PROVIDERS[vf]: {"resources": {"VGPU": 1}}}


# What a build of one VF asks, as its record keeps it.
BUILT = RequestDigest.of(spec=SPEC, allocations=ONE_VF)


def view(one_time_use: bool = False) -> ClaimsView:
    """A tracker's view of the NIC's VFs (one-time-use ones, or not),
    holding nothing."""
    v = ClaimsView("boot-1")
    v.pools = vf_pools()
    if one_time_use:
        pool = v.pools[PF]["SRIOV_NET_VF"]
        v.pools[PF]["SRIOV_NET_VF"] = dataclasses.replace(
            pool, one_time_use=frozenset({VF0, VF1}))
    return v


def build(v: ClaimsView, instance: str) -> tuple[list[Assignment], Applied]:
    """A build's claim of one VF, applied to ``v`` as the tracker's
    claim_build decides it."""
    rows = v.choose_rows(instance, ONE_VF, instance, None)
    return rows, v.apply(Change(claimed=tuple(rows),
                                recorded=InstanceRecord(instance, SPEC, BUILT)))


def new_uuids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


@contextmanager
def tracker_on(directory: Path, pools: dict, boot_id: str = "boot-1") -> Iterator[Tracker]:
    """A tracker holding ``pools``, on a store in ``directory``, closed after."""
    store = Store(directory / "state.db")
    tracker = Tracker(store, boot_id)
    tracker.set_pools(pools)
    try:
        yield tracker
    finally:
        store.close()


@contextmanager
def manager_on(directory: Path, pools: dict, driver: FakeDriver | None = None
               ) -> Iterator[ComputeManager]:
    """A manager on ``driver`` (a fake host of its own by default), its
    tracker on the driver's boot and holding ``pools``. Its store is closed
    after, and so is the one of a tracker a test gave it since (a restart)."""
    driver = driver or FakeDriver()
    with tracker_on(directory, pools, driver.boot_id()) as tracker:
        manager = ComputeManager(tracker, driver)
        yield manager
    manager.tracker.store.close()
