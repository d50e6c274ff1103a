"""Creating and removing mdevs through sysfs (compute_agent/drivers/libvirt/
mdev.py), by the two files the kernel's mdev interface has
(Documentation/driver-api/vfio-mediated-device.rst): a type's ``create``
takes a UUID, an mdev's ``remove`` takes 1. The fake tree plays the
kernel when asked (answer_mdev_writes)."""
import errno

import pytest

from compute_agent.drivers.base import Mdev
from compute_agent.drivers.errors import MdevError
from compute_agent.drivers.libvirt import mdev
from compute_agent.drivers.libvirt.mdev import MdevSysfs
from tests.unit.drivers.sysfs_hosts import GPU, UUID

NEW = "9d6b8a1c-3f2e-4c5d-8e7f-0a1b2c3d4e5f"


@pytest.fixture
def mdevs(builder) -> MdevSysfs:
    return MdevSysfs(builder.root)


def available(reader, type_id: str) -> int:
    return {t.id: t.available_instances for t in reader.mdev_types()[0][GPU]}[type_id]


def type_file(builder, type_id: str, name: str):
    return builder.device_dir(GPU) / "mdev_supported_types" / type_id / name


def kernel_answers(code: int, words: str):
    """A write_attribute whose write the kernel refuses with ``code``."""
    def write(path: str, text: str) -> None:
        raise OSError(code, words)
    return write


def test_an_mdev_created_is_the_kernels_once_it_answers(builder, reader, mdevs):
    mdevs.create(NEW.upper(), GPU, "nvidia-36")
    # The kernel takes the UUID in canonical form.
    assert type_file(builder, "nvidia-36", "create").read_text() == NEW
    builder.answer_mdev_writes()
    assert mdevs.exists(NEW)
    assert Mdev(NEW, "nvidia-36", GPU) in reader.mdevs()[0]
    assert available(reader, "nvidia-36") == 1


def test_an_mdev_that_exists_is_not_created_again(builder, mdevs):
    mdevs.create(UUID, GPU, "nvidia-35")
    assert not type_file(builder, "nvidia-35", "create").exists()


def test_a_type_the_parent_does_not_offer_is_refused_naming_both(builder, mdevs):
    with pytest.raises(MdevError, match=f"cannot create mdev {NEW}: parent {GPU} has "
                                        "no mdev type nvidia-99 .* is missing"):
        mdevs.create(NEW, GPU, "nvidia-99")
    assert not mdevs.exists(NEW)


def test_an_mdev_another_caller_created_first_is_created(builder, reader, mdevs,
                                                         monkeypatch):
    def created_meanwhile(path: str, text: str) -> None:
        builder.add_mdev(NEW, GPU, "nvidia-36")  # the other caller's write
        raise OSError(errno.EEXIST, "File exists")  # and the kernel's answer to ours
    monkeypatch.setattr(mdev, "write_attribute", created_meanwhile)
    mdevs.create(NEW, GPU, "nvidia-36")
    assert reader.mdevs()[0].count(Mdev(NEW, "nvidia-36", GPU)) == 1


def test_a_create_the_kernel_refuses_names_the_file_and_its_answer(mdevs, monkeypatch):
    monkeypatch.setattr(mdev, "write_attribute", kernel_answers(errno.EUSERS, "Too many users"))
    with pytest.raises(MdevError, match=f"cannot create mdev {NEW} of type nvidia-36 on {GPU}: "
                                        "writing .*/nvidia-36/create: Too many users"):
        mdevs.create(NEW, GPU, "nvidia-36")


def test_an_mdev_removed_is_gone_once_the_kernel_answers(builder, reader, mdevs):
    mdevs.remove(UUID.upper())
    assert (builder.device_dir(GPU) / UUID / "remove").read_text() == "1"
    builder.answer_mdev_writes()
    assert not mdevs.exists(UUID)
    assert reader.mdevs() == ([], [])
    assert available(reader, "nvidia-35") == 4


def test_an_mdev_that_is_not_there_is_not_removed(builder, mdevs):
    mdevs.remove(NEW)
    assert not (builder.root / "bus" / "mdev" / "devices" / NEW).exists()


def test_an_mdev_gone_between_the_check_and_the_write_is_removed(builder, reader, mdevs,
                                                                monkeypatch):
    def removed_meanwhile(path: str, text: str) -> None:
        builder.remove_mdev(UUID)
        raise OSError(errno.ENOENT, "No such file or directory")
    monkeypatch.setattr(mdev, "write_attribute", removed_meanwhile)
    mdevs.remove(UUID)
    assert reader.mdevs() == ([], [])


def test_a_remove_the_kernel_refuses_names_the_file_and_its_answer(mdevs, monkeypatch):
    # An mdev a guest still holds.
    monkeypatch.setattr(mdev, "write_attribute",
                        kernel_answers(errno.EBUSY, "Device or resource busy"))
    with pytest.raises(MdevError, match=f"cannot remove mdev {UUID}: writing "
                                        f".*/{UUID}/remove: Device or resource busy"):
        mdevs.remove(UUID)


def test_device_api_is_the_types_own(builder, mdevs):
    assert mdevs.device_api(GPU, "nvidia-35") == "vfio-pci"
    type_file(builder, "nvidia-36", "device_api").write_text("vfio-ccw\n")
    assert mdevs.device_api(GPU, "nvidia-36") == "vfio-ccw"


@pytest.mark.parametrize("content", [None, "\n"])
def test_device_api_missing_or_empty_is_vfio_pci(builder, mdevs, content):
    path = type_file(builder, "nvidia-36", "device_api")
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    assert mdevs.device_api(GPU, "nvidia-36") == "vfio-pci"


@pytest.mark.parametrize("call,message", [
    (lambda m: m.create("not-a-uuid", GPU, "nvidia-35"), "not an mdev UUID: 'not-a-uuid'"),
    (lambda m: m.remove(""), "not an mdev UUID: ''"),
    (lambda m: m.exists(None), "not an mdev UUID: None"),
    (lambda m: m.create(NEW, "../../..", "nvidia-35"), "invalid mdev parent name: '../../..'"),
    (lambda m: m.create(NEW, GPU, ".."), "invalid mdev type name: '..'"),
    (lambda m: m.create(NEW, GPU, ""), "invalid mdev type name: ''"),
    (lambda m: m.device_api(GPU, "nvidia-35/../../x"), "invalid mdev type name"),
])
def test_names_that_would_step_outside_sysfs_are_refused(mdevs, call, message):
    with pytest.raises(MdevError, match=message.replace(".", r"\.")):
        call(mdevs)
