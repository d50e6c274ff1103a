"""The heartbeat's verdicts and the destination's fence (compute_agent/rpc/heartbeat.py)."""
from __future__ import annotations

import threading
import time

import pytest

from compute_agent.exception import SourceHostUp
from compute_agent.rpc.heartbeat import HostState, SourceFence, judge


class Beats:
    """Answers for hosts in ``up``; with ``gate``, every check waits for it
    to open (a check that takes time), saying so in ``entered``."""

    down_after = 2.0

    def __init__(self, up: set[str], gate: threading.Event | None = None):
        self.up = up
        self.gate = gate
        self.entered = threading.Event()
        self.asked: list[str] = []

    def check(self, host: str):
        self.asked.append(host)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return judge(host, {"host": host} if host in self.up else None, time.time())


def fence_with(beats: Beats) -> SourceFence:
    fence = SourceFence(conf=None)
    fence._heartbeat = beats
    return fence


def test_an_answer_is_up_and_silence_is_down():
    assert judge("h", {"host": "h"}, 1.0).state is HostState.UP
    assert judge("h", None, 1.0).state is HostState.DOWN
    assert judge("h", {}, 1.0).up  # any answer at all is a live agent


def test_an_up_source_is_refused_every_time():
    beats = Beats(up={"src"})
    fence = fence_with(beats)
    for _ in range(2):
        with pytest.raises(SourceHostUp, match="src is up"):
            fence.require_down("src")
    assert beats.asked == ["src", "src"]  # an up verdict is never reused


def test_many_rebuilds_of_one_down_source_wait_for_one_check():
    gate = threading.Event()
    beats = Beats(up=set(), gate=gate)
    fence = fence_with(beats)
    threads = [threading.Thread(target=fence.require_down, args=("src",))
               for _ in range(10)]
    for t in threads:
        t.start()
    # The first check is under way (held open) while the others come in.
    assert beats.entered.wait(10)
    gate.set()
    for t in threads:
        t.join()
    fence.require_down("src")
    assert beats.asked == ["src"]
    fence.require_down("other")
    assert beats.asked == ["src", "other"]
