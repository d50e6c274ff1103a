"""The calls a command has sent and not had answered, for its watchdog
(compute-agent-ctl's): a command that makes many calls (an evacuation, the
heartbeats of every host) is stuck only when one call outlives its own
timeout, not when the calls together take longer than one."""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Overdue:
    """What a watchdog gave up on: ``seconds`` allowed, and whether a call
    was outstanding (the broker's fault) or none was (the command's own
    work between calls, such as a Placement read)."""
    seconds: float
    call: bool


class OutstandingCalls:
    """Shared by every client one watchdog looks after. ``clock``: seconds,
    monotonic (a test's own clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._calls: dict[int, tuple[float, float]] = {}  # id: (sent, its timeout)
        self._last_answer = clock()

    @contextmanager
    def one(self, timeout: float) -> Iterator[None]:
        """One call, which may wait ``timeout`` seconds for its answer."""
        with self._lock:
            call = next(self._ids)
            self._calls[call] = (self._clock(), timeout)
        try:
            yield
        finally:
            with self._lock:
                del self._calls[call]
                self._last_answer = self._clock()

    def overdue(self, grace: float, between_calls: float) -> Overdue | None:
        """A call unanswered ``grace`` seconds past its own timeout, or,
        with none outstanding, ``between_calls`` seconds since the last
        answer (or since this began); None while neither."""
        now = self._clock()
        with self._lock:
            if self._calls:
                # The call due first: sent + timeout.
                sent, timeout = min(self._calls.values(), key=sum)
                allowed = timeout + grace
                return Overdue(allowed, call=True) if now - sent > allowed else None
            idle = now - self._last_answer
        return Overdue(between_calls, call=False) if idle > between_calls else None
