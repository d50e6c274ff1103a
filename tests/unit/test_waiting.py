"""The tests' waiting helper (tests/waiting.py): what it returns, and what
it raises when the time is up. No time passes here: an interval of 0, and
a timeout already over when the predicate has first been asked."""
from __future__ import annotations

import pytest

from tests.waiting import wait_for


class Stuck(AssertionError):
    pass


def test_the_predicates_first_true_value_is_returned():
    answers = iter([None, 0, {}, {"running": True}, {"running": False}])
    assert wait_for(lambda: next(answers), timeout=60, interval=0) == {"running": True}


def test_the_time_up_says_what_was_waited_for_by_default():
    def never() -> bool:
        return False
    with pytest.raises(AssertionError, match="timed out after -1s waiting for .*never"):
        wait_for(never, timeout=-1, interval=0)


def test_the_time_up_raises_the_error_given_with_the_message_asked_then():
    seen: list[int] = []

    def counting() -> bool:
        seen.append(len(seen))
        return False
    with pytest.raises(Stuck, match=r"^last seen 0$"):
        wait_for(counting, timeout=-1, interval=0, error=Stuck,
                 message=lambda: f"last seen {seen[-1]}")
    with pytest.raises(Stuck, match=r"^stuck$"):
        wait_for(counting, timeout=-1, interval=0, error=Stuck, message="stuck")


def test_what_the_predicate_raises_ends_the_wait():
    def exited() -> bool:
        raise RuntimeError("the daemon exited 1")
    with pytest.raises(RuntimeError, match="exited 1"):
        wait_for(exited, timeout=60, interval=0)
