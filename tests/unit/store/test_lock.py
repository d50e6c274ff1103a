"""The state directory's lock: one holder at a time, its pid in the file
for whoever finds it taken."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from compute_agent.store import lock
from compute_agent.store.errors import StateDirectoryInUse, StateDirectoryUnusable


def test_the_state_directory_has_one_holder(tmp_path):
    held = lock.acquire(str(tmp_path))
    assert (tmp_path / "lock").read_text() == f"{os.getpid()}\n"
    assert (tmp_path / "lock").stat().st_mode & 0o777 == 0o600
    # Another process: flock locks belong to the open file, so a second
    # open in this process would conflict the same way.
    code = (f"from compute_agent.store import lock\n"
            f"from compute_agent.store.errors import StateDirectoryInUse\n"
            f"try:\n    lock.acquire({str(tmp_path)!r})\n"
            f"except StateDirectoryInUse as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert f"state directory {tmp_path} is in use by another agent (pid {os.getpid()})" in out
    held.release()
    lock.acquire(str(tmp_path)).release()


def test_a_second_holder_in_this_process_is_refused_too(tmp_path):
    held = lock.acquire(str(tmp_path))
    with pytest.raises(StateDirectoryInUse, match=f"\\(pid {os.getpid()}\\): it holds "
                                                  f"{tmp_path / 'lock'}$"):
        lock.acquire(str(tmp_path))
    held.release()


def test_a_lock_file_left_by_a_holder_that_died_is_taken_and_rewritten(tmp_path):
    (tmp_path / "lock").write_text("4194303\n")
    held = lock.acquire(str(tmp_path))
    assert (tmp_path / "lock").read_text() == f"{os.getpid()}\n"
    held.release()


def test_a_holder_that_wrote_no_pid_yet_is_not_named(tmp_path):
    held = lock.acquire(str(tmp_path))
    os.truncate(tmp_path / "lock", 0)
    with pytest.raises(StateDirectoryInUse) as raised:
        lock.acquire(str(tmp_path))
    assert str(raised.value) == (f"state directory {tmp_path} is in use by another agent: "
                                 f"it holds {tmp_path / 'lock'}")
    held.release()


def test_a_state_directory_that_cannot_be_made_is_unusable_naming_it(tmp_path):
    a_file = tmp_path / "state"
    a_file.write_text("")
    with pytest.raises(StateDirectoryUnusable) as raised:
        lock.acquire(str(a_file / "below"))
    assert str(raised.value) == (f"cannot lock state directory {a_file / 'below'}: "
                                 f"{a_file / 'below'}: Not a directory")


def test_a_new_state_directory_is_made_private(tmp_path):
    held = lock.acquire(str(tmp_path / "new"))
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    held.release()
