"""The state directory's lock: one holder at a time, its pid in the file
for whoever finds it taken."""
from __future__ import annotations

import os
import subprocess
import sys

from compute_agent.store import lock


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
