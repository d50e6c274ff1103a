"""The API calls the host's server took and has not answered yet, and the
daemon's graceful stop over them: once the stop closes the door, no call
is taken, and the stop waits for the calls taken, up to its bound
(``[DEFAULT] graceful_shutdown_timeout``), before the store closes.

A call counts from the moment the server's listener hands it on (before
its thread runs it) to the moment its reply is sent: a stop that found
none in flight cannot leave one half taken, and a call waited for has
been answered."""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    """One call taken: its method, and the instance it is about (None for
    the calls about the host, get_host_info say)."""
    method: str
    instance_uuid: str | None


def call_of(message: dict[str, Any]) -> Call:
    """The call an RPC request asks for, from its message as
    oslo.messaging gives it (``method``, ``args``); what it lacks is None,
    a malformed request being the dispatcher's to refuse."""
    args = message.get("args")
    instance = args.get("instance_uuid") if isinstance(args, dict) else None
    return Call(str(message.get("method")), instance if isinstance(instance, str) else None)


class CallsInFlight:
    """The calls being served. ``take`` and ``done`` by the server,
    ``close`` and ``wait`` by the daemon's stop."""

    def __init__(self) -> None:
        self._calls: dict[int, Call] = {}
        self._ids = itertools.count()
        self._open = True
        self._changed = threading.Condition()

    def take(self, call: Call) -> int | None:
        """The call's ticket for ``done``; None once closed: the call is
        not to be served."""
        with self._changed:
            if not self._open:
                return None
            ticket = next(self._ids)
            self._calls[ticket] = call
            return ticket

    def done(self, ticket: int) -> None:
        """The call of ``ticket`` answered (or failed)."""
        with self._changed:
            del self._calls[ticket]
            self._changed.notify_all()

    def close(self) -> int:
        """No call is taken from now on; how many are in flight."""
        with self._changed:
            self._open = False
            return len(self._calls)

    @property
    def count(self) -> int:
        with self._changed:
            return len(self._calls)

    def wait(self, seconds: float) -> tuple[Call, ...]:
        """Until no call is in flight, ``seconds`` at most; the calls still
        in flight then, oldest first (none: every call was answered)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._calls, timeout=seconds)
            return tuple(self._calls[ticket] for ticket in sorted(self._calls))
