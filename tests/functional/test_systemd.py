"""The daemon as systemd runs it: the notify protocol on a NOTIFY_SOCKET
the test owns (READY=1, watchdog pings, STOPPING=1), a loop that stalls,
and a thread that dies. Real Placement, real RabbitMQ, the fake driver."""
from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from compute_agent.messaging import TOPIC
from compute_agent.testing.local_placement import LocalPlacement, free_port
from tests.functional.helpers import failed_cycles, get, wait_for, write_conf

HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}
# systemd's watchdog timeout for these tests: pings every 0.5 s.
WATCHDOG_USEC = 1_000_000


class NotifySocket:
    """systemd's end of the notify protocol: a datagram socket bound where
    NOTIFY_SOCKET says, recording each assignment with its arrival time."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.received: list[tuple[float, str]] = []
        # Called in the reader thread as each assignment arrives.
        self.on_assignment: Callable[[str], None] = lambda assignment: None
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            now = time.monotonic()
            for line in data.decode().splitlines():
                self.on_assignment(line)
                self.received.append((now, line))

    def close(self) -> None:
        self._closed = True
        self._reader.join()
        self.sock.close()

    def environment(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": str(self.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}

    def times(self, assignment: str, since: float = 0) -> list[float]:
        return [t for t, line in list(self.received) if line == assignment and t >= since]

    def wait_for(self, assignment: str, since: float = 0, timeout: float = 30) -> float:
        return wait_for(lambda: self.times(assignment, since), timeout)[0]


@pytest.fixture
def notify_socket(tmp_path):
    sock = NotifySocket(tmp_path / "notify")
    yield sock
    sock.close()


def start_daemon(conf: Path, log: Path, environment: dict[str, str],
                 launcher: list[str] | None = None) -> subprocess.Popen:
    """The daemon as a real process; ``launcher`` replaces the console
    script (a test's fault injected before main runs)."""
    command = launcher or [str(Path(sys.executable).parent / "compute-agent")]
    return subprocess.Popen([*command, "--config-file", str(conf)],
                            env={**os.environ, **environment},
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def stop_daemon(proc: subprocess.Popen) -> int:
    """SIGTERM, as systemd stops it; a daemon that hangs is killed, and the
    test fails."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def rpc_tree(conf: Path, host: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compute_agent.cmd.ctl", "--config-file", str(conf),
                           "--timeout", "10", "tree", host],
                          capture_output=True, text=True, timeout=60)


def rpc_queues() -> set[str]:
    """The queues RabbitMQ has. The RPC server declares and binds its
    queues in start(); a call sent after that waits there for it, one sent
    before is lost."""
    listed = subprocess.run(["rabbitmqctl", "-q", "list_queues", "name"],
                            capture_output=True, text=True, timeout=60, check=True)
    return set(listed.stdout.split())


def test_ready_once_rpc_serves_watchdog_pings_while_idle_stopping_on_sigterm(
        tmp_path, placement, notify_socket):
    host = f"notify-{uuid.uuid4().hex[:8]}"
    # No cycle runs after start-up's: the pings come from the loop waiting.
    conf = write_conf(tmp_path, placement.url, host, HOST,
                      DEFAULT={"update_interval": 3600})
    proc = start_daemon(conf, tmp_path / "agent.log", notify_socket.environment())

    def freeze_at_ready(assignment: str) -> None:
        if assignment == "READY=1":
            proc.send_signal(signal.SIGSTOP)

    notify_socket.on_assignment = freeze_at_ready
    try:
        ready = notify_socket.wait_for("READY=1")
        # Frozen as READY=1 arrived: start-up's cycle had written the host's
        # tree, and the RPC server had its queue.
        providers = get(placement.url, f"/resource_providers?name={host}_numa_0")
        assert len(providers["resource_providers"]) == 1
        assert f"{TOPIC}.{host}" in rpc_queues()
        proc.send_signal(signal.SIGCONT)
        served = rpc_tree(conf, host)
        assert served.returncode == 0, served.stderr
        assert f"{host}_numa_0" in served.stdout

        resumed = time.monotonic()
        time.sleep(2)  # the pings of 2 s running, which the checks below count
        pings = notify_socket.times("WATCHDOG=1", since=resumed)
        assert len(pings) >= 3, pings
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert max(gaps) < WATCHDOG_USEC / 1e6, gaps

        terminated = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        notify_socket.wait_for("STOPPING=1", since=terminated)
    finally:
        proc.send_signal(signal.SIGCONT)
        assert stop_daemon(proc) == 0
    assert notify_socket.times("READY=1") == [ready]


def test_a_loop_failing_because_placement_is_down_still_pings(tmp_path, notify_socket):
    conf = write_conf(tmp_path, f"http://127.0.0.1:{free_port()}", "pings-alone", HOST)
    log = tmp_path / "agent.log"
    proc = start_daemon(conf, log, notify_socket.environment())
    try:
        ready = notify_socket.wait_for("READY=1")
        wait_for(lambda: failed_cycles(tmp_path / "state") >= 3)
        pings = notify_socket.times("WATCHDOG=1", since=ready)
        assert len(pings) >= 4
        assert max(b - a for a, b in itertools.pairwise(pings)) < WATCHDOG_USEC / 1e6
    finally:
        assert stop_daemon(proc) == 0


def request_waiting_at(port: int) -> bool:
    """Whether a request to 127.0.0.1:``port`` sits unread: a connection
    to that port (accepted or not yet) holding bytes its server has not
    read, as the kernel lists it."""
    with open("/proc/net/tcp", encoding="ascii") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    established = "01"
    return any(int(local.rsplit(":", 1)[1], 16) == port and state == established
               and int(queues.split(":")[1], 16) > 0
               for _, local, _, state, queues, *_ in rows)


def test_a_loop_stalled_on_a_hung_placement_stops_the_pings_until_it_answers(
        tmp_path, notify_socket):
    # A Placement of the test's own, frozen with SIGSTOP: the kernel still
    # accepts connections, nobody answers, and each request waits for
    # [placement] timeout (30 s) -- a cycle that does not end.
    hung = LocalPlacement(tmp_path / "placement").start()
    conf = write_conf(tmp_path, hung.url, "stalled", HOST)
    proc = start_daemon(conf, tmp_path / "agent.log", notify_socket.environment())
    try:
        ready = notify_socket.wait_for("READY=1")
        notify_socket.wait_for("WATCHDOG=1", since=ready)
        hung.proc.send_signal(signal.SIGSTOP)
        # Within one interval (1 s) the next cycle starts and blocks: its
        # request sits unread at the frozen Placement. The loop pinged, if
        # at all, before it sent it.
        wait_for(lambda: request_waiting_at(hung.port), timeout=10, interval=0.05)
        silent = time.monotonic()
        time.sleep(2)  # twice the watchdog's timeout: systemd would kill it
        assert notify_socket.times("WATCHDOG=1", since=silent) == []
        assert proc.poll() is None

        hung.proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        notify_socket.wait_for("WATCHDOG=1", since=resumed, timeout=5)
    finally:
        hung.proc.send_signal(signal.SIGCONT)
        assert stop_daemon(proc) == 0
        hung.stop()


# The update loop's wait fails as it did with a huge update_interval
# (OverflowError from Event.wait), on its second call, after READY=1.
DYING_LOOP = """
import sys
from compute_agent.cmd import agent
from compute_agent.daemon.service import Agent

waits = []
wait = Agent._wait_for_next_cycle

def failing_wait(self, seconds, watchdog):
    waits.append(seconds)
    if len(waits) > 1:
        raise OverflowError("timeout value is too large")
    wait(self, seconds, watchdog)

Agent._wait_for_next_cycle = failing_wait
sys.exit(agent.main(sys.argv[1:]))
"""


def test_a_dying_update_thread_takes_the_daemon_down(tmp_path, placement, notify_socket):
    conf = write_conf(tmp_path, placement.url, f"dying-{uuid.uuid4().hex[:8]}", HOST,
                      DEFAULT={"update_interval": 2})
    log = tmp_path / "agent.log"
    proc = start_daemon(conf, log, notify_socket.environment(),
                        launcher=[sys.executable, "-c", DYING_LOOP])
    try:
        notify_socket.wait_for("READY=1")
        assert proc.wait(30) == 1
    finally:
        stop_daemon(proc)
    died = [line for line in log.read_text().splitlines() if " died: " in line]
    assert len(died) == 1, log.read_text()
    assert ("Thread update-provider-tree died: OverflowError: timeout value is too large"
            in died[0])
    assert "Traceback" not in log.read_text()
    # Not an orderly stop: systemd is to count it a failure and restart.
    assert notify_socket.times("STOPPING=1") == []


# oslo.messaging's poll loop, each RPC server's listener thread, fails at
# once. The orderly stop then waits forever for that thread: the daemon
# must exit all the same.
DYING_LISTENER = """
import sys
from oslo_messaging._drivers import base

def failing_runner(self):
    raise RuntimeError("listener broke")

base.PollStyleListenerAdapter._runner = failing_runner
from compute_agent.cmd import agent
sys.exit(agent.main(sys.argv[1:]))
"""


def test_a_dying_rpc_listener_takes_the_daemon_down(tmp_path, placement, notify_socket):
    conf = write_conf(tmp_path, placement.url, f"deaf-{uuid.uuid4().hex[:8]}", HOST)
    log = tmp_path / "agent.log"
    proc = start_daemon(conf, log, notify_socket.environment(),
                        launcher=[sys.executable, "-c", DYING_LISTENER])
    try:
        assert proc.wait(30) == 1
    finally:
        stop_daemon(proc)
    # The host's one RPC server, its listener broken.
    died = [line for line in log.read_text().splitlines() if " died: " in line]
    assert len(died) == 1, log.read_text()
    assert "(failing_runner) died: RuntimeError: listener broke" in died[0], log.read_text()
    # Its stop cannot end (the dead thread never says it stopped): the
    # daemon goes on without it, no call being in flight.
    text = log.read_text()
    assert "stopping: 0 calls in flight" in text
    assert "The RPC listener did not stop within 1 s: stopping without it\n" in text
    assert notify_socket.times("STOPPING=1") == []
