"""The daemon's start and stop around a broker that is away
(compute_agent/cmd/daemon.py)."""
from __future__ import annotations

import threading

from compute_agent.cmd import daemon
from compute_agent.cmd.daemon import RpcServers, stop_servers
from compute_agent.rpc.server import CallsInFlight


class Listener:
    """An oslo.messaging server whose stop() returns only when ``gate``
    opens: its listener's connection being made again."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.stopped = self.waited = False

    def stop(self) -> None:
        if self.gate is not None:
            self.gate.wait()
        self.stopped = True

    def wait(self) -> None:
        self.waited = True


def test_servers_that_stop_are_stopped_and_waited_for(monkeypatch):
    calls, heartbeats = Listener(), Listener()
    assert stop_servers(RpcServers(calls, heartbeats, CallsInFlight()))
    assert calls.stopped and calls.waited and heartbeats.stopped and heartbeats.waited


def test_a_listener_that_cannot_stop_is_left_once_the_calls_in_flight_are_done(monkeypatch):
    """SIGTERM while the broker was away took 3 s and more (up to the
    driver's 30 s back-off): the stop now waits for the calls being
    served, which the store must outlive, not for the listener."""
    monkeypatch.setattr(daemon, "SERVERS_STOP_SECONDS", 0.01)
    gate = threading.Event()
    in_flight = CallsInFlight()
    call_started, call_may_end = threading.Event(), threading.Event()
    finished: list[str] = []

    def serve_one_call() -> None:
        with in_flight.one():
            call_started.set()
            call_may_end.wait()
            finished.append("call")

    caller = threading.Thread(target=serve_one_call)
    caller.start()
    call_started.wait()
    threading.Timer(0.05, call_may_end.set).start()
    try:
        assert stop_servers(RpcServers(Listener(gate), Listener(), in_flight)) is False
        assert finished == ["call"] and in_flight.count == 0
    finally:
        gate.set()
        caller.join()
