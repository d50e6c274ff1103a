"""The guard of each group commit of the state directory's holder: the
store still the file at its path, the commit's sequence in the store and
in the host's record, and a store found moved refusing every later write.
(Through the Store and its writer: test_store.py.)"""
from __future__ import annotations

import errno
import logging
import os
import sqlite3
from pathlib import Path

import pytest

from compute_agent.store.errors import StoreMoved
from compute_agent.store.holding import Holding, still_at_path
from compute_agent.store.schema import COMMIT_SEQUENCE, migrate
from compute_agent.store.sequence import SequenceRecord, read_recorded, record_path


def identity(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_dev, info.st_ino


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    path.write_bytes(b"")
    return path


def holding(path: Path, sequence: int = 0) -> Holding:
    return Holding(path, identity(path), sequence, SequenceRecord(record_path(path), sequence))


def test_the_file_still_at_its_path_is_nothing_to_say(store_file):
    assert still_at_path(store_file, identity(store_file)) == ""


def test_a_removed_or_replaced_file_is_said_so(store_file, tmp_path):
    held = identity(store_file)
    other = tmp_path / "copy.db"
    other.write_bytes(store_file.read_bytes())
    os.replace(other, store_file)
    assert still_at_path(store_file, held) == "was replaced by another file"
    store_file.unlink()
    assert still_at_path(store_file, held) == "was removed"


def test_a_path_that_cannot_be_looked_at_is_said_so(tmp_path):
    below_a_file = tmp_path / "a-file"
    below_a_file.write_text("")
    assert still_at_path(below_a_file / "state.db", (0, 0)) == \
        "cannot be looked at (Not a directory)"


def test_a_commit_raises_the_sequence_in_the_store_and_in_the_record(store_file):
    guard = holding(store_file, sequence=4)
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn)
    guard.check()
    guard.in_transaction(conn)
    assert conn.execute("SELECT value FROM meta WHERE key = ?",
                        (COMMIT_SEQUENCE,)).fetchone() == ("5",)
    guard.committed()
    assert guard.sequence == 5
    assert read_recorded(record_path(store_file)) == 5
    guard.close()


def test_a_store_found_moved_refuses_every_later_write_and_is_told_once(store_file, caplog):
    guard = holding(store_file)
    told: list[str] = []
    guard.on_moved(told.append)
    store_file.unlink()
    for _ in range(2):
        with pytest.raises(StoreMoved, match=f"^store {store_file} was removed while the "
                                             "agent ran: nothing more is written"):
            guard.check()
    store_file.write_bytes(b"")  # a file there again is not the one opened
    with pytest.raises(StoreMoved):
        guard.check()
    assert told == [str(guard.moved)]
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    # A listener that comes late is told at once.
    late: list[str] = []
    guard.on_moved(late.append)
    assert late == told
    guard.close()


def test_a_store_moved_during_the_transaction_is_not_acknowledged(store_file):
    guard = holding(store_file)
    guard.check()
    store_file.unlink()
    with pytest.raises(StoreMoved):
        guard.committed()
    # The commit is in a file no longer named: the host's record is left
    # where it was.
    assert read_recorded(record_path(store_file)) == 0
    guard.close()


class FullRecord(SequenceRecord):
    def record(self, sequence: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_record_that_cannot_be_written_is_a_warning_not_a_refusal(store_file, caplog):
    guard = Holding(store_file, identity(store_file), 0,
                    FullRecord(record_path(store_file), 0))
    guard.committed()
    assert guard.sequence == 1
    (record,) = caplog.records
    assert (record.levelno, record.getMessage()) == (
        logging.WARNING, f"Commit 1 of store {store_file} not recorded in "
                         f"{record_path(store_file)}: No space left on device")
    guard.close()
