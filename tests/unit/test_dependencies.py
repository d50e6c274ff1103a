"""compute_agent/dependencies.py: one line going down, one coming back, a counter
in between. (The Placement client's failures told apart by dependency:
tests/unit/placement/test_client.py.)"""
from __future__ import annotations

import logging

from compute_agent.dependencies import (
    LINE_LIMIT,
    Dependencies,
    Dependency,
    DependencyState,
    Health,
    answered,
    failed,
    reached_before,
)

URL = "http://127.0.0.1:8778"


def test_first_failure_says_it_and_later_ones_only_count():
    state, line = failed(DependencyState(Dependency.PLACEMENT), URL,
                         "did not answer (connection refused)", now=100)
    assert line == f"Placement at {URL} did not answer (connection refused)"
    assert (state.health, state.failures, state.since) == (Health.DOWN, 1, 100)
    state, line = failed(state, URL, "answered 503 to GET /: down", now=160)
    assert line is None
    assert (state.failures, state.total_failures, state.since) == (2, 2, 100)
    assert state.problem == "answered 503 to GET /: down"


def test_coming_back_says_how_long_and_resets_the_count_not_the_total():
    state = DependencyState(Dependency.KEYSTONE, Health.DOWN, "http://ks/v3", "x",
                            failures=3, total_failures=5, since=100)
    state, line = answered(state, now=190)
    assert line == "Keystone at http://ks/v3 is back after 3 failed cycles, 90 s"
    assert (state.health, state.failures, state.total_failures) == (Health.UP, 0, 5)
    assert answered(state, now=200)[1] is None


def test_first_success_says_nothing():
    state, line = answered(DependencyState(Dependency.LIBVIRT), now=1)
    assert line is None and state.health is Health.UP


def test_a_line_is_never_longer_than_the_limit():
    _, line = failed(DependencyState(Dependency.PLACEMENT), URL, "x" * 500, now=0)
    assert len(line) == LINE_LIMIT and line.endswith("...")


def test_a_failure_means_what_was_asked_before_it_answered():
    path = (Dependency.LIBVIRT, Dependency.KEYSTONE, Dependency.PLACEMENT)
    assert reached_before(Dependency.PLACEMENT, path) == path[:2]
    assert reached_before(Dependency.KEYSTONE, path) == path[:1]
    assert reached_before(None, path) == path


def test_the_board_logs_once_each_way_over_many_cycles(caplog):
    now = [0.0]
    board = Dependencies(clock=lambda: now[0])
    path = (Dependency.LIBVIRT, Dependency.PLACEMENT)
    with caplog.at_level(logging.DEBUG, logger="compute_agent.dependencies"):
        board.observe_path(path)
        for _ in range(5):
            now[0] += 1
            board.observe_path(path, Dependency.PLACEMENT, URL, "did not answer (x)")
        for _ in range(2):
            now[0] += 1
            board.observe_path(path)
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.levelno >= logging.INFO]
    assert said == [("WARNING", f"Placement at {URL} did not answer (x)"),
                    ("INFO", f"Placement at {URL} is back after 5 failed cycles, 5 s")]
    states = board.snapshot()
    assert states[Dependency.PLACEMENT].total_failures == 5
    assert states[Dependency.LIBVIRT].health is Health.UP
