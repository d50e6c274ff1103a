"""A caller's reply queue, found lost and mended
(compute_agent/rpc/replies.py). On a real broker, the cancel the driver
misses: tests/functional/test_reply_queue.py."""
from __future__ import annotations

import threading
import types

import pytest

from compute_agent.dependencies import Unknown
from compute_agent.rpc import broker, replies
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.errors import NoAnswer
from compute_agent.rpc.replies import ReplyQueue
from tests.unit.rpc.test_host_server import memory_conf
from tests.waiting import wait_for

QUEUE = "reply_h1:conductor:1"


def client(reply_queue: str | None = QUEUE) -> types.SimpleNamespace:
    """An RPC client as ReplyQueue reads it: its driver's reply queue (None
    before its first call) and the connection its answers come on."""
    driver = types.SimpleNamespace(_reply_q=reply_queue, _reply_q_conn="its connection")
    return types.SimpleNamespace(transport=types.SimpleNamespace(_driver=driver))


@pytest.fixture
def broker_says(monkeypatch):
    """What the broker answers, in turn, to how many consumers QUEUE has;
    the last answer stands."""
    answers: list[int | Unknown] = []

    def consumers(conf, queue, timeout):
        assert queue == QUEUE
        return answers.pop(0) if len(answers) > 1 else answers[0]
    monkeypatch.setattr(broker, "consumers", consumers)
    monkeypatch.setattr(replies, "MADE_AGAIN_LOOK_SECONDS", 0.01)
    return answers


@pytest.fixture
def cuts(monkeypatch):
    made: list[str] = []
    monkeypatch.setattr(replies, "cut", made.append)
    return made


@pytest.mark.parametrize("answer, lost", [(0, True), (1, False), (Unknown("down"), False)])
def test_a_reply_queue_is_lost_when_the_broker_says_it_has_no_consumer(
        broker_says, answer, lost):
    broker_says.append(answer)
    assert ReplyQueue(None, client()).lost() is lost
    assert not ReplyQueue(None, client(reply_queue=None)).lost()  # it never called


def test_a_lost_reply_queue_has_its_connection_cut_once_until_it_is_back(broker_says, cuts):
    broker_says.extend([0, 0, 0, 1])
    replies_ = ReplyQueue(None, client())
    replies_.mend()
    assert cuts == ["its connection"]
    assert broker_says == [1]  # the mend waited for the consumer back
    replies_.mend()
    assert cuts == ["its connection"]


def test_calls_that_time_out_while_the_connection_is_made_again_cut_it_no_more(
        broker_says, cuts, monkeypatch):
    """A second cut would cut the connection made again, and the answers
    to the calls in flight."""
    broker_says.append(0)
    replies_ = ReplyQueue(None, client())
    mending = threading.Thread(target=replies_.mend)
    mending.start()
    wait_for(lambda: cuts, 10)
    for _ in range(3):
        replies_.mend()
    broker_says[:] = [1]
    mending.join(10)
    assert cuts == ["its connection"]


def test_a_call_that_got_no_answer_has_the_reply_queue_mended(memory_broker, monkeypatch):
    mended = threading.Event()
    monkeypatch.setattr(ReplyQueue, "mend", lambda self: mended.set())
    api = ComputeAgentAPI(memory_conf(), timeout=0.5)
    try:
        with pytest.raises(NoAnswer):
            api.get_host_info("nobody")
        assert mended.wait(10)
    finally:
        api.close()


def test_bug_a_client_closed_under_a_mend_was_taken_for_a_lost_reply_queue(cuts, monkeypatch):
    """Was: compute-agent-ctl's call timed out, its mend started in the
    background, and the command closed its client while the mend asked
    the broker, deleting its reply queue: the mend found the queue gone,
    said 'The reply queue None has no consumer' and failed on the closed
    driver's connection (a traceback on ctl's stderr)."""
    the_client = client()
    replies_ = ReplyQueue(None, the_client)
    closes: list[object] = []

    def close_client(conf, c) -> None:
        closes.append(c)
        driver = c.transport._driver
        driver._reply_q = driver._reply_q_conn = None  # as oslo.messaging's cleanup leaves it

    def consumers(conf, queue, timeout) -> int:
        replies_.close()  # the command ends while the broker is asked
        return 0  # the queue deleted as the client closed

    monkeypatch.setattr(broker, "close_client", close_client)
    monkeypatch.setattr(broker, "consumers", consumers)
    replies_.mend()
    assert closes == [the_client] and cuts == []


def test_a_mend_under_way_stops_waiting_when_the_client_closes(broker_says, cuts, monkeypatch):
    monkeypatch.setattr(broker, "close_client", lambda conf, c: None)
    broker_says.append(0)
    replies_ = ReplyQueue(None, client())
    mending = threading.Thread(target=replies_.mend)
    mending.start()
    wait_for(lambda: cuts, 10)
    replies_.close()
    mending.join(5)
    assert not mending.is_alive()
