"""The installation of earlier versions: a clone without the pinned
history fails, naming the commit and the shallow clone, never skips."""
from __future__ import annotations

import subprocess

import pytest

from tests.upgrade.old_version import REPO, HistoryMissing, check_in_history
from tests.upgrade.pinned import PINNED


def test_a_shallow_clone_fails_naming_the_missing_commit_and_the_fix(tmp_path):
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(shallow)],
                   check=True, timeout=120)
    oldest = PINNED[0].commit
    with pytest.raises(HistoryMissing, match=f"commit {oldest} is not in this clone's "
                       r"history \(a shallow clone: run 'git fetch --unshallow'\)"):
        check_in_history(oldest, repo=shallow)


def test_every_pinned_commit_is_in_this_clones_history():
    for pinned in PINNED:
        check_in_history(pinned.commit)
