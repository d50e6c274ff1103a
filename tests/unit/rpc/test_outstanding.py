"""The calls a command has outstanding, for ctl's watchdog
(compute_agent/rpc/outstanding.py), on a clock the test moves."""
from __future__ import annotations

from compute_agent.rpc.outstanding import OutstandingCalls, Overdue
from tests.unit.clocks import FakeClock


def test_a_call_is_overdue_only_past_its_own_timeout_and_grace():
    clock = FakeClock()
    outstanding = OutstandingCalls(clock)
    with outstanding.one(timeout=0.25):
        with outstanding.one(timeout=60):
            assert outstanding.overdue(grace=0.5, between_calls=60) is None
            clock.advance(0.75)
            assert outstanding.overdue(grace=0.5, between_calls=60) is None
            clock.advance(0.125)
            # The call due first decides, with its own timeout.
            assert outstanding.overdue(grace=0.5, between_calls=60) == Overdue(0.75, call=True)


def test_calls_together_longer_than_one_timeout_are_not_overdue():
    clock = FakeClock()
    outstanding = OutstandingCalls(clock)
    for _ in range(10):
        with outstanding.one(timeout=1):
            clock.advance(0.875)
            assert outstanding.overdue(grace=0, between_calls=0.5) is None


def test_with_no_call_outstanding_the_time_since_the_last_answer_counts():
    clock = FakeClock()
    outstanding = OutstandingCalls(clock)
    clock.advance(0.25)
    assert outstanding.overdue(grace=0, between_calls=0.25) is None
    clock.advance(0.125)
    # Since this began, before any call.
    assert outstanding.overdue(grace=0, between_calls=0.25) == Overdue(0.25, call=False)
    with outstanding.one(timeout=60):
        clock.advance(5)
        # A call outstanding: only its own timeout counts.
        assert outstanding.overdue(grace=0, between_calls=0.25) is None
    # Answered now: the time between calls starts again.
    assert outstanding.overdue(grace=0, between_calls=0.25) is None
    clock.advance(0.375)
    assert outstanding.overdue(grace=0, between_calls=0.25) == Overdue(0.25, call=False)
