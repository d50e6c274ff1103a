"""The tests' one way to wait for something another thread or process
does: ``wait_for``, a predicate asked until it holds or the time is up."""
from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 20, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)
