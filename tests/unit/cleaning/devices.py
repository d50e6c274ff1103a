"""The one-time-use devices of the cleaning package's unit tests: a NIC's
two VFs and a whole GPU, each used once, and a build that claims them."""
from __future__ import annotations

import uuid

from compute_agent.claims.choice import Pool, Slot
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.base import DeviceKind

PF = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"
GPU = "7d2b4f6e-1c3a-4e5b-8f9d-0a1b2c3d4e5f"
VF0, VF1 = "0000:81:10.0", "0000:81:10.1"
WHOLE = "0000:af:00.0"
SPEC = {"name": "vm", "vcpus": 1, "memory_mb": 512}
ONE_VF = {PF: {"resources": {"SRIOV_NET_VF": 1}}}
THE_GPU = {GPU: {"resources": {"CUSTOM_GPU": 1}}}


def pools(one_time_use: bool = True) -> dict:
    once = frozenset({VF0, VF1}) if one_time_use else frozenset()
    return {PF: {"SRIOV_NET_VF": Pool("cmp_0000:81:00.0", "SRIOV_NET_VF", DeviceKind.VF, 2,
                                      (Slot(VF0), Slot(VF1)), one_time_use=once)},
            GPU: {"CUSTOM_GPU": Pool("cmp_0000:AF:00.0", "CUSTOM_GPU", DeviceKind.PCI, 1,
                                     (Slot(WHOLE),), one_time_use=frozenset({WHOLE}))}}


def build(t: Tracker, allocations=ONE_VF) -> str:
    instance = str(uuid.uuid4())
    t.claim_build(instance, SPEC, allocations)
    return instance
