"""The update loop's record of its last cycle (compute_agent/daemon/cycle_record.py):
what it writes, what a reader gets back, and a file that cannot be
written or read."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from compute_agent.daemon import cycle_record
from compute_agent.daemon.cycle_record import CycleRecord, Recorder
from compute_agent.daemon.errors import RecordUnreadable
from compute_agent.dependencies import Dependencies, Dependency, DependencyState, Health


def test_a_record_reads_back_as_written(tmp_path):
    board = Dependencies(clock=lambda: 7.0)
    board.failed(Dependency.BROKER, "rabbit://127.0.0.1:5672/", "did not answer (y)")
    record = CycleRecord(42, 10.0, 5.0, "z", board.snapshot())
    path = tmp_path / cycle_record.FILENAME
    cycle_record.write(path, record)
    assert cycle_record.read(path) == record
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("{}")
    with pytest.raises(RecordUnreadable, match=str(path)):
        cycle_record.read(path)
    assert cycle_record.read(tmp_path / "absent") is None


def test_the_record_is_in_the_state_directory():
    assert cycle_record.path_in("/var/lib/compute-agent") == Path(
        "/var/lib/compute-agent/last_cycle.json")


@pytest.mark.parametrize("text,kind", [
    ("not json", "JSONDecodeError"), ('{"pid": 1}', "KeyError"), ("[]", "TypeError")])
def test_a_file_that_is_no_record_is_named_with_what_is_wrong(tmp_path, text, kind):
    path = tmp_path / cycle_record.FILENAME
    path.write_text(text)
    with pytest.raises(RecordUnreadable) as caught:
        cycle_record.read(path)
    assert str(caught.value).startswith(f"{path}: not a cycle record ({kind}: ")


def test_a_record_that_cannot_be_read_is_named_with_why(tmp_path):
    """A directory in its place: the kernel's reason, not a traceback."""
    path = tmp_path / cycle_record.FILENAME
    path.mkdir()
    with pytest.raises(RecordUnreadable, match=f"^{path}: cannot be read: Is a directory$"):
        cycle_record.read(path)


def record_of(path: Path) -> CycleRecord:
    record = cycle_record.read(path)
    assert record is not None
    return record


def test_each_cycle_replaces_the_record_and_keeps_the_last_success(tmp_path):
    path = tmp_path / "state" / cycle_record.FILENAME
    recorder = Recorder(path)
    assert recorder.last_success_at is None
    states = {Dependency.PLACEMENT: DependencyState(Dependency.PLACEMENT, Health.UP)}
    before = time.time()
    recorder.cycle_ended(True, "", states)
    first = record_of(path)
    assert first.pid == os.getpid() and first.dependencies == states
    assert first.last_success_at is not None
    assert before <= first.last_success_at <= first.last_cycle_at <= time.time()
    assert first.last_problem == ""
    recorder.cycle_ended(False, "Placement at http://p did not answer", {})
    failed = record_of(path)
    assert failed.last_success_at == first.last_success_at
    assert failed.last_cycle_at >= first.last_cycle_at
    assert failed.last_problem == "Placement at http://p did not answer"
    recorder.cycle_ended(True, "ignored once the cycle succeeded", {})
    assert record_of(path).last_problem == ""


def test_a_restart_remembers_the_last_success_of_the_run_before(tmp_path):
    path = tmp_path / cycle_record.FILENAME
    cycle_record.write(path, CycleRecord(7, 200.0, 150.0, "down"))
    assert Recorder(path).last_success_at == 150.0


def test_a_restart_after_an_unreadable_record_starts_a_new_one(tmp_path, caplog):
    path = tmp_path / cycle_record.FILENAME
    path.write_text("{")
    with caplog.at_level(logging.WARNING, logger=cycle_record.__name__):
        recorder = Recorder(path)
    assert recorder.last_success_at is None
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: not a cycle record (JSONDecodeError: Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1)): starting a new record"]
    recorder.cycle_ended(False, "x", {})
    assert record_of(path).last_problem == "x"


def test_an_agent_beside_a_running_one_writes_no_record(monkeypatch):
    written: list[Path] = []
    monkeypatch.setattr(cycle_record, "write", lambda path, record: written.append(path))
    recorder = Recorder(None)
    recorder.cycle_ended(True, "", {})
    assert recorder.last_success_at is not None
    assert written == []


def test_a_record_that_cannot_be_written_is_one_line_until_it_can_again(tmp_path, caplog):
    blocked = tmp_path / "state"
    blocked.write_text("a file where the state directory should be")
    recorder = Recorder(blocked / cycle_record.FILENAME)
    caplog.clear()  # its read's line: tested above
    with caplog.at_level(logging.WARNING, logger=cycle_record.__name__):
        recorder.cycle_ended(True, "", {})
        recorder.cycle_ended(True, "", {})
        assert len(caplog.records) == 1
        assert caplog.records[0].getMessage().startswith(
            f"Cannot record the cycle in {blocked / cycle_record.FILENAME}: ")
        blocked.unlink()
        recorder.cycle_ended(True, "", {})
        assert record_of(blocked / cycle_record.FILENAME).last_problem == ""
        blocked.joinpath(cycle_record.FILENAME).unlink()
        blocked.rmdir()
        blocked.write_text("blocked again")
        recorder.cycle_ended(False, "y", {})
    assert len(caplog.records) == 2
