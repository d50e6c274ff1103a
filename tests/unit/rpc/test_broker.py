"""compute_agent/rpc/broker.py: the broker's state from the loop's probe, one line each
way; the rabbit driver's reconnection lines demoted to DEBUG, its other
lines left alone; py-amqp's warning about the cancel of our own fanout
consumer as a server closes demoted too; the probe's findings in a few
words."""
from __future__ import annotations

import logging

import pytest
from amqp import spec as amqp_spec
from amqp.exceptions import AccessRefused

from compute_agent.dependencies import Dependencies, Dependency, Health, Probe, Unknown
from compute_agent.rpc import broker

URL = "rabbit://127.0.0.1:5672/"
DOWN = Probe(Dependency.BROKER, URL, "did not answer (connection refused)")
UP = Probe(Dependency.BROKER, URL)


def test_an_outage_over_many_probes_is_one_line_each_way_and_a_counter(caplog):
    board = Dependencies(clock=iter(range(100, 200, 10)).__next__)
    caplog.set_level(logging.DEBUG, logger="compute_agent.dependencies")
    for answer in [UP, DOWN, DOWN, DOWN, DOWN, UP, UP]:
        broker.observe(board, answer)
        if answer is DOWN:
            failures = board.snapshot()[Dependency.BROKER].failures
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]
    assert said == [
        ("WARNING", f"the message broker at {URL} did not answer (connection refused)"),
        ("INFO", f"the message broker at {URL} is back after 4 failed cycles, 40 s")]
    assert failures == 4
    assert board.snapshot()[Dependency.BROKER].total_failures == 4


def test_a_transport_the_probe_cannot_ask_is_not_observed():
    board = Dependencies()
    broker.observe(board, Unknown("not checked: the kafka transport"))
    assert board.snapshot()[Dependency.BROKER].health is Health.UNKNOWN


# The rabbit driver's format strings (oslo.messaging 18): its reconnection
# loop, and lines that are not about it.
RECONNECT = [
    ("ERROR", "[%(connection_id)s] AMQP server on %(hostname)s:%(port)s is unreachable: "
              "%(err_str)s. Trying again in %(sleep_time)d seconds."),
    ("ERROR", "[%(connection_id)s] AMQP server %(hostname)s:%(port)s closed the "
              "connection. Check login credentials: %(err_str)s"),
    ("ERROR", "Connection failed: %s (retrying in %s seconds)"),
    ("INFO", "A recoverable connection/channel error occurred, trying to reconnect: %s"),
    ("INFO", "[%(connection_id)s] Reconnected to AMQP server on %(hostname)s:%(port)s via "
             "[%(transport)s] client with port %(client_port)s."),
]
OTHERS = [
    ("ERROR", "Failed to publish message to topic '%(topic)s': %(err_str)s"),
    ("ERROR", "Unable to connect to AMQP server on %(hostname)s:%(port)s after "
              "%(retry)s tries: %(err_str)s"),
    ("ERROR", "The broker has blocked the connection: %s"),
]


@pytest.fixture
def driver_log(caplog):
    logger = logging.getLogger(broker.DRIVER_LOGGER)
    level = logger.level
    broker.quiet_reconnect_lines()
    broker.quiet_reconnect_lines()  # installed once only
    assert len([f for f in logger.filters
                if isinstance(f, broker.ReconnectLinesToDebug)]) == 1
    yield logger
    logger.setLevel(level)
    for f in [f for f in logger.filters if isinstance(f, broker.ReconnectLinesToDebug)]:
        logger.removeFilter(f)


def emit(logger: logging.Logger, level: str, template: str) -> None:
    args = ({"connection_id": "c", "hostname": "h", "port": 1, "err_str": "e",
             "sleep_time": 1, "transport": "amqp", "client_port": 2, "topic": "t",
             "retry": 1},) if "%(" in template else ("e", 1)[:template.count("%s")]
    logger.log(logging.getLevelName(level), template, *args)


def test_the_drivers_reconnection_lines_are_dropped_at_info(driver_log, caplog):
    driver_log.setLevel(logging.INFO)
    for level, template in RECONNECT + OTHERS:
        emit(driver_log, level, template)
    assert [(r.levelname, r.msg) for r in caplog.records] == OTHERS


def test_the_drivers_reconnection_lines_are_debug_when_its_logger_is(driver_log, caplog):
    driver_log.setLevel(logging.DEBUG)
    for level, template in RECONNECT:
        emit(driver_log, level, template)
    assert [(r.levelname, r.msg) for r in caplog.records] == [
        ("DEBUG", template) for _, template in RECONNECT]


# py-amqp 5's line (amqp/abstract_channel.py) for a method that reaches a
# channel as it closes.
IGNORED_WHILE_CLOSING = ("Received method %s during closing channel %s. "
                         "This method will be ignored")


@pytest.fixture
def amqp_log(caplog):
    logger = logging.getLogger(broker.AMQP_LOGGER)
    broker.quiet_own_fanout_cancels()
    broker.quiet_own_fanout_cancels()  # installed once only
    installed = [f for f in logger.filters if isinstance(f, broker.OwnFanoutCancelsToDebug)]
    assert len(installed) == 1
    yield logger
    logger.removeFilter(installed[0])


def test_the_cancel_of_our_own_fanout_consumer_as_a_server_closes_is_no_warning(
        amqp_log, caplog):
    amqp_log.setLevel(logging.INFO)
    amqp_log.warning(IGNORED_WHILE_CLOSING, amqp_spec.Basic.Cancel, 1)
    # Any other method ignored while closing is still a warning.
    amqp_log.warning(IGNORED_WHILE_CLOSING, amqp_spec.Basic.Deliver, 1)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "Received method (60, 60) during closing channel 1. "
                    "This method will be ignored")]


@pytest.mark.parametrize("error, said", [
    (ConnectionRefusedError(111, "Connection refused"), "did not answer (connection refused)"),
    (TimeoutError("timed out"), "did not answer (timed out)"),
    (AccessRefused("(403) ACCESS_REFUSED - Login was refused"),
     "refused the credentials in transport_url"),
    (OSError(113, "No route to host"), "did not answer (OSError: [Errno 113] No route to host)"),
])
def test_the_probes_findings_in_a_few_words(error, said):
    assert broker.problem(error) == said
