"""The durable local store: instances, device assignments and migrations.

SQLite in WAL mode with ``synchronous=FULL``: a write returns only once it
is on disk. Writes go through one writer thread that group-commits them
(compute_agent/store/writer.py), so 32 claimers share one fsync instead of queueing
for 32.

The database itself refuses a device held by two live assignments (a
partial unique index), whatever the code above it does.

The agent that holds the state directory guards every group commit
(``Holding``): before its jobs are answered, the store must still be the
file at its path (not removed or replaced under the running agent), and
the commit's sequence is on disk in the host's record
(compute_agent/store/sequence.py), which the next start compares with the store.
"""
from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    DeviceUse,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    RequestDigest,
    UseState,
)
from compute_agent.drivers.base import DeviceDetail, DeviceKind
from compute_agent.store import sequence as sequence_record
from compute_agent.store.check import StoreFacts, StoreFile, one_line
from compute_agent.store.errors import StoreError, StoreMoved

# Decision and run_statements belong to the store's API too.
from compute_agent.store.writer import Decision, GroupCommitter, Job, Statement, run_statements  # noqa: F401
from compute_agent.tree.provider_tree import Provider

T = TypeVar("T")

# The store's file in the state directory ([DEFAULT] state_path).
STORE_FILE = "state.db"
LOG = logging.getLogger(__name__)

SCHEMA_VERSION = 7

_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE instances (
    uuid TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE migrations (
    uuid TEXT PRIMARY KEY,
    instance_uuid TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('resize', 'live_migration', 'evacuation')),
    role TEXT NOT NULL CHECK (role IN ('source', 'destination', 'both')),
    state TEXT NOT NULL CHECK (state IN ('active', 'finished', 'confirmed', 'reverted')),
    old_spec TEXT,
    updated_at REAL NOT NULL
);
CREATE TABLE assignments (
    id TEXT PRIMARY KEY,
    consumer_uuid TEXT NOT NULL,
    instance_uuid TEXT NOT NULL,
    owner TEXT NOT NULL CHECK (owner IN ('instance', 'migration')),
    migration_uuid TEXT,
    resource_class TEXT NOT NULL,
    provider_uuid TEXT NOT NULL,
    kind TEXT NOT NULL,
    device_id TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0),
    detail TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('claiming', 'claimed', 'released')),
    boot_id TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX assignments_one_live_holder
    ON assignments (provider_uuid, resource_class, device_id)
    WHERE state != 'released' AND kind != 'numa';
CREATE INDEX assignments_live_by_instance
    ON assignments (instance_uuid) WHERE state != 'released';
"""

# v2: the provider names and UUIDs last seen in Placement, so that claims
# still resolve providers when Placement cannot be reached at start-up.
_V2 = """
CREATE TABLE providers (name TEXT PRIMARY KEY, uuid TEXT NOT NULL);
"""

# v3: the whole of Placement's view of our tree as last synced, generations
# included, so that a restart reads again only the providers whose
# generation moved meanwhile. It holds the names v2 kept.
_V3 = """
CREATE TABLE placement_view (
    uuid TEXT PRIMARY KEY,
    parent_uuid TEXT,
    name TEXT NOT NULL,
    generation INTEGER,
    inventories TEXT NOT NULL,
    traits TEXT NOT NULL,
    aggregates TEXT
);
INSERT INTO placement_view SELECT uuid, NULL, name, NULL, '{}', '[]', NULL FROM providers;
DROP TABLE providers;
"""

# v4: the host's own resources (DISK_GB; CPUs and memory of a host without
# NUMA providers) get a kind of their own. v1-v3 recorded them as kind
# 'numa' with device 'host'. Like 'numa', many live rows share the device.
_V4 = """
DROP INDEX assignments_one_live_holder;
UPDATE assignments SET kind = 'host_resources' WHERE kind = 'numa' AND device_id = 'host';
-- A device is one device whatever provider or class it was claimed under
-- (compute_agent/claims/choice.py device_identity): a PCI address whole or as a VF.
CREATE UNIQUE INDEX assignments_one_live_holder
    ON assignments (CASE WHEN kind IN ('pci', 'vf') THEN 'pci' ELSE kind END, device_id)
    WHERE state != 'released' AND kind NOT IN ('numa', 'host_resources');
"""

# v5: a live migration's source records the move when it is announced
# (state 'announced'), before the conductor swaps the allocations. SQLite
# cannot change a CHECK constraint: the table is copied into a new one.
_V5 = """
CREATE TABLE migrations_v5 (
    uuid TEXT PRIMARY KEY,
    instance_uuid TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('resize', 'live_migration', 'evacuation')),
    role TEXT NOT NULL CHECK (role IN ('source', 'destination', 'both')),
    state TEXT NOT NULL CHECK (state IN ('announced', 'active', 'finished',
                                         'confirmed', 'reverted')),
    old_spec TEXT,
    updated_at REAL NOT NULL
);
INSERT INTO migrations_v5 SELECT * FROM migrations;
DROP TABLE migrations;
ALTER TABLE migrations_v5 RENAME TO migrations;
"""

# v6: each record a state-changing call makes (a build's instance, a move)
# keeps a digest of that call's payload (claims.model.RequestDigest), so a
# retry is answered from the record only when it asks the same. Records
# from before have none (NULL), and their retries are answered as before.
_V6 = """
ALTER TABLE instances ADD COLUMN request TEXT;
ALTER TABLE migrations ADD COLUMN request TEXT;
"""

# v7: the one-time-use devices a claim chose and no cleaning has given
# back since (claims.model.DeviceUse), so that a device waiting to be
# cleaned stays out of scheduling across restarts.
_V7 = """
CREATE TABLE device_uses (
    address TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('used', 'cleaning_failed')),
    reason TEXT NOT NULL,
    updated_at REAL NOT NULL
);
"""

MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5, 6: _V6, 7: _V7}


def new_assignment_id() -> str:
    """A UUID led by the time in milliseconds (RFC 9562's version 7). New
    rows then land at the right edge of the assignments' b-trees, so a
    group commit dirties a few pages rather than one or more per row. The
    rest is from the process's PRNG, like claims.new_mdev_uuid, and for
    the same reason: it is drawn inside the tracker's lock."""
    value = (time.time_ns() // 1_000_000) << 80 | random.getrandbits(80)
    value = value & ~(0xF << 76) | 0x7 << 76  # version
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant
    # Formatted here: uuid.UUID would check again what was just built, at
    # twice the cost, and this runs four times a claim in the writer thread.
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _row_to_assignment(row: sqlite3.Row) -> Assignment:
    try:
        detail = DeviceDetail.from_json(row["detail"])
    except ValueError as e:
        raise StoreError(f"assignment {row['id']}: {e}") from None
    return Assignment(row["id"], row["consumer_uuid"], row["instance_uuid"],
                      Owner(row["owner"]), row["migration_uuid"], row["resource_class"],
                      row["provider_uuid"], DeviceKind(row["kind"]), row["device_id"],
                      row["amount"], AssignmentState(row["state"]), row["boot_id"],
                      detail)


def _connect(path: Path, read_only: bool = False) -> sqlite3.Connection:
    if read_only:
        # Cannot checkpoint either, so never removes a write-ahead log
        # that inspect_store must still find.
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False, timeout=30)
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                               timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def create_private(path: Path) -> None:
    """Create the file 0600 before SQLite opens it (and tighten one that
    exists); SQLite gives its WAL and shared-memory files the same mode."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def schema_version(conn: sqlite3.Connection) -> int:
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
    if not has_meta:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return int(row[0]) if row else 0


def downgrade_refusal(found: int, newest: int) -> str:
    """Why a store at schema ``found`` is refused by code that knows schemas
    up to ``newest``: a newer agent wrote it, and this one cannot know what
    it means. The agent and upgrade-check say it alike."""
    return (f"schema version {found} is newer than the newest this version knows, "
            f"{newest} (a downgrade): install the version that wrote it")


def _check_version(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    current = schema_version(conn)
    if current > target:
        raise StoreError(downgrade_refusal(current, target))
    return current


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Apply forward migrations, each in its own transaction."""
    current = _check_version(conn, target)
    for version in range(current + 1, target + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                         (str(version),))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return target


# Meta keys the agent that holds the state directory writes (Store opened
# with ``root_uuid``). Plain meta rows: the table is there since v1.
ROOT_UUID = "root_uuid"  # the root provider the store was created for
# "open" from the moment the holder opened the store (checkpointed into
# the database file itself) until it closed it; "closed" after.
IN_USE = "in_use"
# The number of group commits the holders made (compute_agent/store/sequence.py);
# absent in a store from before it.
COMMIT_SEQUENCE = "commit_sequence"
# SR-IOV PFs as last seen with all their VFs (compute_agent/health/vf_restore.py,
# JSON), and the boot whose VFs were restored; absent before the first.
SRIOV_RECORD = "sriov_record"
VFS_RESTORED_BOOT = "vfs_restored_boot_id"


def wal_path(path: Path) -> Path:
    return Path(f"{path}-wal")


def inspect_store(path: Path) -> StoreFacts:
    """What is at ``path``, told apart without writing anything of ours.
    Call it holding the state directory's lock, before opening the store."""
    try:
        wal_there = wal_path(path).exists()
        info = path.stat()
    except FileNotFoundError:
        return StoreFacts(str(path), StoreFile.ABSENT)
    except OSError as e:
        raise StoreError(f"store {path}: cannot be opened: {e.strerror}") from None
    openable(path, info)
    size = info.st_size
    if size == 0 and not wal_there:
        return StoreFacts(str(path), StoreFile.EMPTY)
    # Without a write-ahead log the file is all there is: read it as
    # immutable, or SQLite would make an empty log, and the next start
    # would no longer see the log as lost.
    uri = f"file:{path}?mode=ro" + ("" if wal_there else "&immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            return _inspect(conn, path, wal_there)
        finally:
            conn.close()
    except sqlite3.Error as e:
        if not damaged(e):
            raise _unreadable(path, e) from None
        return StoreFacts(str(path), StoreFile.CORRUPT, f"{type(e).__name__}: {e}")
    except ValueError as e:  # a meta value that is not what we wrote
        return StoreFacts(str(path), StoreFile.CORRUPT, str(e))


def stored_schema_version(path: Path) -> int:
    """The schema version of the store at ``path``, whatever it is (newer
    than this code's included), read without writing: beside a running
    agent too."""
    try:
        conn = _connect(path, read_only=True)
        try:
            return schema_version(conn)
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise _named(path, e) from None


# SQLite's primary result codes that say the file itself is damaged, or is
# not a database. Any other error (disk I/O, full, read-only, cannot open)
# is the file system's, and says nothing about the store.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


def damaged(e: sqlite3.Error) -> bool:
    return getattr(e, "sqlite_errorcode", 0) & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


def _unreadable(path: Path, e: sqlite3.Error, doing: str = "read") -> StoreError:
    """A sound store its file system keeps us from reading (or opening):
    never called corrupt, which would send the operator to rebuild it."""
    full = os.statvfs(path.parent).f_bavail == 0
    return StoreError(f"store {path}: cannot be {doing}: {type(e).__name__}: {e}"
                      + ("; its file system is full" if full else ""))


def openable(path: Path, info: os.stat_result) -> None:
    """A store the agent can open: a regular file it may read and write.
    Raises StoreError naming the file, so that SQLite's 'disk I/O error'
    never stands for a directory or a permission."""
    if not stat.S_ISREG(info.st_mode):
        raise StoreError(f"store {path}: cannot be opened: not a regular file")
    if not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(f"store {path}: cannot be opened: permission denied "
                         f"(owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})")


def _inspect(conn: sqlite3.Connection, path: Path, wal_there: bool) -> StoreFacts:
    # Whole, at every start: quick_check does not compare the indexes with
    # their tables, and a row missing from the unique index of live
    # devices would let a device be handed out twice.
    check = [r[0] for r in conn.execute("PRAGMA integrity_check(3)")]
    if check != ["ok"]:
        return StoreFacts(str(path), StoreFile.CORRUPT,
                          "integrity check: " + "; ".join(check))
    tables = {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return StoreFacts(str(path), StoreFile.EMPTY)
    if "meta" not in tables or not schema_version(conn):
        return StoreFacts(str(path), StoreFile.CORRUPT,
                          f"not a compute-agent store: tables {sorted(tables)}")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    record = sequence_record.record_path(path)
    return StoreFacts(str(path), StoreFile.VALID,
                      wal_lost=meta.get(IN_USE) == "open" and not wal_there,
                      root_uuid=meta.get(ROOT_UUID),
                      sequence=stored_sequence(meta),
                      recorded=sequence_record.read_recorded(record),
                      record_path=str(record))


def stored_sequence(meta: dict[str, str]) -> int | None:
    """The store's commit sequence from its meta rows; None before it."""
    value = meta.get(COMMIT_SEQUENCE)
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"meta {COMMIT_SEQUENCE} is not a number (value: {value[:40]!r})")
    return int(value)


def _named(path: Path, e: sqlite3.Error) -> StoreError:
    return StoreError(f"store {path}: {type(e).__name__}: {e}")


class Holding:
    """The CommitGuard (compute_agent/store/writer.py) of the agent that holds the
    state directory. Before a group commit's jobs are answered: the store
    is still the file at its path, and the commit's sequence is recorded.
    Once the file is found gone, every later write is refused too, and
    ``on_moved`` learns it (the daemon then stops)."""

    def __init__(self, path: Path, identity: tuple[int, int], sequence: int,
                 record: sequence_record.SequenceRecord):
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


class Store:
    def __init__(self, path: str | Path, root_uuid: str | None = None,
                 read_only: bool = False):
        """Open (creating if need be) the store at ``path``. The agent that
        holds the state directory passes ``root_uuid``: the store then
        records it, marks itself in use until ``close`` (inspect_store
        reads both at the next start) and guards every commit
        (``Holding``). Any other process opens it ``read_only``: it
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
            self._writer = _connect(self.path, read_only)
        except sqlite3.Error as e:
            self._close_fd()
            # inspect_store read it whole: what fails here is the file
            # system (SQLite cannot make its log on a full disk, say).
            raise (_named(self.path, e) if damaged(e)
                   else _unreadable(self.path, e, "opened")) from None
        except OSError as e:
            self._close_fd()
            raise StoreError(f"store {self.path}: {e.strerror}") from None
        try:
            if read_only:
                if _check_version(self._writer) < SCHEMA_VERSION:
                    self._migrated_copy = migrated_copy(self._writer)
            else:
                migrate(self._writer)
            if self._holder:
                self.holding = self._mark_in_use(root_uuid)
        except sqlite3.Error as e:
            self._writer.close()
            self._close_fd()
            raise _named(self.path, e) from None
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

    def _mark_in_use(self, root_uuid: str) -> Holding:
        """Record the root (first time only) and that the store is open,
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
            record = sequence_record.SequenceRecord(sequence_record.record_path(self.path),
                                                    sequence)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (ROOT_UUID, root_uuid))
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'open')", (IN_USE,))
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                     (COMMIT_SEQUENCE, str(sequence)))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
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
                conn = _connect(self.path, self._read_only)
            except sqlite3.Error as e:
                raise _named(self.path, e) from None
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
            raise _named(self.path, e) from None

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
            raise _named(self.path, e) from None
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


@dataclass(frozen=True)
class Acceptance:
    """What ``accept_store`` accepted."""

    path: Path
    sequence: int | None  # the store's commit sequence; None before it
    recorded: int | None  # what the host had recorded; None: no record
    wal_lost: bool  # its write-ahead log was gone after a crash

    def describe(self) -> str:
        at = ("no commit sequence" if self.sequence is None
              else f"commit sequence {self.sequence}")
        was = ("no record" if self.recorded is None
               else f"the host recorded {self.recorded}")
        return (f"accepting store {self.path} at {at}; {was}"
                + ("; its write-ahead log, lost after a crash, is accepted as lost"
                   if self.wal_lost else ""))


def accept_store(path: Path) -> Acceptance:
    """Take the store at ``path`` for this host's latest, whatever the
    host recorded (an older copy an operator put back on purpose): the
    record then holds its sequence, and a write-ahead log lost after a
    crash is no longer asked for. Holding the state directory's lock, the
    agent stopped. A store that is not there or not sound is refused with
    StoreError."""
    facts = inspect_store(path)
    if facts.file is not StoreFile.VALID:
        detail = f" ({one_line(facts.detail)})" if facts.detail else ""
        raise StoreError(f"store {path} is {facts.file.value}{detail}: there is no "
                         "store to accept; rebuild-store makes one")
    accepted = Acceptance(path, facts.sequence, facts.recorded, facts.wal_lost)
    # The record first: a crash before the store's own write leaves a
    # record no store is behind.
    sequence_record.write_recorded(sequence_record.record_path(path), facts.sequence or 0)
    if facts.wal_lost:
        try:
            conn = _connect(path)
            try:
                conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'closed')", (IN_USE,))
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise _named(path, e) from None
    return accepted


def migrated_copy(conn: sqlite3.Connection) -> sqlite3.Connection:
    """A copy in memory of the store ``conn`` reads, migrated to this
    version's schema; the store itself is left as it is."""
    copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.backup(copy)
    copy.row_factory = sqlite3.Row
    migrate(copy)
    return copy


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


# --- statements, run inside write() or read() -------------------------------

# Made once: json.dumps with any option builds a new encoder every call.
_to_json = json.JSONEncoder(sort_keys=True).encode


def put_instance_sql(uuid: str, spec: dict, request: RequestDigest | None = None
                     ) -> Statement:
    """Record an instance, or its new spec; ``request``: the build that
    makes it (an instance that stays keeps its build's)."""
    return ("INSERT INTO instances (uuid, spec, created_at, request) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (uuid) DO UPDATE SET spec = excluded.spec, "
            "request = coalesce(excluded.request, request)",
            [(uuid, _to_json(spec), time.time(),
              None if request is None else request.to_json())])


def delete_instance_sql(uuid: str, moves_too: bool) -> list[Statement]:
    """Forget an instance and its released assignments. Its moves stay when
    it only left this host, so that a retried confirm still finds them."""
    out = [("DELETE FROM instances WHERE uuid = ?", [(uuid,)]),
           ("DELETE FROM assignments WHERE instance_uuid = ? AND state = 'released'",
            [(uuid,)])]
    if moves_too:
        out.append(("DELETE FROM migrations WHERE instance_uuid = ?", [(uuid,)]))
    return out


def insert_assignments_sql(rows: list[Assignment]) -> Statement:
    now = time.time()
    return ("INSERT INTO assignments VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(a.id, a.consumer_uuid, a.instance_uuid, a.owner.value, a.migration_uuid,
              a.resource_class, a.provider_uuid, a.kind.value, a.device_id, a.amount,
              a.detail.to_json(), a.state.value, a.boot_id, now)
             for a in rows])


def update_assignments_sql(rows: list[Assignment]) -> Statement:
    """Write back owner, consumer, migration, state and boot of rows."""
    now = time.time()
    return ("UPDATE assignments SET consumer_uuid=?, owner=?, migration_uuid=?, "
            "state=?, boot_id=?, updated_at=? WHERE id=?",
            [(a.consumer_uuid, a.owner.value, a.migration_uuid, a.state.value, a.boot_id,
              now, a.id)
             for a in rows])


def realign_assignments_sql(rows: list[Assignment]) -> Statement:
    """Write back where rows sit: provider, class, kind, device and detail
    (heal moved their allocations; compute_agent/heal/realign.py)."""
    now = time.time()
    return ("UPDATE assignments SET provider_uuid=?, resource_class=?, kind=?, "
            "device_id=?, detail=?, updated_at=? WHERE id=?",
            [(a.provider_uuid, a.resource_class, a.kind.value, a.device_id,
              a.detail.to_json(), now, a.id)
             for a in rows])


def delete_migration_sql(uuid: str) -> Statement:
    return ("DELETE FROM migrations WHERE uuid = ?", [(uuid,)])


def put_migration_sql(m: Migration) -> Statement:
    return ("INSERT OR REPLACE INTO migrations (uuid, instance_uuid, kind, role, state, "
            "old_spec, updated_at, request) VALUES (?,?,?,?,?,?,?,?)",
            [(m.uuid, m.instance_uuid, m.kind.value, m.role.value, m.state.value,
              None if m.old_spec is None else _to_json(m.old_spec),
              time.time(), None if m.request is None else m.request.to_json())])


def put_device_uses_sql(uses: list[DeviceUse]) -> Statement:
    now = time.time()
    return ("INSERT OR REPLACE INTO device_uses VALUES (?,?,?,?)",
            [(u.address, u.state.value, u.reason, now) for u in uses])


def delete_device_uses_sql(addresses: list[str]) -> Statement:
    return ("DELETE FROM device_uses WHERE address = ?", [(a,) for a in addresses])


def device_uses(conn: sqlite3.Connection) -> dict[str, DeviceUse]:
    """address -> the one-time-use device's use, for those not clean."""
    return {r["address"]: DeviceUse(r["address"], UseState(r["state"]), r["reason"])
            for r in conn.execute("SELECT * FROM device_uses")}


def live_assignments(conn: sqlite3.Connection) -> list[Assignment]:
    return [_row_to_assignment(r) for r in conn.execute(
        "SELECT * FROM assignments WHERE state != 'released' ORDER BY id")]


def all_instances(conn: sqlite3.Connection) -> dict[str, dict]:
    return {r["uuid"]: json.loads(r["spec"])
            for r in conn.execute("SELECT uuid, spec FROM instances")}


def _request(row: sqlite3.Row, record: str) -> RequestDigest | None:
    """The request a record keeps; None in a store older than schema 6
    (read as it is by upgrade checks) and for a record made before it."""
    if "request" not in row.keys():  # noqa: SIM118 - a Row has no __contains__ by name
        return None
    try:
        return RequestDigest.from_json(row["request"])
    except (ValueError, TypeError, AttributeError) as e:
        raise StoreError(f"{record}: its request is not a request digest: "
                         f"{type(e).__name__}") from None


def instance_requests(conn: sqlite3.Connection) -> dict[str, RequestDigest]:
    """instance uuid -> the build that made it, for those that have one."""
    out = {}
    for r in conn.execute("SELECT uuid, request FROM instances "
                          "WHERE request IS NOT NULL"):
        out[r["uuid"]] = _request(r, f"instance {r['uuid']}")
    return out


def all_migrations(conn: sqlite3.Connection) -> dict[str, Migration]:
    return {r["uuid"]: Migration(r["uuid"], r["instance_uuid"], MoveKind(r["kind"]),
                                 MigrationRole(r["role"]), MigrationState(r["state"]),
                                 json.loads(r["old_spec"]) if r["old_spec"] else None,
                                 _request(r, f"migration {r['uuid']}"))
            for r in conn.execute("SELECT * FROM migrations")}


def migrations_changed_at(conn: sqlite3.Connection) -> dict[str, float]:
    """migration uuid -> when its record last changed (epoch s)."""
    return dict(conn.execute("SELECT uuid, updated_at FROM migrations").fetchall())


def live_changed_at(conn: sqlite3.Connection) -> dict[str, float]:
    """instance uuid -> when its live assignments last changed (epoch s)."""
    return dict(conn.execute(
        "SELECT instance_uuid, max(updated_at) FROM assignments "
        "WHERE state != 'released' GROUP BY instance_uuid").fetchall())


def placement_view(conn: sqlite3.Connection) -> list[Provider]:
    """The providers as Placement showed them after the last sync."""
    return [Provider(r["uuid"], r["name"], r["parent_uuid"], json.loads(r["inventories"]),
                     frozenset(json.loads(r["traits"])),
                     None if r["aggregates"] is None
                     else frozenset(json.loads(r["aggregates"])),
                     r["generation"])
            for r in conn.execute("SELECT * FROM placement_view ORDER BY uuid")]


def put_placement_view_sql(providers: list[Provider]) -> list[Statement]:
    return [("DELETE FROM placement_view", [()]),
            ("INSERT INTO placement_view VALUES (?,?,?,?,?,?,?)",
             [(p.uuid, p.parent_uuid, p.name, p.generation,
               _to_json(p.inventories), json.dumps(sorted(p.traits)),
               None if p.aggregates is None else json.dumps(sorted(p.aggregates)))
              for p in providers])]


def meta_value(key: str) -> Callable[[sqlite3.Connection], str | None]:
    """A reader of one meta row's value (None when absent)."""
    def read(conn: sqlite3.Connection) -> str | None:
        row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]
    return read


def put_meta_sql(key: str, value: str) -> list[Statement]:
    return [("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(key, value)])]
