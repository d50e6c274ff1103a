"""The host's one RPC server (compute_agent/rpc/host_server.py) on kombu's
in-memory broker: both topics on its two queues and nothing more, a
request that did not come through the control exchange dropped, and the
loop's watch of it. (On RabbitMQ: tests/functional/test_host_server.py.)"""
from __future__ import annotations

import json
import logging
import threading
import types
import uuid

import kombu
import pytest
from oslo_config import cfg

from compute_agent import config
from compute_agent.dependencies import Dependencies, Dependency, Probe, Unknown
from compute_agent.messaging import TOPIC
from compute_agent.rpc import broker, heartbeat, host_server
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.errors import NoAnswer
from compute_agent.rpc.host_server import DEAF, LISTENER_DOWN, ServerWatch
from tests.waiting import wait_for

HOST = "h1"
MEMORY = "kombu+memory:////"


def memory_conf() -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf([])
    conf.set_override("host", HOST)
    conf.set_override("transport_url", MEMORY)
    return conf




def served_agent() -> types.SimpleNamespace:
    """What get_host_info and report_alive read of the agent."""
    tracker = types.SimpleNamespace(instance_count=lambda: 0, snapshot=lambda: ({}, [], {}))
    return types.SimpleNamespace(policy=types.SimpleNamespace(host=HOST, root_uuid="root"),
                                 manager=types.SimpleNamespace(tracker=tracker), last_tree=[])


@pytest.fixture
def served(memory_broker):
    conf = memory_conf()
    agent = served_agent()
    server = host_server.make_server(conf, agent)
    server.start()
    api = ComputeAgentAPI(conf, timeout=5)
    yield types.SimpleNamespace(conf=conf, agent=agent, server=server, api=api,
                                queues=memory_broker)
    api.close()
    server.stop()
    server.wait()


def test_both_topics_are_served_from_the_hosts_two_queues_and_no_other(served):
    assert served.api.get_host_info(HOST)["host"] == HOST
    beats = heartbeat.Heartbeat(served.conf, down_after=5)
    try:
        assert beats.check(HOST).report["instances"] == 0
    finally:
        beats.close()
    # The callers' reply queues aside: no fanout queue, no shared one.
    assert {q for q in served.queues if not q.startswith("reply_")} == set(
        host_server.host_queues(HOST))


def cast(exchange: str, routing_key: str, method: str, **args: object) -> None:
    """An RPC cast as oslo.messaging's rabbit driver puts it on the wire."""
    body = {"oslo.version": "2.0", "oslo.message": json.dumps(
        {"method": method, "args": args, "version": "1.0", "_unique_id": uuid.uuid4().hex})}
    with kombu.Connection("memory://") as connection:
        kombu.Producer(connection.channel()).publish(body, exchange=exchange,
                                                     routing_key=routing_key,
                                                     serializer="json")


def test_a_request_through_the_default_exchange_is_dropped(served, caplog):
    """Every agent may write to the default exchange (its answers go
    there), and it routes to any queue by name: one host's credentials
    would reach every other host's agent."""
    heartbeats = served.server.heartbeat
    with caplog.at_level(logging.WARNING, logger="compute_agent.rpc.host_server"):
        cast("", f"{TOPIC}.{HOST}", "report_alive")
        wait_for(lambda: any("published to exchange ''" in r.getMessage()
                             for r in caplog.records), 10)
    assert heartbeats.served == 0
    cast("openstack", f"{TOPIC}.{HOST}", "report_alive")
    wait_for(lambda: heartbeats.served == 1, 10)


def test_the_watch_sees_nothing_before_the_server_serves():
    assert isinstance(ServerWatch(memory_conf(), 1).probe(), Unknown)


def test_the_watch_finds_the_server_answering_its_own_heartbeat(served):
    watch = ServerWatch(served.conf, 1)
    watch.serving(served.server)
    url = "rabbit://memory_driver:1234/"  # what oslo.messaging calls kombu's memory transport
    for _ in range(3):
        served_before = served.server.heartbeat.served
        assert watch.probe() == Probe(Dependency.BROKER, url)
        # Each look casts the server's own heartbeat, which it serves.
        wait_for(lambda: served.server.heartbeat.served > served_before, 10)


def test_the_watch_says_a_server_given_nothing_since_its_last_look_is_deaf(
        served, monkeypatch):
    watch = ServerWatch(served.conf, 1)
    watch.serving(served.server)
    sent: list[str] = []
    # The server's own casts lost on the way (its queue deleted under it).
    monkeypatch.setattr(served.server, "cast_own_heartbeat", lambda: sent.append("cast"))
    assert watch.probe().problem is None
    assert watch.probe().problem == DEAF
    assert sent == ["cast", "cast"]


def unbind(queue: str) -> None:
    """``queue``'s binding to the control exchange removed: nothing routes
    to it, and its consumer is told nothing (as RabbitMQ loses a binding)."""
    with kombu.Connection("memory://") as connection:
        connection.channel().queue_unbind(queue, exchange="openstack", routing_key=queue)


def test_a_deaf_server_connects_again_with_its_queues_declared_anew_and_serves(served):
    for queue in host_server.host_queues(HOST):
        unbind(queue)
    watch = ServerWatch(served.conf, 1)
    watch.serving(served.server)
    assert watch.probe().problem is None  # its cast is lost
    heartbeats = served.server.heartbeat
    lost = heartbeats.served
    assert watch.probe().problem == DEAF
    # Connected again in the listener's thread, which then casts to itself:
    # the first look after finds it served, not the second (a cycle later).
    wait_for(lambda: heartbeats.served > lost, 20)
    assert watch.probe().problem is None
    assert served.api.get_host_info(HOST)["host"] == HOST


def test_a_connection_asked_again_before_it_is_made_is_asked_once(served):
    """Made again behind a node that hangs, a connection takes its timeout:
    one asked at each deaf look (each cycle) piled up behind it."""
    pending = served.server._listener._message_operations_handler._tasks
    for _ in range(5):
        served.server.connect_again()
    assert pending.qsize() <= 1
    wait_for(lambda: served.server.heartbeat.served == 1, 20)  # made, and cast to itself
    served.server.connect_again()
    wait_for(lambda: served.server.heartbeat.served == 2, 20)


def test_a_listener_down_is_said_by_a_login_or_after_a_second_look(served, monkeypatch):
    """A connection cut and made again is no outage; a broker that does
    not answer is said as the login finds it; one that takes logins while
    the listener stays down, at the second look."""
    watch = ServerWatch(served.conf, 1)
    watch.serving(served.server)
    monkeypatch.setattr(served.server, "connected_to", lambda: None)
    url = "rabbit://127.0.0.1:5672/"
    answer = Probe(Dependency.BROKER, url, "did not answer (connection refused)")
    monkeypatch.setattr(broker, "probe", lambda conf, timeout: answer)
    assert watch.probe() == answer
    answer = Probe(Dependency.BROKER, url)
    assert isinstance(watch.probe(), Unknown)  # the broker back: a first look
    assert watch.probe() == Probe(Dependency.BROKER, url, LISTENER_DOWN)
    monkeypatch.setattr(served.server, "connected_to", lambda: url)
    assert watch.probe().problem is None


def test_bug_the_brokers_return_was_said_twice_when_the_listener_came_back_later(
        served, monkeypatch, caplog):
    """The broker took logins again a cycle before the server's listener
    had its connection back: 'is back', 'takes logins, but ...', 'is back'
    again. One line down, one back."""
    board = Dependencies()
    watch = ServerWatch(served.conf, 1)
    watch.serving(served.server)
    url = "rabbit://127.0.0.1:5672/"
    monkeypatch.setattr(served.server, "connected_to", lambda: None)
    monkeypatch.setattr(broker, "probe", lambda conf, timeout: Probe(
        Dependency.BROKER, url, "did not answer (connection refused)"))
    broker.observe(board, watch.probe())
    monkeypatch.setattr(broker, "probe", lambda conf, timeout: Probe(Dependency.BROKER, url))
    with caplog.at_level(logging.INFO, logger="compute_agent.dependencies"):
        broker.observe(board, watch.probe())  # logins taken, the listener not back yet
        broker.observe(board, watch.probe())  # and still not: said so
        monkeypatch.setattr(served.server, "connected_to", lambda: url)
        broker.observe(board, watch.probe())
    assert [r.getMessage() for r in caplog.records if "is back" in r.getMessage()] == [
        f"the message broker at {url} is back after 2 failed cycles, 0 s"]


def test_a_stopped_server_is_connected_to_nothing(memory_broker):
    """The loop may look between the server's stop and its own (the
    daemon stops the server first): the listener's connection, given back
    to the driver, is no broker, and the look does not raise (it ended the
    update loop's thread, seen at the end of a fleet run)."""
    server = host_server.make_server(memory_conf(), served_agent())
    server.start()
    assert server.connected_to() == "rabbit://memory_driver:1234/"
    server.stop()
    server.wait()
    assert server.connected_to() is None


def test_bug_a_broker_gone_before_the_listener_saw_it_was_said_as_a_cast_not_taken(
        served, monkeypatch):
    """The broker stopped; the listener's connection not yet seen to end,
    the watch's cast failed first: 'did not take a message', where a
    listener that had seen it said 'did not answer (connection refused)'.
    The same line either way: the login's."""
    watch = ServerWatch(served.conf, 1)
    watch.serving(served.server)

    def refused() -> None:
        raise ConnectionRefusedError(111, "Connection refused")
    monkeypatch.setattr(served.server, "cast_own_heartbeat", refused)
    url = "rabbit://127.0.0.1:5672/"
    gone = Probe(Dependency.BROKER, url, "did not answer (connection refused)")
    monkeypatch.setattr(broker, "probe", lambda conf, timeout: gone)
    assert watch.probe() == gone
    # A broker that takes logins and not the cast is said so.
    monkeypatch.setattr(broker, "probe", lambda conf, timeout: Probe(Dependency.BROKER, url))
    assert watch.probe().problem.startswith("did not take a message")


# --- the stop's drain: calls counted to their reply, none taken once closed ---

class HeldHostInfo:
    """An agent whose get_host_info waits until ``release``: a call in
    flight."""

    def __init__(self) -> None:
        self._served = served_agent()
        self.policy, self.manager = self._served.policy, self._served.manager
        self.asked = threading.Event()
        self.release = threading.Event()

    @property
    def last_tree(self) -> list:
        self.asked.set()
        self.release.wait(10)
        return []


def test_a_call_is_in_flight_until_answered_and_the_drain_waits_for_it(memory_broker):
    conf = memory_conf()
    agent = HeldHostInfo()
    server = host_server.make_server(conf, agent)  # type: ignore[arg-type]
    server.start()
    api = ComputeAgentAPI(conf, timeout=10)
    answers: list[dict] = []
    caller = threading.Thread(target=lambda: answers.append(api.get_host_info(HOST)))
    try:
        caller.start()
        assert agent.asked.wait(10)
        assert server.in_flight.close() == 1
        agent.release.set()
        assert server.in_flight.wait(10) == ()
        # Counted until its reply was sent: the caller has it.
        caller.join(10)
        assert answers and answers[0]["host"] == HOST
    finally:
        agent.release.set()
        api.close()
        server.stop()
        server.wait()


def test_once_closed_the_heartbeat_is_answered_and_an_api_call_is_not_served(
        memory_broker):
    """A host that drains is up; a call that came after the stop began is
    not served (on RabbitMQ the next start serves it:
    tests/functional/test_graceful_stop.py)."""
    conf = memory_conf()
    server = host_server.make_server(conf, served_agent())  # type: ignore[arg-type]
    server.start()
    api = ComputeAgentAPI(conf, timeout=1)
    beats = heartbeat.Heartbeat(conf, down_after=5)
    try:
        server.in_flight.close()
        with pytest.raises(NoAnswer):
            api.get_host_info(HOST)
        assert beats.check(HOST).up
        assert server.in_flight.count == 0
    finally:
        beats.close()
        api.close()
        server.stop()
        server.wait()
