"""Broker faults, short versions (issue 16; the long one is
tools/reliability_cases/broker_faults.py): one real daemon and conductor
callers on a RabbitMQ node of the module's own, its broker stopped and
started, and its connections cut, while calls are in flight."""
from __future__ import annotations

import json
import time

import pytest

from compute_agent.messaging import messaging
from tests.functional.helpers import wait_for
from tests.functional.private_services import PrivateRabbitMQ
from tests.reliability.broker_faults import CALL_TIMEOUT, BrokerAgent, Conductor, seconds_until_served

# Failed probes the outage lasts: the counter must move while nothing is said.
OUTAGE_PROBES = 3


@pytest.fixture(scope="module")
def broker():
    node = PrivateRabbitMQ()
    try:
        yield node.start()
    finally:
        node.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, placement, broker):
    """One daemon for the module: every test leaves it serving, holding
    nothing."""
    agent = BrokerAgent(tmp_path_factory.mktemp("agent"), placement.url, broker)
    conductor = Conductor(agent, placement.url)
    agent.start(conductor.api)
    conductor.close()
    yield agent
    agent.stop()


@pytest.fixture
def conductor(daemon, placement):
    c = Conductor(daemon, placement.url)
    yield c
    c.close()


def test_a_broker_outage_during_calls(daemon, conductor, broker):
    """The broker's application stopped under two callers building and
    deleting: calls in flight fail with MessagingTimeout within their
    timeout, their retries (same uuids) claim nothing twice and lose
    nothing; the daemon serves again by itself once the broker is back.
    Issue 15: one line when the broker goes away, one when it is back,
    nothing in between but the counter in the cycle record, which
    ``compute-agent-manage status`` shows; the rabbit driver's own lines
    about its reconnections are DEBUG."""
    mark = daemon.mark()
    conductor.start()
    wait_for(lambda: conductor.ledger.calls >= 4, timeout=30)
    broker.stop_app()
    try:
        wait_for(lambda: daemon.broker_in_record()["failures"] >= OUTAGE_PROBES, timeout=30)
        checks = {c["check"]: c for c in json.loads(
            daemon.manage("status", "--json").stdout)["checks"]}
    finally:
        broker.start_app()
    back_in = seconds_until_served(conductor.api, daemon.name)
    calls_when_back = conductor.ledger.calls
    wait_for(lambda: conductor.ledger.calls >= calls_when_back + 4, timeout=30)
    conductor.stop()

    assert conductor.violations() == []
    assert sum(conductor.ledger.timeouts.values()) >= 1
    assert back_in < 15, f"served again {back_in:.1f} s after the broker returned"
    url = f"rabbit://127.0.0.1:{broker.port}/"
    assert [line.split(" [-] ")[1] for line in daemon.down_lines(mark)] == [
        f"the message broker at {url} did not answer (connection refused)"]
    # The cycle after the broker's return says it is back: served again
    # (the server reconnects by itself) may come first.
    wait_for(lambda: daemon.broker_in_record()["health"] == "up", timeout=30)
    back = daemon.back_lines(mark)
    assert len(back) == 1 and f"the message broker at {url} is back after" in back[0]
    assert daemon.driver_noise(mark) == []
    assert checks["agent_sees"]["line"].startswith(
        f"the agent's cycles: the message broker at {url} did not answer")
    assert checks["broker"]["level"] == "broken"


def test_a_call_while_the_broker_is_away_times_out_within_its_timeout(
        daemon, conductor, broker):
    """Before: oslo.messaging retried the send for ever, and the caller's
    timeout started only once the broker took the request (a 5 s call
    waited 21 s, the whole outage)."""
    broker.stop_app()
    try:
        started = time.monotonic()
        with pytest.raises(messaging.MessagingTimeout) as caught:
            conductor.api.get_host_info(daemon.name)
        took = time.monotonic() - started
    finally:
        broker.start_app()
    assert CALL_TIMEOUT <= took < CALL_TIMEOUT + 1, took
    assert f"the message broker did not take it within {CALL_TIMEOUT:g}s" in str(caught.value)
    seconds_until_served(conductor.api, daemon.name)


def test_connections_cut_during_calls(daemon, conductor, broker):
    """close_all_connections: the broker stays, every connection (the
    daemon's server, its replies, the callers') is cut in the middle of
    whatever it carried, three times."""
    mark = daemon.mark()
    conductor.start()
    wait_for(lambda: conductor.ledger.calls >= 4, timeout=30)
    for _ in range(3):
        broker.close_all_connections()
        # Half a second apart: each cut meets the connections made again
        # after the one before, and the calls they carry.
        time.sleep(0.5)
    seconds_until_served(conductor.api, daemon.name)
    calls = conductor.ledger.calls
    wait_for(lambda: conductor.ledger.calls >= calls + 3, timeout=30)
    conductor.stop()

    assert conductor.violations() == []
    # Cut connections come back at once: not an outage, and not a line.
    assert daemon.down_lines(mark) == [] and daemon.driver_noise(mark) == []
