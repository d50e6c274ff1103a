"""Damage done to a store file on disk, as bit rot, a careless operator
or an agent from before a change would leave it; used by the store's unit
tests and the daemon's functional ones."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from compute_agent.store import sequence as sequence_record
from compute_agent.store.schema import COMMIT_SEQUENCE


def drop_from_unique_index(path: Path, assignment_id: str) -> None:
    """Change one key of the assignments' primary-key index on disk (its
    last character): its row is then missing from the index, while every
    page stays well formed."""
    conn = sqlite3.connect(path)
    root, = conn.execute("SELECT rootpage FROM sqlite_master "
                         "WHERE name = 'sqlite_autoindex_assignments_1'").fetchone()
    page_size, = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    data = bytearray(path.read_bytes())
    page = (root - 1) * page_size
    at = data.find(assignment_id.encode(), page, page + page_size)
    assert at > 0, "the key is not on the index's root page"
    last = at + len(assignment_id) - 1
    data[last] = ord("0") if data[last] != ord("0") else ord("1")
    path.write_bytes(bytes(data))


def page_with_free_space_corruption(path: Path) -> None:
    """The meta table's root page (page 2) says its cells start inside
    its own header: SQLite's report of it runs over several lines."""
    data = bytearray(path.read_bytes())
    page_size = 4096
    data[page_size + 5:page_size + 7] = b"\x00\x10"
    path.write_bytes(bytes(data))


def strip_sequence(path: Path) -> None:
    """Make the store one from before the sequence: no meta row, no record."""
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM meta WHERE key = ?", (COMMIT_SEQUENCE,))
    conn.commit()
    conn.close()
    sequence_record.record_path(path).unlink()
