"""The host's record of the store's commit sequence: two slots on disk, the
highest sound one read, a torn one ignored."""
from __future__ import annotations

import stat

from compute_agent.store.sequence import (
    SLOT_BYTES,
    SequenceRecord,
    read_recorded,
    record_path,
    write_recorded,
)


def test_the_record_lives_beside_the_store_under_a_name_of_its_own(tmp_path):
    # Not state.db*: copying a store back with its -wal and -shm files
    # does not bring back the record of its own time too.
    assert record_path(tmp_path / "state.db") == tmp_path / "store_sequence"


def test_no_record_is_none(tmp_path):
    assert read_recorded(tmp_path / "store_sequence") is None


def test_each_commit_is_read_back_and_the_file_is_private(tmp_path):
    path = tmp_path / "store_sequence"
    record = SequenceRecord(path, 7)
    assert read_recorded(path) == 7
    for n in (8, 9, 10):
        record.record(n)
        assert read_recorded(path) == n
    record.close()
    record.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size == 2 * SLOT_BYTES


def test_a_torn_slot_leaves_the_number_before(tmp_path):
    path = tmp_path / "store_sequence"
    record = SequenceRecord(path, 41)
    record.record(42)  # slot 0; slot 1 still holds 41
    record.close()
    raw = bytearray(path.read_bytes())
    raw[20:30] = b"\0" * 10  # slot 0 half written
    path.write_bytes(bytes(raw))
    assert read_recorded(path) == 41


def test_a_slot_whose_checksum_does_not_match_is_not_read(tmp_path):
    path = tmp_path / "store_sequence"
    write_recorded(path, 5)
    text = path.read_bytes().decode().replace("sequence 5 ", "sequence 9 ", 1)
    path.write_bytes(text.encode())
    assert read_recorded(path) == 5


def test_a_record_with_no_sound_slot_is_unknown(tmp_path):
    path = tmp_path / "store_sequence"
    path.write_bytes(b"garbage\n" * 200)
    assert read_recorded(path) is None
