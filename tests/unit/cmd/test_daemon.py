"""compute-agent's body (compute_agent/cmd/daemon.py): --once's run and its
summary line, the start's refusals and their exit codes, and the stop's
order and exit code, the drain of the calls in flight and its bound,
the server's stop around a broker that is away. With
an agent on the fake host; the RPC server is the test's. (The daemon as
a subprocess: tests/functional/test_daemon.py.)"""
from __future__ import annotations

import re
import threading

import pytest

from compute_agent.cmd import daemon
from compute_agent.cmd.daemon import drain, once_summary, stop_server
from compute_agent.daemon.errors import AnotherAgentServesHost
from compute_agent.daemon.one_agent_run import PlacementCheck, StartCheck
from compute_agent.daemon.probes import Phase
from compute_agent.daemon.reload_signal import ReloadSignal
from compute_agent.daemon.service import Agent, CycleOutcome
from compute_agent.daemon.supervisor import EXIT_THREAD_DIED, Supervisor, ThreadDeath
from compute_agent.metrics import Metrics
from compute_agent.placement.client import PlacementClient, adapter_from_conf
from compute_agent.placement.sync import SyncResult
from compute_agent.rpc.in_flight import Call, CallsInFlight
from compute_agent.store import lock
from compute_agent.store.inspection import stored_host
from compute_agent.store.store import STORE_FILE
from compute_agent.tree.provider_tree import Provider, ProviderTree
from tests.unit.daemon.agents import UnusedClient, agent_on_fake_host, fake_agent_conf_file


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


# --- --once ---------------------------------------------------------------------

class CountingClient(UnusedClient):
    requests_sent = 3


class DriverUse:
    """What run_once does with the agent's driver."""

    def __init__(self, agent: Agent) -> None:
        self.seen: list[str] = []
        agent.driver.init_host = lambda: self.seen.append("init_host")
        agent.driver.cleanup = lambda: self.seen.append("cleanup")


@pytest.fixture
def agent(tmp_path):
    agent = agent_on_fake_host(tmp_path, client=CountingClient())
    yield agent
    agent.manager.tracker.store.close()


def test_once_says_what_the_cycle_did_on_stdout(agent, capsys):
    driver = DriverUse(agent)
    agent.run_cycle = lambda: driver.seen.append("cycle") or CycleOutcome(
        True, result=SyncResult(writes=2, tree=ProviderTree([_provider("h")])))
    assert daemon.run_once(agent) == 0
    assert driver.seen == ["init_host", "cycle", "cleanup"]
    out, err = capsys.readouterr()
    assert re.fullmatch(r"cycle ok: 1 providers in Placement, 2 writes, 0 warnings, "
                        r"3 Placement requests, \d+\.\d\d s\n", out) and err == ""


def test_once_says_why_the_cycle_failed_on_stderr_and_exits_1(agent, capsys):
    agent.run_cycle = lambda: CycleOutcome(False, "Placement at http://p did not answer")
    assert daemon.run_once(agent) == 1
    out, err = capsys.readouterr()
    assert out == "" and re.fullmatch(r"compute-agent: cycle failed \(3 Placement requests, "
                                      r"\d+\.\d\d s\): Placement at http://p did not answer\n",
                                      err)


def test_once_releases_the_driver_when_another_agent_is_found(agent):
    driver = DriverUse(agent)

    def another():
        raise AnotherAgentServesHost("host h: another agent")

    agent.run_cycle = another
    with pytest.raises(AnotherAgentServesHost):
        daemon.run_once(agent)
    assert driver.seen == ["init_host", "cleanup"]


# --- the start ------------------------------------------------------------------

class Deliveries(ReloadSignal):
    """A reload signal, not installed, that a SIGHUP reached early or not."""

    def __init__(self, early: bool) -> None:
        super().__init__()
        self._early = early
        self.agents: list[Agent] = []

    def deliver_to(self, agent: Agent) -> bool:
        self.agents.append(agent)
        return super().deliver_to(agent)


def test_a_bad_config_is_exit_2_before_anything(tmp_path, capsys):
    path = fake_agent_conf_file(tmp_path)
    path.write_text(path.read_text() + "[DEFAULT]\nupdate_interval = 0\n")
    signal = Deliveries(early=False)
    assert daemon.main(signal, ["--config-file", str(path), "--once"]) == 2
    assert "error: [DEFAULT] update_interval: " in capsys.readouterr().err
    assert signal.agents == [] and not (tmp_path / "state").exists()


def test_a_state_directory_in_use_is_exit_2(tmp_path, capsys):
    held = lock.acquire(str(tmp_path / "state"))
    try:
        assert daemon.main(Deliveries(early=False),
                           ["--config-file", str(fake_agent_conf_file(tmp_path)),
                            "--once"]) == 2
    finally:
        held.release()
    assert "is in use by another agent" in capsys.readouterr().err


def start_check(conf, pending: PlacementCheck | None = None) -> StartCheck:
    """What check_one_agent_per_host leaves when it lets the start go on."""
    return StartCheck(PlacementClient(adapter_from_conf(conf), Metrics()), pending=pending)


def test_once_runs_one_cycle_of_the_agent_an_early_sighup_reached(tmp_path, monkeypatch,
                                                                  capsys):
    """Placement's check is the test's; the cycle meets no Placement."""
    checked = []
    monkeypatch.setattr(daemon, "check_one_agent_per_host",
                        lambda conf, ask_the_bus: checked.append(ask_the_bus)
                        or start_check(conf))
    ran = []
    monkeypatch.setattr(daemon, "run_once", lambda agent: ran.append(agent) or 1)
    signal = Deliveries(early=True)
    assert daemon.main(signal, ["--config-file", str(fake_agent_conf_file(tmp_path)),
                                "--once"]) == 1
    assert checked == [False]  # --once joins no queue: the bus is not asked
    assert ran == signal.agents and len(ran) == 1
    assert ran[0]._drop_cache.is_set()  # the first cycle reads Placement afresh
    ran[0].manager.tracker.store.close()


@pytest.mark.parametrize("learning, recorded", [(False, "node1"), (True, None)])
def test_the_store_records_the_host_name_unless_placement_is_still_to_tell_it(
        tmp_path, monkeypatch, learning, recorded):
    """An older store whose root Placement could not be asked about at
    the start records no name: the first cycle that reaches Placement
    checks it, and the next start records it."""
    conf_file = fake_agent_conf_file(tmp_path)
    pending = PlacementCheck("node1", str(tmp_path / "state"), learns_name=True)
    monkeypatch.setattr(daemon, "check_one_agent_per_host",
                        lambda conf, ask_the_bus: start_check(conf, pending if learning
                                                              else None))
    ran = []
    monkeypatch.setattr(daemon, "run_once", lambda agent: ran.append(agent) or 0)
    assert daemon.main(Deliveries(early=False), ["--config-file", str(conf_file),
                                                 "--once"]) == 0
    ran[0].manager.tracker.store.close()
    assert stored_host(tmp_path / "state" / STORE_FILE).name == recorded


def test_another_agent_found_by_once_s_cycle_is_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(daemon, "check_one_agent_per_host",
                        lambda conf, ask_the_bus: start_check(conf))

    def found(agent):
        agent.manager.tracker.store.close()
        raise AnotherAgentServesHost("host node1: another agent serves it")

    monkeypatch.setattr(daemon, "run_once", found)
    assert daemon.main(Deliveries(early=False),
                       ["--config-file", str(fake_agent_conf_file(tmp_path)), "--once"]) == 2
    assert capsys.readouterr().err.endswith("error: host node1: another agent serves it\n")


# --- the stop -------------------------------------------------------------------

class Stopped:
    """The host's RPC server: records its part in the stop, and what the
    agent's probes said then."""

    def __init__(self, name: str, seen: list[str], agent: Agent) -> None:
        self.name = name
        self.seen = seen
        self.agent = agent
        self.in_flight = CallsInFlight()

    def stop(self) -> None:
        self.seen.append(f"{self.name} stop ({self.agent.phase.value})")

    def wait(self) -> None:
        self.seen.append(f"{self.name} wait")


class WatchedSupervisor(Supervisor):
    """Its timer, which ends the process, only recorded."""

    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def exit_unless_stopped_in_time(self) -> None:
        self.seen.append("exit timer")


def stopping(agent: Agent, monkeypatch) -> tuple[WatchedSupervisor, list[str], Stopped]:
    seen: list[str] = []
    monkeypatch.setattr(daemon, "notify", lambda state: seen.append(f"notify {state}"))
    stop = agent.stop
    agent.stop = lambda: (seen.append("agent stop"), stop())
    return WatchedSupervisor(seen), seen, Stopped("server", seen, agent)


# The drain's bound in these tests: no call is in flight, none is waited for.
BOUND = 60


def test_a_stop_asked_for_stops_the_servers_then_the_agent(agent, monkeypatch):
    supervisor, seen, servers = stopping(agent, monkeypatch)
    assert daemon.stop(supervisor, agent, servers, BOUND) == 0  # type: ignore[arg-type]
    # /readyz says stopping before the server stops.
    assert seen == ["notify STOPPING=1", f"server stop ({Phase.STOPPING.value})",
                    "server wait", "agent stop"]
    # No call taken once the stop began.
    assert servers.in_flight.take(Call("build_instance", "i-1")) is None


def test_a_stop_that_cuts_a_call_exits_as_after_a_kill_the_store_left_open(
        agent, monkeypatch):
    """The cut call's thread still runs: the store must not close under
    it, nor the server's stop wait for it."""
    supervisor, seen, servers = stopping(agent, monkeypatch)
    servers.in_flight.take(Call("finish_resize", "i-1"))

    class Exited(Exception):
        pass

    def exit_process(code: int) -> None:
        seen.append(f"exit {code}")
        raise Exited

    monkeypatch.setattr(daemon, "exit_process", exit_process)
    with pytest.raises(Exited):
        daemon.stop(supervisor, agent, servers, 0.01)  # type: ignore[arg-type]
    assert seen == ["notify STOPPING=1", "exit 0"]


def test_a_stop_after_a_threads_death_is_bounded_and_exits_so(agent, monkeypatch):
    supervisor, seen, servers = stopping(agent, monkeypatch)
    supervisor.deaths.append(ThreadDeath("cleaner", "KeyError: 'x'"))
    assert daemon.stop(supervisor, agent, servers, BOUND) == EXIT_THREAD_DIED  # type: ignore[arg-type]
    assert seen[0] == "exit timer" and "notify STOPPING=1" not in seen
    assert seen[-1] == "agent stop"


def test_a_stop_after_a_refusal_exits_2_with_its_line(agent, monkeypatch, capsys):
    supervisor, seen, servers = stopping(agent, monkeypatch)
    supervisor.refuse("store /var/lib/compute-agent/state.db was removed")
    assert daemon.stop(supervisor, agent, servers, BOUND) == 2  # type: ignore[arg-type]
    assert capsys.readouterr().err.endswith(
        "error: store /var/lib/compute-agent/state.db was removed\n")


# --- the drain: calls in flight answered, within the bound -------------------

class Draining:
    """The host's RPC server, as the drain sees it."""

    def __init__(self) -> None:
        self.in_flight = CallsInFlight()


def test_a_drain_with_no_call_in_flight_says_so_and_ends_at_once(caplog):
    caplog.set_level("INFO", logger=daemon.LOG.name)
    # A bound that would hold the test for an hour if waited out.
    assert drain(Draining(), 3600) == ()  # type: ignore[arg-type]
    assert "stopping: 0 calls in flight, waiting up to 3600 s" in caplog.messages


def test_a_drain_waits_for_the_call_in_flight_to_be_answered(monkeypatch, caplog):
    server = Draining()
    ticket = server.in_flight.take(Call("build_instance", "i-1"))
    assert ticket is not None
    said: list[str] = []
    answering: list[threading.Thread] = []

    def says_then_call_answered(line: str, *args: object) -> None:
        # The call ends once the drain has begun: an event, not a timer.
        said.append(line % args)
        answering.append(threading.Thread(target=server.in_flight.done, args=(ticket,)))
        answering[0].start()

    monkeypatch.setattr(daemon.LOG, "info", says_then_call_answered)
    assert drain(server, 3600) == ()  # type: ignore[arg-type]
    answering[0].join()
    assert said == ["stopping: 1 calls in flight, waiting up to 3600 s"]
    assert server.in_flight.count == 0
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_drain_cuts_the_calls_past_its_bound_and_names_each(caplog):
    server = Draining()
    server.in_flight.take(Call("prep_resize", "i-1"))
    server.in_flight.take(Call("get_host_info", None))
    assert drain(server, 0.01) == (  # type: ignore[arg-type]
        Call("prep_resize", "i-1"), Call("get_host_info", None))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "Call prep_resize of instance i-1 cut by graceful_shutdown_timeout (0.01 s): "
        "the next start resumes or rolls it back",
        "Call get_host_info of instance - cut by graceful_shutdown_timeout (0.01 s): "
        "the next start resumes or rolls it back"]


# --- the server's stop, the broker away --------------------------------------

class Server:
    """The host's RPC server, whose stop() returns only when ``gate``
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


def test_a_server_that_stops_is_stopped_and_waited_for():
    server = Server()
    assert stop_server(server)  # type: ignore[arg-type]
    assert server.stopped and server.waited


def test_a_listener_that_cannot_stop_is_left_behind(monkeypatch):
    """SIGTERM while the broker was away took 3 s and more (up to the
    driver's 30 s back-off): the calls in flight are answered by then
    (drain), and the stop goes on without the listener."""
    monkeypatch.setattr(daemon, "SERVER_STOP_SECONDS", 0.01)
    gate = threading.Event()
    try:
        assert stop_server(Server(gate)) is False  # type: ignore[arg-type]
    finally:
        gate.set()
