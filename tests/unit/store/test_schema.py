"""The store's schema version, the refusal of a newer one, migrating one
step a transaction, a migrated copy in memory, and the commit sequence read
from the meta rows. (What each step builds: test_migrations.py.)"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from compute_agent.store import schema
from compute_agent.store.errors import StoreError
from compute_agent.store.schema import (
    COMMIT_SEQUENCE,
    SCHEMA_VERSION,
    check_version,
    migrate,
    migrated_copy,
    schema_version,
    stored_sequence,
)


@pytest.fixture
def conn(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    yield conn
    conn.close()


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_a_database_without_a_version_is_at_0(conn):
    assert schema_version(conn) == 0
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    assert schema_version(conn) == 0
    conn.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    assert schema_version(conn) == 3


def test_migrate_goes_one_step_at_a_time_to_the_version_asked(conn):
    assert migrate(conn, target=2) == 2
    assert schema_version(conn) == 2 and "placement_view" not in tables(conn)
    assert migrate(conn) == SCHEMA_VERSION
    assert schema_version(conn) == SCHEMA_VERSION and "placement_view" in tables(conn)


def test_migrate_refuses_to_go_backwards(conn):
    migrate(conn)
    with pytest.raises(StoreError):
        migrate(conn, target=1)
    assert schema_version(conn) == SCHEMA_VERSION


def test_a_newer_store_is_refused_as_a_downgrade_naming_both_versions(conn):
    migrate(conn, target=3)
    assert check_version(conn, target=3) == 3
    with pytest.raises(StoreError) as raised:
        check_version(conn, target=2)
    assert str(raised.value) == ("schema version 3 is newer than the newest this version "
                                 "knows, 2 (a downgrade): install the version that wrote it")


def test_a_step_that_fails_is_undone_whole_and_the_steps_before_it_stay(conn, monkeypatch):
    failing = dict(schema.MIGRATIONS)
    failing[3] = [*failing[3], "CREATE TABLE broken (x"]
    monkeypatch.setattr(schema, "MIGRATIONS", failing)
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, target=4)
    assert schema_version(conn) == 2
    assert tables(conn) == tables_at(2)
    assert not conn.in_transaction


def tables_at(version: int) -> set[str]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, target=version)
        return tables(conn)
    finally:
        conn.close()


def test_a_migrated_copy_is_at_this_version_and_the_store_left_as_it_was(conn):
    migrate(conn, target=2)
    conn.execute("INSERT INTO instances (uuid, spec, created_at) VALUES ('i', '{}', 0)")
    copy = migrated_copy(conn)
    try:
        assert schema_version(copy) == SCHEMA_VERSION
        assert copy.execute("SELECT uuid FROM instances").fetchone()["uuid"] == "i"
    finally:
        copy.close()
    assert schema_version(conn) == 2


@pytest.mark.parametrize("meta, sequence", [({}, None), ({COMMIT_SEQUENCE: "0"}, 0),
                                            ({COMMIT_SEQUENCE: "42"}, 42)])
def test_the_commit_sequence_is_read_from_the_meta_rows(meta, sequence):
    assert stored_sequence(meta) == sequence


@pytest.mark.parametrize("value", ["-1", "4x", "", "1.5"])
def test_a_commit_sequence_that_is_not_a_number_is_refused_showing_it(value):
    with pytest.raises(ValueError, match=f"meta commit_sequence is not a number "
                                         f"\\(value: {value!r}\\)"):
        stored_sequence({COMMIT_SEQUENCE: value})
