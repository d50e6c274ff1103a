"""A clock a test moves by hand, for code that takes one (a ``clock``
parameter defaulting to time.monotonic): time passes without a sleep."""
from __future__ import annotations

import threading


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self._lock = threading.Lock()
        self._now = now

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class SleepingClock(FakeClock):
    """A FakeClock that code which sleeps (``time.sleep``) moves instead:
    each sleep is recorded and passes at once."""

    def __init__(self, now: float = 1000.0) -> None:
        super().__init__(now)
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)
