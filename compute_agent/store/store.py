"""The durable local store: instances, device assignments and migrations.

SQLite in WAL mode with ``synchronous=FULL``: a write returns only once it
is on disk. Writes go through one writer thread that group-commits them
(compute_agent/store/writer.py), so 32 claimers share one fsync instead of queueing
for 32.

The database itself refuses a device held by two live assignments (a
partial unique index), whatever the code above it does.

The agent that holds the state directory guards every group commit
(compute_agent/store/holding.py).
"""
from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from compute_agent.claims.model import Assignment
from compute_agent.store.connection import (
    connect,
    create_private,
    damaged,
    named_error,
    unreadable_error,
    wal_path,
)
from compute_agent.store.errors import StoreError
from compute_agent.store.holding import Holding
from compute_agent.store.queries import insert_assignments_sql, put_instance_sql
from compute_agent.store.schema import (
    COMMIT_SEQUENCE,
    HOST,
    IN_USE,
    ROOT_UUID,
    SCHEMA_VERSION,
    check_version,
    migrate,
    migrated_copy,
    stored_sequence,
)
from compute_agent.store.sequence import SequenceRecord, record_path
from compute_agent.store.writer import Decision, GroupCommitter, Job, Statement

T = TypeVar("T")

# The store's file in the state directory ([DEFAULT] state_path).
STORE_FILE = "state.db"


class Store:
    def __init__(self, path: str | Path, root_uuid: str | None = None,
                 read_only: bool = False, host: str | None = None):
        """Open (creating if need be) the store at ``path``. The agent that
        holds the state directory passes ``root_uuid``: the store then
        records it, and ``host`` (the host name the start found the state
        directory belongs to; None: not known yet), marks itself in use
        until ``close`` (inspect_store reads them at the next start) and
        guards every commit (``Holding``). Any other process opens it ``read_only``: it
        creates, migrates and writes nothing; a store of an older schema
        (upgrade-check's, before the new agent's start) is then read through
        a copy in memory migrated to this version's."""
        self.path = Path(path)
        self._holder = root_uuid is not None
        self._read_only = read_only
        self._closed = False
        self.holding: Holding | None = None
        # Held open while the store is: its (device, inode) is the file
        # the connections write. Closed last (closing any descriptor of the
        # file drops SQLite's locks on it).
        self._fd: int | None = None
        self._migrated_copy: sqlite3.Connection | None = None
        try:
            if not read_only:
                create_private(self.path)
            if self._holder:
                self._fd = os.open(self.path, os.O_RDONLY)
            self._writer = connect(self.path, read_only)
        except sqlite3.Error as e:
            self._close_fd()
            # inspect_store read it whole: what fails here is the file
            # system (SQLite cannot make its log on a full disk, say).
            raise (named_error(self.path, e) if damaged(e)
                   else unreadable_error(self.path, e, "opened")) from None
        except OSError as e:
            self._close_fd()
            raise StoreError(f"store {self.path}: {e.strerror}") from None
        try:
            if read_only:
                if check_version(self._writer) < SCHEMA_VERSION:
                    self._migrated_copy = migrated_copy(self._writer)
            else:
                migrate(self._writer)
            if root_uuid is not None:  # self._holder
                self.holding = self._mark_in_use(root_uuid, host)
        except sqlite3.Error as e:
            self._writer.close()
            self._close_fd()
            raise named_error(self.path, e) from None
        except (StoreError, OSError, ValueError) as e:
            self._writer.close()
            self._close_fd()
            raise StoreError(f"store {self.path}: {e}") from None
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._commits = GroupCommitter(self._writer, f"store {self.path}", self.holding)
        if read_only:
            self._commits.close()  # every write is refused, naming the store

    def _mark_in_use(self, root_uuid: str, host: str | None) -> Holding:
        """Record the root and the host name (first time only) and that the store is open,
        then checkpoint: the mark must be in the database file itself, so
        that a write-ahead log lost later is seen as lost. The host's
        record of the commit sequence is made to hold the store's before
        the store holds one: a crash in between leaves a store from before
        the sequence with a record of 0, which the next start accepts."""
        conn = self._writer
        conn.execute("BEGIN IMMEDIATE")
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            sequence = stored_sequence(meta) or 0
            record = SequenceRecord(record_path(self.path), sequence)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (ROOT_UUID, root_uuid))
        if host is not None:
            conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (HOST, host))
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'open')", (IN_USE,))
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                     (COMMIT_SEQUENCE, str(sequence)))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert self._fd is not None  # a holder's store holds its file open
        info = os.fstat(self._fd)
        return Holding(self.path, (info.st_dev, info.st_ino), sequence, record)

    @property
    def read_only(self) -> bool:
        return self._read_only

    def on_moved(self, listener: Callable[[str], None]) -> None:
        """``listener`` gets the one line if the store is found removed or
        replaced under the agent (holder only)."""
        if self.holding is not None:
            self.holding.on_moved(listener)

    def check_file(self) -> None:
        """Raise StoreMoved if the store is no longer the file at its path
        (holder only; each commit checks it too)."""
        if self.holding is not None:
            self.holding.check()

    # --- writing --------------------------------------------------------

    def submit(self, work: Callable[[sqlite3.Connection], T] | list[Statement]) -> Job:
        """Queue ``work`` (a function of the connection, or statements) to
        run in a transaction. ``wait()`` on the job returns once it is on
        disk. A job that fails is rolled back alone, and its ``wait()``
        raises the error."""
        return self._commits.submit(Job(work))

    def submit_decision(self, key: str, decide: Callable[[], Decision]) -> Job:
        """Queue ``decide`` to run in the writer thread, at most one per
        ``key`` per transaction; ``wait()`` returns its result once its
        write is on disk (group_commit explains why it runs there)."""
        return self._commits.submit(Job(decide=decide, key=key))

    def write(self, work: Callable[[sqlite3.Connection], T] | list[Statement]) -> T:
        """Submit ``work`` and wait until it is on disk."""
        return self.submit(work).wait()

    # --- reading --------------------------------------------------------

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on a consistent snapshot, from this thread's own
        connection (WAL lets readers run beside the writer), or from the
        migrated copy of an older store, one reader at a time."""
        if self._migrated_copy is not None:
            with self._readers_lock:
                return self._read_on(self._migrated_copy, fn)
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = connect(self.path, self._read_only)
            except sqlite3.Error as e:
                raise named_error(self.path, e) from None
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return self._read_on(conn, fn)

    def _read_on(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as e:
            raise named_error(self.path, e) from None

    def dump(self) -> str:
        """Every row, sorted: two stores with the same rows dump alike."""
        return self.read(lambda c: "\n".join(sorted(c.iterdump())))

    def close(self) -> None:
        """Finish what was queued, then refuse further writes. Closing
        again does nothing."""
        self._commits.close()
        try:
            if self.holding is not None and self.holding.moved is None and not self._closed:
                self._writer.execute("INSERT OR REPLACE INTO meta VALUES (?, 'closed')",
                                     (IN_USE,))
        except sqlite3.Error as e:
            raise named_error(self.path, e) from None
        finally:
            self._close_connections()

    def _close_connections(self) -> None:
        self._closed = True
        self._writer.close()
        if self._migrated_copy is not None:
            self._migrated_copy.close()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
        if self.holding is not None:
            self.holding.close()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def create_filled(path: Path, root_uuid: str, instances: dict[str, dict],
                  rows: list[Assignment]) -> None:
    """Create the store at ``path`` holding these instances and their
    assignments (a rebuild's, an adoption's), whole or not at all: written
    in one transaction to a file beside it, closed, then renamed into
    place. A crash never leaves a store that looks new but lacks them."""
    temporary = path.with_name(path.name + ".new")
    for leftover in (temporary, wal_path(temporary), Path(f"{temporary}-shm")):
        leftover.unlink(missing_ok=True)  # an earlier attempt's, never served
    store = Store(temporary, root_uuid)
    try:
        store.write([put_instance_sql(u, spec) for u, spec in sorted(instances.items())]
                    + [insert_assignments_sql(rows)])
    finally:
        store.close()
    os.rename(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself on disk
    finally:
        os.close(directory)
