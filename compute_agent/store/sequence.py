"""The host's record of the store's commit sequence, which a lost
write-ahead log cannot take back.

Every group commit of the agent that holds the state directory raises the
sequence in the store's ``meta`` table (key ``commit_sequence``), in the
same transaction as the jobs it commits; once SQLite has committed it, and
before any of its jobs is answered, the new number is written here and
synced. At start, a store whose sequence is behind this record has lost
writes the agent acknowledged: its write-ahead log was emptied or rolled
back after a crash, or an older copy of ``state.db`` was put back
(compute_agent/store/check.py refuses it).

Where: ``<state_path>/store_sequence``, beside ``compute_id``. Outside the
store and its write-ahead log, so that nothing that happens to those
takes it back; and not named ``state.db*``, so that a store copied back
with its ``-wal`` and ``-shm`` files does not bring back the record of its
own time too. A whole state directory restored from a backup takes it
back with the store: that case is not told apart.

Cost: one ``fdatasync`` per group commit. The file is written whole once
(compute_agent/store/atomic_file.py) and then overwritten in place, so its size and
blocks never change and a data sync suffices. It holds two slots, each in
a sector of its own, written in turn: a write torn by a power loss spoils
one slot, and the other still holds the number before, which is behind
the store and so never refuses a sound store.
"""
from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

from compute_agent.store.atomic_file import write_private
from compute_agent.store.errors import StoreError

FILENAME = "store_sequence"
SLOT_BYTES = 512
_SLOT = re.compile(r"compute-agent store commit sequence (\d+) crc ([0-9a-f]{8})\n")


def record_path(store_path: Path) -> Path:
    """The record of the store at ``store_path``: in its directory."""
    return store_path.parent / FILENAME


def _slot(sequence: int) -> bytes:
    text = f"compute-agent store commit sequence {sequence}"
    line = f"{text} crc {zlib.crc32(text.encode()):08x}\n".encode()
    return line.ljust(SLOT_BYTES, b" ")


def _parse_slot(raw: bytes) -> int | None:
    """The sequence a slot holds; None when it is torn or garbled."""
    match = _SLOT.match(raw.decode("ascii", errors="replace"))
    if match is None:
        return None
    text = f"compute-agent store commit sequence {match[1]}"
    return int(match[1]) if f"{zlib.crc32(text.encode()):08x}" == match[2] else None


def read_recorded(path: Path) -> int | None:
    """The highest sequence the record at ``path`` holds; None when there
    is no record, or none of its slots can be read (both: unknown)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(f"{path}: cannot be read: {e.strerror}") from None
    found = [s for s in (_parse_slot(raw[i:i + SLOT_BYTES])
                         for i in range(0, 2 * SLOT_BYTES, SLOT_BYTES)) if s is not None]
    return max(found) if found else None


def write_recorded(path: Path, sequence: int) -> None:
    """Replace the record whole, both slots holding ``sequence`` (at the
    store's opening, and when an operator accepts a store)."""
    write_private(path, (_slot(sequence) * 2).decode())


class SequenceRecord:
    """The record kept open by the store's holder, written at each group
    commit."""

    def __init__(self, path: Path, sequence: int):
        """Make the record hold ``sequence`` (written whole), then keep it
        open for ``record``."""
        self.path = path
        write_recorded(path, sequence)
        self._fd: int | None = os.open(path, os.O_RDWR)
        self._next_slot = 0

    def record(self, sequence: int) -> None:
        """``sequence`` on disk in the slot not written last."""
        fd = self._fd
        if fd is None:
            raise ValueError(f"{self.path}: recorded after close")
        os.pwrite(fd, _slot(sequence), self._next_slot * SLOT_BYTES)
        os.fdatasync(fd)
        self._next_slot ^= 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
