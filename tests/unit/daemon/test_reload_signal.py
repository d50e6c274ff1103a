"""SIGHUP asks the agent to drop its Placement cache
(compute_agent/daemon/reload_signal.py): one that comes before the agent
exists is kept for it, not lost and not the end of the process."""
from __future__ import annotations

import os
import signal

import pytest

from compute_agent.daemon.reload_signal import ReloadSignal


class CacheDrops:
    """An agent that counts the times its cache is dropped."""

    def __init__(self) -> None:
        self.dropped = 0

    def drop_cache(self) -> None:
        self.dropped += 1


@pytest.fixture
def reload_signal():
    """A ReloadSignal installed as compute-agent installs it; the test
    process's own SIGHUP handler back after the test."""
    before = signal.getsignal(signal.SIGHUP)
    installed = ReloadSignal()
    installed.install()
    yield installed
    signal.signal(signal.SIGHUP, before)


def sighup() -> None:
    # Sent to this process by its main thread, which runs the handler
    # before the next line.
    os.kill(os.getpid(), signal.SIGHUP)


def test_a_sighup_before_the_agent_exists_drops_its_cache_once_it_does(reload_signal):
    sighup()
    sighup()  # two before the agent: one drop is what they ask
    agent = CacheDrops()
    assert reload_signal.deliver_to(agent) is True
    assert agent.dropped == 1


def test_without_an_early_sighup_the_agent_keeps_its_cache(reload_signal):
    agent = CacheDrops()
    assert reload_signal.deliver_to(agent) is False
    assert agent.dropped == 0


def test_a_sighup_once_the_agent_exists_drops_its_cache_each_time(reload_signal):
    agent = CacheDrops()
    reload_signal.deliver_to(agent)
    sighup()
    sighup()
    assert agent.dropped == 2


def test_an_early_sighup_is_handed_over_once(reload_signal):
    sighup()
    first, second = CacheDrops(), CacheDrops()
    assert reload_signal.deliver_to(first) is True
    assert reload_signal.deliver_to(second) is False
    assert (first.dropped, second.dropped) == (1, 0)
