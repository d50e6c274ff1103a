"""The heartbeat's verdicts and the destination's fence (compute_agent/rpc/heartbeat.py)."""
from __future__ import annotations

import threading
import time

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.dependencies import Dependency, Probe
from compute_agent.exception import BrokerUnavailable, SourceHostUp
from compute_agent.rpc import heartbeat, sending
from compute_agent.rpc.errors import BrokerUnreachable
from compute_agent.rpc.heartbeat import Heartbeat, HostState, SourceFence, judge
from compute_agent.rpc.sending import BoundedSender
from tests.unit.clocks import FakeClock


class Beats:
    """Answers for hosts in ``up``; with ``gate``, every check waits for it
    to open (a check that takes time), saying so in ``entered``."""

    down_after = 2.0

    def __init__(self, up: set[str], gate: threading.Event | None = None,
                 answers_lost: bool = False):
        self.up = up
        self.gate = gate
        self.lost = answers_lost
        self.entered = threading.Event()
        self.asked: list[str] = []
        self.closed = threading.Semaphore(0)  # released once per close

    def close(self) -> None:
        self.closed.release()

    def answers_lost(self) -> bool:
        return self.lost

    def check(self, host: str):
        self.asked.append(host)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return judge(host, {"host": host} if host in self.up else None, time.time())


def fence_with(beats) -> SourceFence:
    return SourceFence(conf=None, heartbeats=lambda: beats)


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
    # Each check's client closed after it: the destination keeps none.
    assert beats.closed.acquire(timeout=10) and beats.closed.acquire(timeout=10)


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


def test_silence_while_the_answers_were_dropped_is_no_verdict():
    """The fence's reply queue lost (deleted, and the driver never told):
    an up source's answer was dropped, so silence is not down. Was: down,
    and an instance the source still runs rebuilt elsewhere."""
    fence = fence_with(Beats(up=set(), answers_lost=True))
    with pytest.raises(BrokerUnavailable, match="reply queue lost"):
        fence.require_down("src")
    fence = fence_with(Beats(up=set()))
    fence.require_down("src")


class SleepingClock(FakeClock):
    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


def test_a_question_the_broker_never_took_is_no_verdict(tmp_path, monkeypatch):
    """Unknown is never down: a heartbeat that could not be sent raises,
    where a question sent and not answered is a down verdict (was: the
    check retried the connection for ever, and compute-agent-ctl hosts
    never exited)."""
    conf_file = tmp_path / "agent.conf"
    conf_file.write_text("[DEFAULT]\nhost = h0\ntransport_url = fake://\n"
                         "[placement]\nauth_type = placement_noauth2\n"
                         "endpoint = http://127.0.0.1:1/\n")
    conf = load_config(["--config-file", str(conf_file)])
    clock = SleepingClock()
    monkeypatch.setattr(heartbeat, "BoundedSender",
                        lambda conf, on_wait: BoundedSender(conf, on_wait, clock, clock.sleep))
    monkeypatch.setattr(sending.broker, "probe", lambda conf, timeout: Probe(
        Dependency.BROKER, "rabbit://127.0.0.1:5999/", "did not answer (connection refused)"))
    beats = Heartbeat(conf, down_after=5)
    try:
        with pytest.raises(BrokerUnreachable):
            beats.check("h1")
        fence = fence_with(beats)
        with pytest.raises(BrokerUnavailable, match="whether it is down is unknown"):
            fence.require_down("h1")
    finally:
        beats.close()
