"""What is at the store's path, told apart without writing anything: none,
empty, not ours, damaged, a valid store and what it records."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from compute_agent.store.check import StoreFile, StoreVerdict, judge
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import StoredHost, inspect_store, stored_host, stored_schema_version
from compute_agent.store.schema import COMMIT_SEQUENCE, SCHEMA_VERSION, migrate
from compute_agent.store.sequence import record_path
from compute_agent.store.store import Store
from tests.store_damage import drop_from_unique_index, page_with_free_space_corruption
from tests.unit.store.stores import ROOT_UUID, crash_after_a_write, held_store_with_assignments


def test_inspect_tells_missing_empty_and_schemaless_apart(tmp_path):
    path = tmp_path / "state.db"
    assert inspect_store(path).file is StoreFile.ABSENT
    path.write_bytes(b"")
    assert inspect_store(path).file is StoreFile.EMPTY
    sqlite3.connect(path).execute("PRAGMA user_version=1").connection.commit()
    assert inspect_store(path).file is StoreFile.EMPTY


def test_inspect_finds_a_file_that_is_not_a_database_corrupt(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"not sqlite\n" * 500)
    facts = inspect_store(path)
    assert facts.file is StoreFile.CORRUPT and "not a database" in facts.detail


def test_inspect_finds_a_truncated_store_corrupt(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    store.write([("INSERT INTO instances (uuid, spec, created_at) VALUES (?, ?, ?)",
                  [(f"i{n}", "x" * 2000, 0.0) for n in range(200)])])
    store.close()
    with open(path, "r+b") as f:
        f.truncate(8192)
    assert inspect_store(path).file is StoreFile.CORRUPT


def test_inspect_finds_another_programs_database_corrupt(tmp_path):
    path = tmp_path / "state.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    facts = inspect_store(path)
    assert facts.file is StoreFile.CORRUPT and "not a compute-agent store" in facts.detail


def test_a_store_closed_cleanly_is_valid_and_records_its_root(tmp_path):
    path = tmp_path / "state.db"
    Store(path, ROOT_UUID).close()
    facts = inspect_store(path)
    assert facts.file is StoreFile.VALID and not facts.wal_lost
    assert facts.root_uuid == ROOT_UUID


def test_a_store_records_the_host_name_it_was_first_opened_for(tmp_path):
    path = tmp_path / "state.db"
    Store(path, ROOT_UUID).close()
    assert stored_host(path) == StoredHost(True, None)  # as a store from before the record
    Store(path, ROOT_UUID, host="node1").close()
    assert stored_host(path) == StoredHost(True, "node1")
    Store(path, ROOT_UUID, host="node2").close()  # the start refuses it before
    Store(path, ROOT_UUID).close()
    assert stored_host(path) == StoredHost(True, "node1")


def test_no_store_records_no_host_and_one_to_judge_is_there(tmp_path):
    path = tmp_path / "state.db"
    assert stored_host(path) == StoredHost(False)
    path.write_bytes(b"")
    assert stored_host(path) == StoredHost(False)
    path.write_bytes(b"not a database at all" * 100)
    assert stored_host(path) == StoredHost(True)  # the store check refuses it, next
    assert not Path(f"{path}-wal").exists()


def test_reading_the_host_of_a_store_whose_log_was_lost_makes_no_log(tmp_path):
    path = tmp_path / "state.db"
    crash_after_a_write(path)
    Path(f"{path}-wal").unlink()
    assert stored_host(path).store_there
    assert not Path(f"{path}-wal").exists()
    assert inspect_store(path).wal_lost


def test_a_crashed_store_with_its_log_is_valid_and_without_it_is_not(tmp_path):
    path = tmp_path / "state.db"
    crash_after_a_write(path)
    wal = Path(f"{path}-wal")
    assert wal.stat().st_size > 0
    assert not inspect_store(path).wal_lost
    wal.unlink()
    assert inspect_store(path).wal_lost


def test_bug_looking_at_a_store_whose_log_was_lost_made_an_empty_log(tmp_path):
    # SQLite's read-only connection made an empty log in the lost one's
    # place: the start after a refusal saw none lost.
    path = tmp_path / "state.db"
    crash_after_a_write(path)
    Path(f"{path}-wal").unlink()
    assert inspect_store(path).wal_lost
    assert not Path(f"{path}-wal").exists()
    assert inspect_store(path).wal_lost


def test_bug_a_row_missing_from_an_index_passed_the_start_check(tmp_path):
    # The start ran quick_check, which does not compare indexes with their
    # tables: bit rot there let the agent serve from a broken store.
    path = tmp_path / "state.db"
    rows = held_store_with_assignments(path)
    middle = sorted(a.id for a in rows)[2]
    drop_from_unique_index(path, middle)
    quick = sqlite3.connect(path).execute("PRAGMA quick_check").fetchall()
    assert quick == [("ok",)]  # what the old check saw
    facts = inspect_store(path)
    assert facts.file is StoreFile.CORRUPT, facts
    assert "missing from index sqlite_autoindex_assignments_1" in facts.detail


def test_sqlites_several_lines_make_one_refusal_line(tmp_path):
    path = tmp_path / "state.db"
    held_store_with_assignments(path)
    page_with_free_space_corruption(path)
    facts = inspect_store(path)
    assert facts.file is StoreFile.CORRUPT and "\n" in facts.detail
    j = judge(facts, None)
    assert j.verdict is StoreVerdict.REFUSE and "\n" not in j.reason
    assert f"store {path} is unusable" in j.reason and "rebuild-store" in j.reason


def test_a_valid_store_says_its_sequence_and_the_hosts_record(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    store.write([("INSERT INTO instances (uuid, spec, created_at) VALUES ('i', '{}', 0)",
                  [()])])
    store.close()
    facts = inspect_store(path)
    assert (facts.sequence, facts.recorded, facts.record_path) == (
        1, 1, str(record_path(path)))


def test_a_meta_value_that_is_not_ours_is_corrupt(tmp_path):
    path = tmp_path / "state.db"
    Store(path, ROOT_UUID).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = 'many' WHERE key = ?", (COMMIT_SEQUENCE,))
    conn.commit()
    conn.close()
    facts = inspect_store(path)
    assert facts.file is StoreFile.CORRUPT
    assert facts.detail == "meta commit_sequence is not a number (value: 'many')"


def test_what_is_not_a_regular_file_is_refused_before_sqlite_sees_it(tmp_path):
    path = tmp_path / "state.db"
    path.mkdir()
    with pytest.raises(StoreError, match=f"^store {path}: cannot be opened: not a regular file$"):
        inspect_store(path)


def test_nothing_is_written_while_looking(tmp_path):
    path = tmp_path / "state.db"
    held_store_with_assignments(path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    inspect_store(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_the_schema_version_is_read_whatever_it_is(tmp_path):
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=2)
    assert stored_schema_version(path) == 2
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                 (str(SCHEMA_VERSION + 1),))
    conn.close()
    assert stored_schema_version(path) == SCHEMA_VERSION + 1


def test_the_schema_version_of_no_store_is_an_error_naming_it(tmp_path):
    path = tmp_path / "state.db"
    with pytest.raises(StoreError, match=f"^store {path}: OperationalError"):
        stored_schema_version(path)


def test_a_store_the_agent_may_not_read_is_named(tmp_path, monkeypatch):
    """Root reads any file, so the refusal is simulated."""
    path = tmp_path / "state.db"
    path.write_bytes(b"x")
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(StoreError, match=r"state.db: cannot be opened: permission denied"):
        inspect_store(path)
