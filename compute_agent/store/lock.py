"""The state directory belongs to one agent at a time.

Every process that writes the state directory (the daemon, ``--once``,
``compute-agent-manage rebuild-store``) holds an exclusive ``flock`` on
``<state_path>/lock`` from before it reads anything there until it exits.
Two daemons on one directory would each hand out the same devices. The
kernel drops the lock when the process dies, however it dies, so a stale
lock file never blocks a restart. Readers (audit, tree) take no lock:
SQLite lets them read beside the writer.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from compute_agent.store.errors import StateDirectoryInUse, StateDirectoryUnusable

FILENAME = "lock"


class StateLock:
    """Held from ``acquire`` until ``release`` or the process's end."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd = fd

    def release(self) -> None:
        os.close(self._fd)  # closing the last descriptor drops the flock


def acquire(state_path: str) -> StateLock:
    """Take the lock without waiting, and record our pid in the file for
    whoever finds it taken. Raises StateDirectoryInUse naming the
    directory and the holder's pid."""
    directory = Path(state_path)
    path = directory / FILENAME
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Not inherited by child processes (Python's default), so a helper
        # we start cannot keep the lock after we are gone.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise StateDirectoryUnusable(f"cannot lock state directory {directory}: "
                                     f"{e.filename}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _recorded_pid(fd)
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise StateDirectoryUnusable(f"cannot lock state directory {directory}: "
                                         f"{path}: {e.strerror}") from None
        raise StateDirectoryInUse(
            f"state directory {directory} is in use by another agent"
            f"{f' (pid {holder})' if holder else ''}: it holds {path}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateLock(path, fd)


def _recorded_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None
