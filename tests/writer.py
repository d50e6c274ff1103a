"""Holding the store's writer thread, so that what tests submit meanwhile
queues up for one batch."""
from __future__ import annotations

import threading

from compute_agent.store.writer import GroupCommitter, Job
from tests.waiting import wait_for


def hold_writer(commits: GroupCommitter) -> threading.Event:
    """Keep the writer busy in a job of its own until the returned event is
    set."""
    inside, gate = threading.Event(), threading.Event()
    commits.submit(Job(lambda conn: (inside.set(), gate.wait(10))))
    assert inside.wait(5), "the writer did not take the holding job"
    return gate


def wait_queued(commits: GroupCommitter, n: int) -> None:
    wait_for(lambda: commits.queued() >= n, timeout=5, interval=0.001)
    assert commits.queued() == n
