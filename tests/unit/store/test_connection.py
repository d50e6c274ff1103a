"""Opening the store's SQLite file (WAL, synchronous FULL, rows by name),
creating it private, and the errors that name it: damage told apart from
the file system's refusals."""
from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from compute_agent.store import connection
from compute_agent.store.connection import (
    connect,
    create_private,
    damaged,
    named_error,
    unreadable_error,
    wal_path,
)


def sqlite_error(path: Path, make) -> sqlite3.Error:
    """The error SQLite raises for what ``make`` did to the file at ``path``."""
    make(path)
    try:
        conn = sqlite3.connect(path)
        try:
            conn.execute("SELECT * FROM sqlite_master").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as e:
        return e
    raise AssertionError("SQLite read the file")


def test_a_writer_connection_is_wal_synchronous_full_with_rows_by_name(tmp_path):
    path = tmp_path / "state.db"
    conn = connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")  # autocommit: isolation_level None
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert conn.execute("SELECT x FROM t").fetchone()["x"] == 1
    assert wal_path(path).exists() and wal_path(path) == tmp_path / "state.db-wal"
    conn.close()


def test_a_read_only_connection_reads_and_cannot_write(tmp_path):
    path = tmp_path / "state.db"
    writer = connect(path)
    writer.execute("CREATE TABLE t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    reader = connect(path, read_only=True)
    assert reader.execute("SELECT x FROM t").fetchone()["x"] == 1
    assert reader.execute("PRAGMA synchronous").fetchone()[0] == 2
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.execute("INSERT INTO t VALUES (2)")
    reader.close()
    writer.close()


def test_a_store_file_is_created_private_and_an_existing_one_tightened(tmp_path):
    path = tmp_path / "new" / "state.db"
    old_umask = os.umask(0)
    try:
        create_private(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        path.chmod(0o644)
        path.write_bytes(b"kept")
        create_private(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == b"kept"


def test_damage_is_told_apart_from_the_file_systems_errors(tmp_path):
    not_a_database = sqlite_error(tmp_path / "a.db",
                                  lambda p: p.write_bytes(b"not sqlite\n" * 500))
    assert damaged(not_a_database)
    cannot_open = sqlite_error(tmp_path / "dir.db", lambda p: p.mkdir())
    assert not damaged(cannot_open)
    assert not damaged(sqlite3.OperationalError("no sqlite_errorcode"))


def test_errors_name_the_store(tmp_path):
    path = tmp_path / "state.db"
    assert str(named_error(path, sqlite3.OperationalError("disk I/O error"))) == \
        f"store {path}: OperationalError: disk I/O error"


def test_an_unreadable_store_says_so_and_when_its_file_system_is_full(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    error = sqlite3.OperationalError("disk I/O error")
    assert str(unreadable_error(path, error, "written")) == (
        f"store {path}: cannot be written: OperationalError: disk I/O error")
    real = os.statvfs
    monkeypatch.setattr(connection.os, "statvfs",
                        lambda p: SimpleNamespace(f_bavail=0) if p == tmp_path else real(p))
    assert str(unreadable_error(path, error)) == (
        f"store {path}: cannot be read: OperationalError: disk I/O error; its file "
        "system is full")
