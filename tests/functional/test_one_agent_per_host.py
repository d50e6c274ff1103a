"""One agent per host: two real agent daemons for one [DEFAULT] host
against one real Placement and the machine's RabbitMQ. The second is
refused (exit 2, one line) by Placement at start, by Placement at the
first cycle that reaches it, or by the first answering on the bus; a
restart of the same agent after kill -9 is not."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import kombu
import pytest

from compute_agent.cmd.common import load_config
from compute_agent.daemon.one_agent_run import PROBE_DEADLINE_SECONDS
from compute_agent.dependencies import Unknown
from compute_agent.rpc.heartbeat import TOPIC as HEARTBEAT_TOPIC
from compute_agent.rpc.heartbeat import agent_serving
from compute_agent.store import node_identity
from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault
from compute_agent.testing.local_placement import free_port
from tests.functional.helpers import get, wait_for, write_conf
from tests.functional.test_daemon import HOST, run, start_daemon

RUNNING = "compute-agent running as host"
REFUSED = "compute-agent: error: "
BROKER = "amqp://guest:guest@127.0.0.1:5672//"


def new_host() -> str:
    return f"one-{uuid.uuid4().hex[:8]}"


class Daemon:
    """compute-agent for ``host`` with its config and state under ``directory``."""

    def __init__(self, directory: Path, placement_url: str, host: str):
        self.dir = directory
        self.state = directory / "state"
        self.conf = write_conf(directory, placement_url, host, HOST)
        self.log = directory / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Daemon:
        self.proc = start_daemon(self.conf, self.log)
        return self

    def wait_running(self) -> None:
        wait_for(lambda: RUNNING in self.text() or self.proc.poll() is not None, timeout=60)
        assert self.proc.poll() is None, f"exit {self.proc.returncode}: {self.text()}"

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def refusal(self) -> str:
        """The one line the refused daemon ended with."""
        assert self.proc.wait(60) == 2, self.text()
        lines = [line for line in self.text().splitlines() if line.startswith(REFUSED)]
        assert len(lines) == 1, self.text()
        assert "Traceback" not in self.text()
        return lines[0]

    @property
    def root(self) -> str:
        return node_identity.load(str(self.state))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(30) == 0, self.text()


@pytest.fixture
def daemon(placement):
    """Makes Daemons; any still running after the test is killed."""
    made: list[Daemon] = []

    def make(directory: Path, host: str, placement_url: str = placement.url) -> Daemon:
        made.append(Daemon(directory, placement_url, host))
        return made[-1]

    yield make
    for one in made:
        if one.proc is not None and one.proc.poll() is None:
            one.proc.kill()
            one.proc.wait(30)


def roots_named(url: str, host: str) -> list[str]:
    return [r["uuid"] for r in get(url, f"/resource_providers?name={host}")
            ["resource_providers"]]


def test_a_second_agent_with_another_state_path_is_refused_writing_nothing(
        tmp_path, placement, daemon):
    """A mistyped state_path: before, the second agent made a new store and
    compute_id, served, and logged Placement's 409 every cycle."""
    host = new_host()
    first = daemon(tmp_path / "a", host).start()
    try:
        first.wait_running()
        assert roots_named(placement.url, host) == [first.root]
        second = daemon(tmp_path / "b", host).start()
        line = second.refusal()
        assert (f"another agent serves host {host}: Placement's root provider "
                f"{first.root} has that name, but state path {second.state} has no "
                "compute_id") in line, line
        assert "mistyped state_path or a cloned VM image" in line
        assert not (second.state / node_identity.FILENAME).exists()
        assert not (second.state / "state.db").exists()
        assert first.proc.poll() is None
    finally:
        first.stop()


def test_a_clone_of_a_running_agent_is_refused_by_its_answer_on_the_bus(tmp_path, daemon):
    """A cloned VM image: the same host and the same compute_id, so
    Placement's root is the clone's own; the running agent's answer to
    the heartbeat tells."""
    host = new_host()
    first = daemon(tmp_path / "a", host).start()
    try:
        first.wait_running()
        clone = daemon(tmp_path / "b", host)
        clone.state.mkdir(mode=0o700)
        shutil.copy(first.state / node_identity.FILENAME, clone.state)
        line = clone.start().refusal()
        assert (f"another agent serves host {host}: it answers on the bus on "
                f"{socket.gethostname()} (root provider {first.root}, state path "
                f"{first.state}), and this one's state path {clone.state} has "
                f"compute_id {first.root}") in line, line
        assert not (clone.state / "state.db").exists()
        assert first.proc.poll() is None
    finally:
        first.stop()


def test_placement_away_at_start_is_asked_by_the_first_cycle_that_reaches_it(
        tmp_path, placement, daemon):
    """The second agent starts while Placement does not answer; the first
    cycle that reaches it finds the other root and the daemon stops."""
    host = new_host()
    first = daemon(tmp_path / "a", host)
    done = run("compute-agent", first.conf, "--once")  # its root, and no daemon
    assert done.returncode == 0, done.stderr
    with FaultProxy(placement.url, {PlacementFault.ERROR_503_BEFORE: 1.0}) as proxy:
        second = daemon(tmp_path / "b", host, proxy.url).start()
        second.wait_running()
        # Cycles that do not reach Placement: two refused, the daemon running.
        wait_for(lambda: proxy.total_injected >= 2, timeout=60)
        assert second.proc.poll() is None
        proxy.set_rates({})
        line = second.refusal()
    assert (f"another agent serves host {host}: Placement's root provider {first.root} "
            f"has that name, but state path {second.state} has compute_id "
            f"{second.root}") in line, line
    assert "compute-agent stopped" not in second.text()


def killed_9(tmp_path, daemon) -> tuple[str, Daemon]:
    """An agent of a new host, started, then killed with SIGKILL: its host
    and the stopped Daemon (its log set aside as killed.log)."""
    host = new_host()
    agent = daemon(tmp_path, host).start()
    agent.wait_running()
    agent.proc.kill()
    agent.proc.wait(30)
    agent.log.rename(tmp_path / "killed.log")
    return host, agent


def test_a_restart_after_kill_9_is_not_refused(tmp_path, daemon):
    """The host's heartbeat queue outlives the killed agent: a queue, with
    nobody on it, is not an agent."""
    _, agent = killed_9(tmp_path, daemon)
    agent.start()
    try:
        agent.wait_running()
        assert REFUSED not in agent.text()
    finally:
        agent.stop()


class SilentConsumer:
    """A consumer on a host's heartbeat queue that never answers: what the
    broker keeps of an agent whose machine died until it finds it gone.
    ``got``: the bodies delivered to it."""

    def __init__(self, host: str):
        self.got: list = []
        self._connection = kombu.Connection(BROKER)
        queue = kombu.Queue(f"{HEARTBEAT_TOPIC}.{host}", no_declare=True)
        self._consumer = self._connection.Consumer(
            queue, callbacks=[lambda body, message: self.got.append(body)], accept=["json"])
        self._consumer.consume()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stopping.is_set():
            try:
                self._connection.drain_events(timeout=0.2)
            except TimeoutError:
                pass

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(10)
        self._connection.close()


def test_a_consumer_that_does_not_answer_does_not_block_a_start(tmp_path, daemon):
    """The probe needs an answer: a consumer left on the queue (the broker
    has not yet found its agent gone) gets the question, does not answer,
    and the start goes on after the probe's deadline."""
    host, agent = killed_9(tmp_path, daemon)
    stale = SilentConsumer(host)
    try:
        agent.start()
        agent.wait_running()
        assert any("report_alive" in str(body) for body in stale.got), stale.got
        assert REFUSED not in agent.text()
    finally:
        stale.close()
        agent.stop()


def test_a_broker_that_cannot_be_asked_is_unknown_not_nobody(tmp_path):
    """The daemon then says, in one WARNING, that the bus was not asked."""
    port = free_port()
    conf = load_config(["--config-file", str(write_conf(
        tmp_path, f"http://127.0.0.1:{free_port()}", new_host(), HOST,
        DEFAULT={"transport_url": f"rabbit://guest:guest@127.0.0.1:{port}/"}))])
    started = time.monotonic()
    answer = agent_serving(conf, conf.host, PROBE_DEADLINE_SECONDS)
    assert time.monotonic() - started < PROBE_DEADLINE_SECONDS
    assert answer == Unknown(f"the broker 127.0.0.1:{port} did not answer "
                             "(connection refused)")
