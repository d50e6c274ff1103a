"""The daemon is never half alive: a thread that dies of an exception (the
update loop, the RPC server's listener, any other) wakes the main thread,
which takes the whole process down with a non-zero exit so that systemd
restarts it (Restart=on-failure), instead of answering RPC while no longer
reporting to Placement. A thread that ends because another agent serves
this host (AnotherAgentServesHost) is a refusal, not a death: the daemon
stops in order and exits 2 with its line, and systemd leaves it down."""
from __future__ import annotations

import logging
import os
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from compute_agent.daemon.errors import AnotherAgentServesHost

LOG = logging.getLogger(__name__)

# The exit status of a daemon that lost a thread: a failure, for systemd.
EXIT_THREAD_DIED = 1
# After a thread's death, how long the orderly stop may take (calls in
# flight finishing) before the process exits all the same.
STOP_AFTER_DEATH_SECONDS = 5
# The main thread's longest wait between two looks at its signals. The
# kernel hands a process's signal to any of its threads; Python runs the
# handler in the main thread, and only once that thread is between two
# waits: a wait of an hour left a SIGTERM unhandled for an hour whenever
# another thread took it (seen in the upgrade tests, under load).
SIGNAL_LOOK_SECONDS = 0.5


@dataclass(frozen=True)
class ThreadDeath:
    thread: str
    error: str  # the exception and where it was raised, on one line


# Frames from here are the project's own: the place a reader looks first.
PROJECT_TOP = Path(__file__).resolve().parents[2]


def _in_project(frame: traceback.FrameSummary) -> bool:
    return Path(frame.filename).resolve().is_relative_to(PROJECT_TOP)


def _frame(frame: traceback.FrameSummary) -> str:
    path = Path(frame.filename).resolve()
    if path.is_relative_to(PROJECT_TOP):
        path = path.relative_to(PROJECT_TOP)
    return f"{path}:{frame.lineno} in {frame.name}"


def describe(args: threading.ExceptHookArgs) -> str:
    """The exception and where it was raised, on one line, e.g.
    ``OverflowError: timestamp out of range (.../threading.py:331 in wait,
    from compute_agent/daemon/service.py:307 in _wait_for_next_cycle)``: the innermost
    frame, and the project's innermost when that is another."""
    error = traceback.format_exception_only(args.exc_type, args.exc_value)[-1].strip()
    frames = traceback.extract_tb(args.exc_traceback)
    if not frames:
        return error
    where = [_frame(frames[-1])]
    ours = [f for f in frames if _in_project(f)]
    if ours and ours[-1] is not frames[-1]:
        where.append(f"from {_frame(ours[-1])}")
    return f"{error} ({', '.join(where)})"


class Supervisor:
    """The main thread waits on ``wake``: set by a stop request (SIGTERM),
    by a thread's death, which ``deaths`` then records, or by a refusal to
    go on (``refusal``: the one line an operator must act on)."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.deaths: list[ThreadDeath] = []
        self.refusal: str | None = None
        self._reported = 0

    def dead_threads(self) -> tuple[str, ...]:
        """Each thread that died, and how, for the probes."""
        return tuple(f"{d.thread}: {d.error}" for d in self.deaths)

    def install(self) -> None:
        """From now on an uncaught exception in any thread is this
        process's end (SystemExit included: the thread is gone all the
        same)."""
        threading.excepthook = self._on_thread_death

    def _on_thread_death(self, args: threading.ExceptHookArgs) -> None:
        if isinstance(args.exc_value, AnotherAgentServesHost):
            self.refuse(str(args.exc_value))
            return
        name = args.thread.name if args.thread is not None else "unknown"
        LOG.debug("Thread %s died", name,
                  # typeshed wants an exception where logging takes None too.
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))  # type: ignore[arg-type]
        self.deaths.append(ThreadDeath(name, describe(args)))
        self.wake.set()

    def refuse(self, line: str) -> None:
        """Something the agent relies on is gone for good (its store, say):
        the main thread stops the daemon in order, which then exits 2 with
        ``line``. The first refusal is the one told."""
        if self.refusal is None:
            self.refusal = line
        self.wake.set()

    def request_stop(self) -> None:
        """A signal's handler: the main thread stops the daemon in order."""
        self.wake.set()

    def wait(self) -> None:
        """Until a stop request or a thread's death."""
        while not self.wake.wait(SIGNAL_LOOK_SECONDS):
            pass
        self.report()

    def exit_unless_stopped_in_time(self) -> None:
        """The orderly stop after a thread's death may wait forever on the
        dead thread (oslo.messaging's server.stop() waits for its listener
        to say it stopped): give it STOP_AFTER_DEATH_SECONDS, then exit. A
        crash is what the agent is built to survive: nothing it
        acknowledged is lost."""
        timer = threading.Timer(STOP_AFTER_DEATH_SECONDS, self._exit_now)
        timer.daemon = True
        timer.start()

    @staticmethod
    def _exit_now() -> None:
        LOG.warning("Not stopped %d s after a thread's death: exiting now",
                    STOP_AFTER_DEATH_SECONDS)
        exit_process(EXIT_THREAD_DIED)

    def report(self) -> None:
        """One line for each death not told yet. Told from the main thread:
        logged by the dying thread, inside its except clause, the line
        would get the error a second time from oslo.log."""
        for death in self.deaths[self._reported:]:
            LOG.error("Thread %s died: %s; the agent exits so that it is restarted",
                      death.thread, death.error)
        self._reported = len(self.deaths)


def exit_process(code: int) -> NoReturn:
    """Ends the process now, its log lines flushed: for a thread that
    cannot be stopped (blocked on a broker that does not answer), which the
    interpreter would otherwise wait for at exit."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)
