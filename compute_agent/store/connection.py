"""Opening the store's SQLite file, and the errors that name it."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from compute_agent.store.errors import StoreError

# SQLite's primary result codes that say the file itself is damaged, or is
# not a database. Any other error (disk I/O, full, read-only, cannot open)
# is the file system's, and says nothing about the store.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


def connect(path: Path, read_only: bool = False) -> sqlite3.Connection:
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


def wal_path(path: Path) -> Path:
    return Path(f"{path}-wal")


def damaged(e: sqlite3.Error) -> bool:
    return getattr(e, "sqlite_errorcode", 0) & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


def named_error(path: Path, e: sqlite3.Error) -> StoreError:
    return StoreError(f"store {path}: {type(e).__name__}: {e}")


def unreadable_error(path: Path, e: sqlite3.Error, doing: str = "read") -> StoreError:
    """A sound store its file system keeps us from reading (or opening):
    never called corrupt, which would send the operator to rebuild it."""
    full = os.statvfs(path.parent).f_bavail == 0
    return StoreError(f"store {path}: cannot be {doing}: {type(e).__name__}: {e}"
                      + ("; its file system is full" if full else ""))
