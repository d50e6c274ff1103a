"""The daemon is never half alive: a thread that dies of an exception (the
update loop, the RPC server's listener, any other) wakes the main thread,
which takes the whole process down with a non-zero exit so that systemd
restarts it (Restart=on-failure), instead of answering RPC while no longer
reporting to Placement."""
from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass

LOG = logging.getLogger(__name__)

# The exit status of a daemon that lost a thread: a failure, for systemd.
EXIT_THREAD_DIED = 1


@dataclass(frozen=True)
class ThreadDeath:
    thread: str
    error: str  # the exception and where it was raised, on one line


def describe(args: threading.ExceptHookArgs) -> str:
    """``OverflowError: timeout value is too large (service.py:310 in
    _wait_for_next_cycle)``: the exception and its innermost frame."""
    error = traceback.format_exception_only(args.exc_type, args.exc_value)[-1].strip()
    frames = traceback.extract_tb(args.exc_traceback)
    if not frames:
        return error
    where = frames[-1]
    return f"{error} ({where.filename}:{where.lineno} in {where.name})"


class Supervisor:
    """The main thread waits on ``wake``: set by a stop request (SIGTERM)
    or by a thread's death, which ``deaths`` then records."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.deaths: list[ThreadDeath] = []

    def install(self) -> None:
        """From now on an uncaught exception in any thread is this
        process's end (SystemExit included: the thread is gone all the
        same)."""
        threading.excepthook = self._on_thread_death

    def _on_thread_death(self, args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "unknown"
        death = ThreadDeath(name, describe(args))
        LOG.error("Thread %s died: %s; the agent exits so that it is restarted",
                  death.thread, death.error)
        LOG.debug("Thread %s died", name,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
        self.deaths.append(death)
        self.wake.set()

    def wait(self) -> None:
        """Until a stop request or a thread's death."""
        # Slices, so that a signal's handler always gets to run.
        while not self.wake.wait(3600):
            pass
