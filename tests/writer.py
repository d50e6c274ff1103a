"""Holding the store's writer thread, so that what tests submit meanwhile
queues up for one batch."""
from __future__ import annotations

import threading
import time

from compute_agent.store.writer import GroupCommitter, Job


def hold_writer(commits: GroupCommitter) -> threading.Event:
    """Keep the writer busy in a job of its own until the returned event is
    set."""
    inside, gate = threading.Event(), threading.Event()
    commits.submit(Job(lambda conn: (inside.set(), gate.wait(10))))
    assert inside.wait(5), "the writer did not take the holding job"
    return gate


def wait_queued(commits: GroupCommitter, n: int) -> None:
    deadline = time.monotonic() + 5
    while commits.queued() < n and time.monotonic() < deadline:
        time.sleep(0.001)
    assert commits.queued() == n
