"""compute-agent's body (compute_agent/cmd/daemon.py): the --once summary
line, and the start and stop around a broker that is away. (The daemon as
a subprocess: tests/functional/test_daemon.py.)"""
from __future__ import annotations

import threading

from compute_agent.cmd import daemon
from compute_agent.cmd.daemon import RpcServers, once_summary, stop_servers
from compute_agent.daemon.service import CycleOutcome
from compute_agent.placement.sync import SyncResult
from compute_agent.rpc.server import CallsInFlight
from compute_agent.tree.provider_tree import Provider, ProviderTree


def _provider(name: str) -> Provider:
    return Provider(uuid=f"00000000-0000-0000-0000-{len(name):012d}", name=name)


def test_once_summary_of_a_cycle_that_wrote():
    tree = ProviderTree([_provider("h"), _provider("h_numa_0")])
    outcome = CycleOutcome(True, result=SyncResult(writes=5, warnings=["w"], tree=tree))
    assert once_summary(outcome, 9, 0.4321) == (
        "cycle ok: 2 providers in Placement, 5 writes, 1 warnings, "
        "9 Placement requests, 0.43 s")


def test_once_summary_of_a_failed_cycle_gives_the_reason():
    outcome = CycleOutcome(False, "Placement unavailable, cycle abandoned: refused")
    assert once_summary(outcome, 1, 2.0) == (
        "cycle failed (1 Placement requests, 2.00 s): "
        "Placement unavailable, cycle abandoned: refused")


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
