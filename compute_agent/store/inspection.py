"""What is at the store's path, read without opening a store and without
writing anything: the facts the start check (compute_agent/store/check.py)
judges, and the schema version upgrade-check reads."""
from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

from compute_agent.store.check import StoreFacts, StoreFile
from compute_agent.store.connection import connect, damaged, named_error, unreadable_error, wal_path
from compute_agent.store.errors import StoreError
from compute_agent.store.schema import HOST, IN_USE, ROOT_UUID, schema_version, stored_sequence
from compute_agent.store.sequence import read_recorded, record_path


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
    try:
        conn = sqlite3.connect(_read_only_uri(path, wal_there), uri=True)
        try:
            return _inspect(conn, path, wal_there)
        finally:
            conn.close()
    except sqlite3.Error as e:
        if not damaged(e):
            raise unreadable_error(path, e) from None
        return StoreFacts(str(path), StoreFile.CORRUPT, f"{type(e).__name__}: {e}")
    except ValueError as e:  # a meta value that is not what we wrote
        return StoreFacts(str(path), StoreFile.CORRUPT, str(e))


def _read_only_uri(path: Path, wal_there: bool) -> str:
    # Without a write-ahead log the file is all there is: read it as
    # immutable, or SQLite would make an empty log, and the next start
    # would no longer see the log as lost.
    return f"file:{path}?mode=ro" + ("" if wal_there else "&immutable=1")


@dataclass(frozen=True)
class StoredHost:
    """The host name a store records (compute_agent/daemon/renamed_host.py)."""

    # Something is at the path: a store of ours, or one inspect_store
    # will judge; not a missing or zero-byte file.
    store_there: bool
    name: str | None = None  # None: none recorded (a store from before), or unreadable


def stored_host(path: Path) -> StoredHost:
    """The host name the store at ``path`` records, read as inspect_store
    reads, writing nothing, and without checking the store whole (the
    start's store check does, next). Call it holding the state
    directory's lock."""
    wal_there = wal_path(path).exists()
    try:
        if path.stat().st_size == 0 and not wal_there:
            return StoredHost(False)
    except FileNotFoundError:
        return StoredHost(False)
    except OSError:
        return StoredHost(True)  # the store check names what is wrong
    try:
        conn = sqlite3.connect(_read_only_uri(path, wal_there), uri=True)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key=?", (HOST,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return StoredHost(True)  # no meta table, or not a database: judged next
    return StoredHost(True, None if row is None else str(row[0]))


def stored_schema_version(path: Path) -> int:
    """The schema version of the store at ``path``, whatever it is (newer
    than this code's included), read without writing: beside a running
    agent too."""
    try:
        conn = connect(path, read_only=True)
        try:
            return schema_version(conn)
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise named_error(path, e) from None


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
    record = record_path(path)
    return StoreFacts(str(path), StoreFile.VALID,
                      wal_lost=meta.get(IN_USE) == "open" and not wal_there,
                      root_uuid=meta.get(ROOT_UUID),
                      sequence=stored_sequence(meta),
                      recorded=read_recorded(record),
                      record_path=str(record))

