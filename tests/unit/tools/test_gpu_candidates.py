"""The GPU benchmark asks for the same GPUs in every shape: what a VM with
N GPUs would be given is N units, whatever the providers."""
from __future__ import annotations

import re

import pytest

from tools.benchmarks.gpu_candidates import (
    CARDS,
    GPUS_PER_VM,
    VFS_PER_CARD,
    WHOLE_GPUS,
    Shape,
    children,
    request_groups,
)


def units_asked(query: dict[str, str]) -> int:
    return sum(int(amount) for key, value in query.items() if re.fullmatch(r"resources\d+", key)
               for amount in re.findall(r":(\d+)", value))


@pytest.mark.parametrize("shape", list(Shape))
@pytest.mark.parametrize("gpus", GPUS_PER_VM)
def test_a_vm_asks_for_its_gpus_in_every_shape(shape, gpus):
    query = request_groups(shape, gpus)
    assert units_asked(query) == gpus
    # Several groups may not share a provider.
    groups = sum(1 for key in query if re.fullmatch(r"resources\d+", key))
    assert ("group_policy" in query) == (groups > 1)


@pytest.mark.parametrize("shape", list(Shape))
def test_every_shape_holds_the_same_devices(shape):
    total = sum(child.units for child in children(shape))
    vgpu = shape in (Shape.VGPU_PER_VF, Shape.VGPU_PER_CARD)
    assert total == (CARDS * VFS_PER_CARD if vgpu else WHOLE_GPUS)


def test_one_unit_providers_need_a_group_a_device():
    assert len([k for k in request_groups(Shape.VGPU_PER_VF, 8) if k.startswith("resources")
                and k != "resources"]) == 8
    assert len([k for k in request_groups(Shape.VGPU_PER_CARD, 8) if k.startswith("resources")
                and k != "resources"]) == 1
