"""Giving a VF of NVIDIA's vendor-specific VFIO layout its vGPU type
through sysfs (NVIDIA's vGPU user guide, vGPU 17 and later):

    bus/pci/devices/<vf>/nvidia/creatable_vgpu_types  -> what it can take now
    bus/pci/devices/<vf>/nvidia/current_vgpu_type     <- the type's id, 0

The VF then goes to the guest as a PCI hostdev. What a VF can take depends
on what its siblings took (an equal-size card takes one framebuffer size),
so the list is read again before every write, never remembered. Under a
fake tree (SysfsBuilder) nothing reacts to the write: the written file is
what a test observes, and SysfsBuilder.answer_vgpu_type_writes plays the
driver's part.
"""
from __future__ import annotations

import os

from compute_agent.drivers.errors import InvalidHostData, MdevError
from compute_agent.drivers.libvirt.mdev import write_attribute
from compute_agent.drivers.libvirt.sysfs import MdevReader, nvidia_type_number


class VgpuTypeWriter:
    def __init__(self, sysfs: MdevReader) -> None:
        self._sysfs = sysfs

    def set(self, vf: str, type_id: str) -> bool:
        """Give the VF the type; False when it had it already (nothing
        written). MdevError, nothing written, when the VF does not list
        the type as creatable now or has another; MdevError naming the
        file when the driver refuses the write."""
        number = nvidia_type_number(type_id)
        if number is None:
            raise MdevError(f"{vf}: vGPU type {type_id!r} is not an NVIDIA "
                            "type id (nvidia-<number>)")
        try:
            current = self._sysfs.current_vgpu_type(vf)
            if current == number:
                return False
            if current:
                raise MdevError(f"{vf}: has vGPU type {current}, not {number}; "
                                "a VF takes one type at a time")
            creatable = self._sysfs.creatable_vgpu_types(vf)
        except InvalidHostData as exc:
            raise MdevError(f"{vf}: cannot give it vGPU type {number}: {exc}") from None
        if number not in creatable:
            raise MdevError(f"{vf}: cannot create vGPU type {number} now; its "
                            f"creatable_vgpu_types lists {sorted(creatable) or 'none'}")
        self._write(vf, number)
        return True

    def clear(self, vf: str, type_id: str) -> bool:
        """Remove the VF's type when it is ``type_id``; False when it has
        none or another (or the VF is gone): nothing written."""
        if not self._sysfs.vendor_vfio(vf):
            return False
        try:
            current = self._sysfs.current_vgpu_type(vf)
        except InvalidHostData as exc:
            raise MdevError(f"{vf}: cannot remove its vGPU type: {exc}") from None
        if not current or current != nvidia_type_number(type_id):
            return False
        self._write(vf, 0)
        return True

    def _write(self, vf: str, number: int) -> None:
        path = os.path.join(self._sysfs.nvidia_dir(vf), "current_vgpu_type")
        try:
            write_attribute(path, f"{number}\n")
        except OSError as exc:
            raise MdevError(f"{vf}: writing {number} to {path}: "
                            f"{exc.strerror or exc}") from exc
