"""accept-store: the store at its path taken for the host's latest, the
record and a lost write-ahead log made to agree with it."""
from __future__ import annotations

from pathlib import Path

import pytest

from compute_agent.store.acceptance import Acceptance, accept_store
from compute_agent.store.check import StoreVerdict, judge
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import inspect_store
from compute_agent.store.sequence import read_recorded, record_path
from compute_agent.store.store import Store
from tests.store_damage import strip_sequence
from tests.unit.store.stores import ROOT_UUID, crash_after_a_write


def test_accept_store_takes_an_older_copy_and_says_what_it_accepts(tmp_path):
    path = tmp_path / "state.db"
    crash_after_a_write(path)
    older = path.read_bytes()  # checkpointed at the open: sequence 0
    Path(f"{path}-wal").unlink()
    path.write_bytes(older)
    facts = inspect_store(path)
    assert facts.wal_lost and (facts.sequence, facts.recorded) == (0, 1)
    accepted = accept_store(path)
    assert accepted.describe() == (
        f"accepting store {path} at commit sequence 0; the host recorded 1; its "
        "write-ahead log, lost after a crash, is accepted as lost")
    facts = inspect_store(path)
    assert not facts.wal_lost and (facts.sequence, facts.recorded) == (0, 0)
    assert judge(facts, None).verdict is StoreVerdict.OPEN


def test_accept_store_refuses_when_there_is_no_store(tmp_path):
    with pytest.raises(StoreError, match="is missing: there is no store to accept"):
        accept_store(tmp_path / "state.db")
    assert read_recorded(record_path(tmp_path / "state.db")) is None


def test_a_sound_store_is_accepted_by_its_record_alone(tmp_path):
    path = tmp_path / "state.db"
    Store(path, ROOT_UUID).close()
    strip_sequence(path)
    before = path.read_bytes()
    accepted = accept_store(path)
    assert accepted == Acceptance(path, None, None, False)
    assert accepted.describe() == (f"accepting store {path} at no commit sequence; "
                                   "no record")
    assert path.read_bytes() == before
    assert read_recorded(record_path(path)) == 0


def test_a_corrupt_store_is_refused_saying_why(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"not sqlite\n" * 500)
    with pytest.raises(StoreError) as raised:
        accept_store(path)
    assert str(raised.value) == (f"store {path} is corrupt (DatabaseError: file is not a "
                                 "database): there is no store to accept; rebuild-store "
                                 "makes one")
    assert read_recorded(record_path(path)) is None
