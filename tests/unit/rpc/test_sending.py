"""A call ends within its timeout whatever the broker does, and says what
it waits for (compute_agent/rpc/sending.py)."""
from __future__ import annotations

import threading

import pytest

from compute_agent.dependencies import Dependency, Probe
from compute_agent.messaging import messaging
from compute_agent.rpc import sending
from compute_agent.rpc.errors import BrokerUnreachable
from compute_agent.rpc.sending import BoundedSender, Waiting, WaitingFor
from tests.unit.clocks import SleepingClock

URL = "rabbit://127.0.0.1:5999/"


@pytest.fixture
def broker_down(monkeypatch):
    monkeypatch.setattr(sending.broker, "probe", lambda conf, timeout: Probe(
        Dependency.BROKER, URL, "did not answer (connection refused)"))


@pytest.fixture
def broker_up(monkeypatch):
    monkeypatch.setattr(sending.broker, "probe",
                        lambda conf, timeout: Probe(Dependency.BROKER, URL))


def test_a_broker_that_never_takes_the_call_ends_it_at_its_timeout_unsent(broker_down):
    clock = SleepingClock()
    told: list[Waiting] = []
    sender = BoundedSender(None, told.append, clock, clock.sleep)
    sent: list[float] = []
    started = clock()
    with pytest.raises(BrokerUnreachable, match="build_instance to h1: the message broker "
                       "did not take it within 10s"):
        sender.call("h1", "build_instance", 10, sent.append)
    assert sent == []  # asked the broker first each time: never handed over
    assert 10 <= clock() - started <= 10 + sending.RESEND_PAUSE_SECONDS
    # Told once, after WAIT_NOTICE_SECONDS, with the probe's finding.
    [waiting] = told
    assert waiting.what is WaitingFor.BROKER
    assert "connection refused" in waiting.line and "giving up in" in waiting.line
    assert waiting.left <= 10 - sending.WAIT_NOTICE_SECONDS


def test_sends_the_broker_refuses_are_retried_until_one_goes_through(broker_up):
    clock = SleepingClock()
    sender = BoundedSender(None, None, clock, clock.sleep)
    attempts: list[float] = []

    def send(seconds: float) -> str:
        attempts.append(seconds)
        if len(attempts) < 3:
            raise messaging.MessageDeliveryFailure("no route")
        return "answer"

    assert sender.call("h1", "get_host_info", 10, send) == "answer"
    # Each attempt may wait for what is left of the call's timeout, no more.
    assert len(attempts) == 3 and attempts[0] <= 10 and attempts[2] < attempts[0]


def test_a_timed_out_answer_is_the_callers_not_the_brokers(broker_up):
    sender = BoundedSender(None)

    def send(seconds: float) -> str:
        raise messaging.MessagingTimeout("no reply")

    with pytest.raises(messaging.MessagingTimeout) as raised:
        sender.call("h1", "get_host_info", 5, send)
    assert not isinstance(raised.value, BrokerUnreachable)


def test_a_long_wait_for_an_answer_is_told_once_while_it_lasts(monkeypatch):
    clock = SleepingClock()

    def slow_probe(conf, timeout: float) -> Probe:
        clock.advance(sending.WAIT_NOTICE_SECONDS)  # the notice is due as the send starts
        return Probe(Dependency.BROKER, URL)

    monkeypatch.setattr(sending.broker, "probe", slow_probe)
    told: list[Waiting] = []
    seen = threading.Event()

    def tell(waiting: Waiting) -> None:
        told.append(waiting)
        seen.set()

    sender = BoundedSender(None, tell, clock, clock.sleep)

    def send(seconds: float) -> str:
        # The broker took the call; its answer comes only once the wait was told.
        assert seen.wait(10)
        return "answer"

    assert sender.call("h1", "build_instance", 60, send) == "answer"
    [waiting] = told
    assert waiting.what is WaitingFor.ANSWER
    assert waiting.line.startswith("waiting for h1's answer to build_instance; giving up in")


def test_an_answer_in_time_tells_nothing(broker_up):
    told: list[Waiting] = []
    sender = BoundedSender(None, told.append)
    assert sender.call("h1", "get_host_info", 60, lambda seconds: "answer") == "answer"
    assert told == []



class Broker:
    """broker.probe's answers, one per probe; each probe's timeout recorded."""

    def __init__(self, *problems: str | None):
        self.problems = list(problems)
        self.probed: list[float] = []

    def probe(self, conf: object, timeout: float) -> Probe:
        self.probed.append(timeout)
        return Probe(Dependency.BROKER, URL, self.problems.pop(0))


def test_the_broker_is_asked_before_a_clients_first_call_only(monkeypatch):
    broker = Broker(None)
    monkeypatch.setattr(sending.broker, "probe", broker.probe)
    clock = SleepingClock()
    sender = BoundedSender(None, None, clock, clock.sleep)
    assert sender.call("h1", "get_host_info", 60, lambda seconds: "a") == "a"
    assert sender.call("h1", "get_host_info", 60, lambda seconds: "b") == "b"
    assert broker.probed == [60]


def test_a_send_not_taken_is_sent_again_after_a_pause_waiting_what_is_left(monkeypatch):
    broker = Broker("did not answer (connection refused)", None)
    monkeypatch.setattr(sending.broker, "probe", broker.probe)
    clock = SleepingClock()
    sender = BoundedSender(None, None, clock, clock.sleep)
    attempts: list[float] = []

    def send(seconds: float) -> str:
        attempts.append(seconds)
        if len(attempts) == 1:
            raise messaging.MessageDeliveryFailure("no route")
        return "answer"

    assert sender.call("h1", "get_host_info", 10, send) == "answer"
    # Down at the first probe, up at the second; the first send was not
    # taken either, and the answers' connection was made: no third probe.
    assert broker.probed == [10, 9.5]
    assert clock.slept == [sending.RESEND_PAUSE_SECONDS] * 2
    assert attempts == [9.5, 9.0]


def test_bug_a_send_given_up_at_its_timeout_built_after_its_delete(broker_up):
    """A send is waited for to its end, its outcome the call's: it runs in
    the caller's thread. Given up (a 3 s call ended at 3.5 s, its send left
    in a thread), its publish reached the agent after the caller's retry,
    and the delete after it: the instance was built again, deleted for the
    caller."""
    sender = BoundedSender(None)
    caller = threading.current_thread()

    def send(seconds: float) -> str:
        assert threading.current_thread() is caller
        return "built"

    assert sender.call("h1", "build_instance", 0.3, send) == "built"
