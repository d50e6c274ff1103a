"""The tests' one way to wait for something another thread or process
does: ``wait_for``, a predicate asked until it holds or the time is up."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 20, interval: float = 0.1, *,
             message: str | Callable[[], str] | None = None,
             error: type[AssertionError] = AssertionError) -> T:
    """``predicate`` asked every ``interval`` seconds until it returns a
    true value, which is returned; whatever it raises ends the wait.
    After ``timeout`` seconds, ``error`` is raised saying ``message`` (a
    callable is asked then, so that it can tell what was seen last), or
    by default what was waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            if message is None:
                raise error(f"timed out after {timeout}s waiting for {predicate}")
            raise error(message if isinstance(message, str) else message())
        time.sleep(interval)
