"""NVIDIA's vendor-specific VFIO layout: what the fake sysfs lists as the
NVIDIA driver does (its vGPU user guide), and the writer of
current_vgpu_type through the sysfs root the driver reads."""
from __future__ import annotations

import errno

import pytest

from compute_agent.drivers.errors import MdevError
from compute_agent.drivers.fake_sysfs import SysfsBuilder, VgpuCard, vgpu_framebuffer_gb
from compute_agent.drivers.libvirt import vendor_vfio
from compute_agent.drivers.libvirt.sysfs import SysfsReader, nvidia_type_number
from compute_agent.drivers.libvirt.vendor_vfio import VgpuTypeWriter
from tests.unit.drivers.sysfs_hosts import L40

PF = "0000:41:00.0"


def card(tmp_path, equal_size: bool):
    b = SysfsBuilder(tmp_path / "sys")
    vfs = b.add_nvidia_vf_layout(PF, "26b5", 0,
                                 VgpuCard(L40, equal_size=equal_size, framebuffer_gb=48))
    return b, SysfsReader(str(b.root)), vfs


def lists(reader: SysfsReader, vfs: list[str]) -> list[list[int]]:
    return [sorted(reader.creatable_vgpu_types(vf)) for vf in vfs]


def test_an_equal_size_card_lists_one_size_once_a_vf_has_a_type(tmp_path):
    b, reader, vfs = card(tmp_path, equal_size=True)
    assert lists(reader, vfs) == [[557, 558, 560]] * 4
    b.set_current_vgpu_type(vfs[0], 558)
    # The VF with a type lists nothing; the others the 24 GB type, while
    # the framebuffer has room for one more.
    assert lists(reader, vfs) == [[], [558], [558], [558]]
    b.set_current_vgpu_type(vfs[1], 558)
    assert lists(reader, vfs) == [[], [], [], []]
    with pytest.raises(MdevError, match="not creatable now"):
        b.set_current_vgpu_type(vfs[2], 557)
    b.set_current_vgpu_type(vfs[0], 0)
    b.set_current_vgpu_type(vfs[1], 0)
    assert lists(reader, vfs) == [[557, 558, 560]] * 4


def test_a_mixed_size_card_lists_what_still_fits(tmp_path):
    b, reader, vfs = card(tmp_path, equal_size=False)
    b.set_current_vgpu_type(vfs[0], 558)
    assert lists(reader, vfs) == [[], [557, 558], [557, 558], [557, 558]]
    b.set_current_vgpu_type(vfs[1], 557)
    assert lists(reader, vfs) == [[], [], [557], [557]]
    # A VF takes one type at a time.
    with pytest.raises(MdevError):
        b.set_current_vgpu_type(vfs[1], 558)


def test_a_reboot_forgets_every_type_and_recreated_vfs_list_again(tmp_path):
    b, reader, vfs = card(tmp_path, equal_size=True)
    b.set_current_vgpu_type(vfs[0], 557)
    b.forget_vgpu_types()
    assert [reader.current_vgpu_type(vf) for vf in vfs] == [0] * 4
    b.set_num_vfs(PF, 0)
    b.set_num_vfs(PF, 2)
    assert lists(reader, vfs[:2]) == [[557, 558, 560]] * 2


def test_the_writer_gives_a_type_once_and_the_driver_answers(tmp_path):
    b, reader, vfs = card(tmp_path, equal_size=True)
    writer = VgpuTypeWriter(reader)
    assert writer.set(vfs[0], "nvidia-557") is True
    assert reader.current_vgpu_type(vfs[0]) == 557
    b.answer_vgpu_type_writes()
    assert lists(reader, vfs) == [[], [557], [557], [557]]
    assert writer.set(vfs[0], "nvidia-557") is False  # has it: nothing written
    assert writer.clear(vfs[0], "nvidia-558") is False  # not the one given
    assert writer.clear(vfs[0], "nvidia-557") is True
    b.answer_vgpu_type_writes()
    assert reader.current_vgpu_type(vfs[0]) == 0
    assert writer.clear(vfs[0], "nvidia-557") is False


def test_the_writer_refuses_before_writing_what_the_vf_cannot_take(tmp_path):
    b, reader, vfs = card(tmp_path, equal_size=True)
    b.set_current_vgpu_type(vfs[0], 557)
    writer = VgpuTypeWriter(reader)
    with pytest.raises(MdevError, match=r"cannot create vGPU type 558 now; its "
                                        r"creatable_vgpu_types lists \[557\]"):
        writer.set(vfs[1], "nvidia-558")
    with pytest.raises(MdevError, match="has vGPU type 557, not 558"):
        writer.set(vfs[0], "nvidia-558")
    with pytest.raises(MdevError, match="not an NVIDIA type id"):
        writer.set(vfs[1], "nvidia-35a")
    assert [reader.current_vgpu_type(vf) for vf in vfs] == [557, 0, 0, 0]


def test_a_write_the_driver_fails_is_an_mdev_error_naming_the_file(tmp_path, monkeypatch):
    _, reader, vfs = card(tmp_path, equal_size=True)

    def busy(path, text):
        raise OSError(errno.EBUSY, "Device or resource busy")
    monkeypatch.setattr(vendor_vfio, "write_attribute", busy)
    with pytest.raises(MdevError, match=f"{vfs[0]}: writing 557 to .*/{vfs[0]}/nvidia/"
                                        "current_vgpu_type: Device or resource busy"):
        VgpuTypeWriter(reader).set(vfs[0], "nvidia-557")


def test_type_ids_and_sizes():
    assert nvidia_type_number("nvidia-557") == 557
    assert [nvidia_type_number(t) for t in ("nvidia-0557", "i915-GVTg_V5_4", "nvidia-")] == [
        None, None, None]
    assert vgpu_framebuffer_gb("NVIDIA L40S-48Q") == 48
