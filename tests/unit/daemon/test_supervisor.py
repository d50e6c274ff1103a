"""The supervisor's refusal: a thread that finds another agent serving
this host stops the daemon with exit 2, not as a death (exit 1, which
systemd would restart)."""
from __future__ import annotations

import threading

from compute_agent.daemon.errors import AnotherAgentServesHost
from compute_agent.daemon.supervisor import Supervisor
from tests.waiting import wait_for


def test_a_thread_ending_because_another_agent_serves_the_host_is_a_refusal(monkeypatch):
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    supervisor = Supervisor()
    supervisor.install()

    def cycle():
        raise AnotherAgentServesHost("another agent serves host node1: ...")

    thread = threading.Thread(target=cycle, name="update-provider-tree")
    thread.start()
    thread.join(5)
    assert supervisor.wake.wait(5)
    assert supervisor.deaths == []
    assert str(supervisor.refusal) == "another agent serves host node1: ..."


def test_bug_a_sigterm_taken_by_another_thread_was_handled_an_hour_later(monkeypatch):
    """The kernel gives a process's signal to any thread; Python runs its
    handler in the main thread, between two of that thread's waits. The
    daemon's main thread waited in one-hour slices, so a SIGTERM that
    another thread took stopped nothing (the upgrade tests' agent that
    did not exit 60 s after SIGTERM)."""
    import signal

    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    supervisor = Supervisor()
    supervisor.install()
    handled = threading.Event()

    def on_signal(signum, frame):
        handled.set()
        supervisor.request_stop()

    previous = signal.signal(signal.SIGUSR1, on_signal)
    unblocked_by_the_guard = threading.Event()

    def guard():  # the test's own limit: never an hour
        if not handled.wait(10):
            unblocked_by_the_guard.set()
            supervisor.wake.set()

    def taker():
        # Once the main thread waits (its waiter is queued on the event),
        # the signal goes to this thread, not the main one.
        wait_for(lambda: supervisor.wake._cond._waiters, timeout=10, interval=0.001)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

    threading.Thread(target=guard, daemon=True).start()
    other = threading.Thread(target=taker)
    other.start()
    try:
        supervisor.wait()
    finally:
        other.join()
        signal.signal(signal.SIGUSR1, previous)
    assert handled.is_set() and not unblocked_by_the_guard.is_set()
