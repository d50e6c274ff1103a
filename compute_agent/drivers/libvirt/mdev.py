"""Creating and removing mediated devices through sysfs.

libvirt cannot create a transient mdev on every version we meet (and the
test driver not at all), while the kernel's interface is two files:

    class/mdev_bus/<parent>/mdev_supported_types/<type>/create  <- uuid
    bus/mdev/devices/<uuid>/remove                              <- 1

Under a fake tree (SysfsBuilder) nothing reacts to the writes, so the
written file is what a test observes. We never wait for the device
directory: the kernel creates it within the write, and a fake never does.
"""
from __future__ import annotations

import errno
import os
import uuid as uuid_lib

from compute_agent.drivers.errors import MdevError
from compute_agent.drivers.libvirt.guest_xml import DEFAULT_MDEV_MODEL


class MdevSysfs:
    def __init__(self, sysfs_root: str | os.PathLike) -> None:
        self.root = os.fspath(sysfs_root)

    def exists(self, mdev_uuid: str) -> bool:
        return os.path.exists(self._device_dir(mdev_uuid))

    def create(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        """Create the mdev; nothing to do when it already exists."""
        mdev_uuid = _canonical_uuid(mdev_uuid)
        if self.exists(mdev_uuid):
            return
        type_dir = self._type_dir(parent, type_id)
        if not os.path.isdir(type_dir):
            raise MdevError(f"cannot create mdev {mdev_uuid}: parent "
                            f"{parent} has no mdev type {type_id} "
                            f"({type_dir} is missing)")
        path = os.path.join(type_dir, "create")
        try:
            write_attribute(path, mdev_uuid)
        except OSError as exc:
            # The kernel answers EEXIST when another caller won the race.
            if exc.errno == errno.EEXIST:
                return
            raise MdevError(f"cannot create mdev {mdev_uuid} of type "
                            f"{type_id} on {parent}: writing {path}: "
                            f"{exc.strerror or exc}") from exc

    def remove(self, mdev_uuid: str) -> None:
        """Remove the mdev; nothing to do when it is already gone."""
        mdev_uuid = _canonical_uuid(mdev_uuid)
        if not self.exists(mdev_uuid):
            return
        path = os.path.join(self._device_dir(mdev_uuid), "remove")
        try:
            write_attribute(path, "1")
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return  # removed between our check and the write
            raise MdevError(f"cannot remove mdev {mdev_uuid}: writing "
                            f"{path}: {exc.strerror or exc}") from exc

    def device_api(self, parent: str, type_id: str) -> str:
        """The type's device_api (the hostdev model); vfio-pci when the
        file is missing or unreadable, as for every GPU type."""
        path = os.path.join(self._type_dir(parent, type_id), "device_api")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read().strip() or DEFAULT_MDEV_MODEL
        except OSError:
            return DEFAULT_MDEV_MODEL

    def _device_dir(self, mdev_uuid: str) -> str:
        return os.path.join(self.root, "bus", "mdev", "devices",
                            _canonical_uuid(mdev_uuid))

    def _type_dir(self, parent: str, type_id: str) -> str:
        return os.path.join(self.root, "class", "mdev_bus",
                            _component(parent, "parent"),
                            "mdev_supported_types",
                            _component(type_id, "type"))


def _canonical_uuid(mdev_uuid: str) -> str:
    try:
        return str(uuid_lib.UUID(mdev_uuid))
    except (ValueError, TypeError, AttributeError):
        raise MdevError(f"not an mdev UUID: {mdev_uuid!r}") from None


def _component(name: str, what: str) -> str:
    # Both become one path component under sysfs: refuse anything that
    # would step outside it.
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise MdevError(f"invalid mdev {what} name: {name!r}")
    return name


def write_attribute(path: str, text: str) -> None:
    # "w" creates the file in a fake tree; sysfs attributes already exist.
    with open(path, "w", encoding="ascii") as f:
        f.write(text)
