"""A small private file of the agent's, replaced whole: its new text, or
after a failure at any point its old one, never a part."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from compute_agent.store import atomic_file
from compute_agent.store.atomic_file import write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_private_in_a_private_directory(tmp_path):
    path = tmp_path / "state" / "compute_id"
    old_umask = os.umask(0)
    try:
        write_private(path, "text\n")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "text\n"
    assert (mode(path), mode(path.parent)) == (0o600, 0o700)
    assert sorted(p.name for p in path.parent.iterdir()) == ["compute_id"]


def test_a_file_is_replaced_whole(tmp_path):
    path = tmp_path / "compute_id"
    write_private(path, "a much longer first text\n")
    write_private(path, "short\n")
    assert path.read_text() == "short\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compute_id"]


def test_what_a_write_that_crashed_left_aside_is_written_over(tmp_path):
    path = tmp_path / "compute_id"
    path.with_suffix(".tmp").write_text("a much longer text a crash left behind\n")
    write_private(path, "short\n")
    assert path.read_text() == "short\n"


def test_a_write_that_fails_before_the_rename_leaves_the_old_text(tmp_path, monkeypatch):
    path = tmp_path / "compute_id"
    write_private(path, "old\n")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic_file.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_private(path, "new\n")
    assert path.read_text() == "old\n"
