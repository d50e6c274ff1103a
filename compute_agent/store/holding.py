"""The guard of every group commit of the agent that holds the state
directory (``Holding``): before a commit's jobs are answered, the store
must still be the file at its path, and the commit's sequence is on disk
in the host's record (compute_agent/store/sequence.py)."""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from compute_agent.store.errors import StoreMoved
from compute_agent.store.schema import COMMIT_SEQUENCE
from compute_agent.store.sequence import SequenceRecord

LOG = logging.getLogger(__name__)


class Holding:
    """The CommitGuard (compute_agent/store/writer.py) of the agent that holds the
    state directory. Before a group commit's jobs are answered: the store
    is still the file at its path, and the commit's sequence is recorded.
    Once the file is found gone, every later write is refused too, and
    ``on_moved`` learns it (the daemon then stops)."""

    def __init__(self, path: Path, identity: tuple[int, int], sequence: int,
                 record: SequenceRecord):
        self.path = path
        self._identity = identity  # (device, inode) of the file opened
        self.sequence = sequence
        self._record = record
        self.moved: StoreMoved | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()

    def on_moved(self, listener: Callable[[str], None]) -> None:
        """Call ``listener`` with the one line once the store is found
        moved (at once, when it already was)."""
        with self._lock:
            self._listeners.append(listener)
            moved = self.moved
        if moved is not None:
            listener(str(moved))

    def check(self) -> None:
        if self.moved is None:
            found = still_at_path(self.path, self._identity)
            if found:
                self._found_moved(found)
        if self.moved is not None:
            raise self.moved

    def in_transaction(self, conn: sqlite3.Connection) -> None:
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                     (COMMIT_SEQUENCE, str(self.sequence + 1)))

    def committed(self) -> None:
        self.sequence += 1
        # The file checked again: it may have gone during the transaction,
        # whose rows are then in a file no longer named.
        self.check()
        try:
            self._record.record(self.sequence)
        except OSError as e:
            # The commit is in the store: it is acknowledged. A record left
            # behind the store is never a refusal, only a weaker check.
            LOG.warning("Commit %d of store %s not recorded in %s: %s", self.sequence,
                        self.path, self._record.path, e.strerror)

    def _found_moved(self, why: str) -> None:
        with self._lock:
            self.moved = StoreMoved(f"store {self.path} {why} while the agent ran: "
                                    "nothing more is written or acknowledged; the "
                                    "agent stops")
            listeners = list(self._listeners)
        LOG.error("%s", self.moved)
        for listener in listeners:
            listener(str(self.moved))

    def close(self) -> None:
        self._record.close()


def still_at_path(path: Path, identity: tuple[int, int]) -> str:
    """What happened to the file, or "" when ``path`` still names the file
    whose (device, inode) is ``identity``."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "was removed"
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    if (info.st_dev, info.st_ino) != identity:
        return "was replaced by another file"
    return ""

