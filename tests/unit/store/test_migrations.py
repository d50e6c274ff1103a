"""The schema's migration steps: each builds the schema it always built,
and a store of any older version migrates to the schema of a new one.

schema_history.json pins what ``sqlite_master`` held after each step
(type, name, table, SQL text), as the steps built it when they became
one module each: a step changed since, or an older store that migrates
to anything else than a new store holds, fails here."""
import json
import sqlite3
from pathlib import Path

import pytest

from compute_agent.store.migrations import MIGRATIONS
from compute_agent.store.schema import SCHEMA_VERSION, migrate, schema_version
from compute_agent.store.store import Store

HISTORY = {int(version): [tuple(row) for row in rows] for version, rows in json.loads(
    (Path(__file__).parent / "schema_history.json").read_text()).items()}


def schema(conn: sqlite3.Connection) -> list[tuple]:
    """What ``sqlite_master`` holds, in an order that does not depend on
    the order things were made in (a step that copies a table makes it last)."""
    return sorted(tuple(r) for r in conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master"))


def store_as_pinned(path: Path, version: int) -> None:
    """A store as an agent of schema ``version`` left it, made from the
    pinned schema rather than by the steps under test."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for _, _, _, sql in HISTORY[version]:
            if sql is not None:  # the indexes of primary keys come with their tables
                conn.execute(sql)
        conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_the_steps_are_numbered_without_a_gap_up_to_the_schema_version():
    assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


def test_every_version_up_to_the_current_one_is_pinned():
    assert sorted(HISTORY) == list(range(1, SCHEMA_VERSION + 1))


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_each_step_builds_the_schema_it_built_before(version):
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, target=version)
        assert schema(conn) == sorted(HISTORY[version])
    finally:
        conn.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_an_older_store_migrates_to_the_schema_of_a_new_store(tmp_path, version):
    old = tmp_path / "old.db"
    store_as_pinned(old, version)
    fresh = Store(tmp_path / "fresh.db")
    migrated = Store(old)
    try:
        assert migrated.read(schema_version) == SCHEMA_VERSION
        assert migrated.read(schema) == fresh.read(schema)
    finally:
        migrated.close()
        fresh.close()
