"""The host's one RPC server (compute_agent/rpc/host_server.py) on a RabbitMQ
node of the test's own: what one agent holds on the broker (two queues,
two connections), its frames while idle, the queues a command leaves
behind (none), and the update loop's watch of the broker through the
server's own connection."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

from compute_agent.rpc.host_server import host_queues
from tests.functional.helpers import write_conf
from tests.waiting import wait_for

BIN = Path(sys.executable).parent
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}
# The bound: an idle agent sends at most one frame every 5 s.
IDLE_FRAMES_PER_SECOND = 0.2


def rows(node, *what: str) -> list[list[str]]:
    out = subprocess.run(["rabbitmqctl", "-q", "-n", node.node, *what, "--no-table-headers"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return [line.split("\t") for line in out.splitlines() if line.strip()]


def queues(node) -> set[str]:
    return {row[0] for row in rows(node, "list_queues", "name")}


def frames_received(node) -> int:
    return sum(int(row[0]) for row in rows(node, "list_connections", "recv_cnt"))


def start_agent(tmp_path: Path, placement_url: str, url: str, **default) -> tuple:
    host = f"one-server-{uuid.uuid4().hex[:6]}"
    conf = write_conf(tmp_path, placement_url, host, HOST,
                      DEFAULT={"transport_url": url, **default})
    log = tmp_path / "agent.log"
    proc = subprocess.Popen([str(BIN / "compute-agent"), "--config-file", str(conf)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: f"compute-agent running as host {host}" in log.read_text(), 60)
    return host, conf, log, proc


def ctl(conf: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "compute-agent-ctl"), "--config-file", str(conf), *args],
                          capture_output=True, text=True, timeout=60)


def test_an_agent_holds_two_queues_and_two_connections_and_is_quiet_while_idle(
        tmp_path, placement, private_rabbitmq):
    """Was: 4 queues of its own (the API's and the heartbeat's servers, a
    fanout queue each, new names at each start), 3 to 4 connections, and
    1.3 to 1.9 frames a second while idle (every wait on the broker bounded
    at 0.5 s for a quick SIGTERM)."""
    host, conf, log, proc = start_agent(tmp_path, placement.url, private_rabbitmq.url,
                                        update_interval=60)
    try:
        # A caller's call, answered: the agent's reply connection is open.
        done = ctl(conf, "host-info", host)
        assert done.returncode == 0, done.stderr
        # Its heartbeat's too (hosts asks each host's heartbeat). The
        # timeout is for the suite's load (5 s was cut at the end of a
        # full run), not a figure of this test.
        done = ctl(conf, "--timeout", "30", "hosts")
        assert done.returncode == 0, done.stderr
        # The commands' reply queues were deleted as they closed: not left
        # for 30 minutes.
        assert queues(private_rabbitmq) == set(host_queues(host))
        assert len(rows(private_rabbitmq, "list_connections", "name")) == 2
        started, before = time.monotonic(), frames_received(private_rabbitmq)
        time.sleep(30)  # idle: the measure is of what 30 s without work costs
        rate = (frames_received(private_rabbitmq) - before) / (time.monotonic() - started)
        assert rate <= IDLE_FRAMES_PER_SECOND, rate
    finally:
        proc.terminate()
        proc.wait(30)
    # A restart declares the same two queues: nothing left behind.
    host_again = start_again(conf, log)
    try:
        assert queues(private_rabbitmq) == set(host_queues(host))
    finally:
        host_again.terminate()
        host_again.wait(30)


def start_again(conf: Path, log: Path) -> subprocess.Popen:
    mark = log.read_text().count("compute-agent running as host")
    proc = subprocess.Popen([str(BIN / "compute-agent"), "--config-file", str(conf)],
                            stdout=open(log, "a"), stderr=subprocess.STDOUT)
    wait_for(lambda: log.read_text().count("compute-agent running as host") > mark, 60)
    return proc


def test_the_loop_sees_the_broker_go_and_come_back_through_the_servers_connection(
        tmp_path, placement, private_rabbitmq):
    # Cycles 3 s apart: the watch says a listener down while the broker
    # takes logins at its second look, a reconnection being a second or two
    # (rpc/host_server.py); 1 s apart, a loaded machine's reconnection after
    # the broker's return spanned two looks and was said as a second outage.
    host, conf, log, proc = start_agent(tmp_path, placement.url, private_rabbitmq.url,
                                        update_interval=3)
    try:
        private_rabbitmq.stop_app()
        try:
            wait_for(lambda: "did not answer (connection refused)" in log.read_text(), 60)
        finally:
            private_rabbitmq.start_app()
        wait_for(lambda: "is back after" in log.read_text(), 90)
        # A request sent before the server has declared its queues again
        # (classic queues are gone with the node's application) is lost:
        # asked again, as a conductor does, until answered.
        wait_for(lambda: ctl(conf, "--timeout", "5", "host-info", host).returncode == 0, 90)
        lines = [line for line in log.read_text().splitlines() if "message broker" in line]
        assert len(lines) == 2, "\n".join(lines)  # one line each way
    finally:
        proc.terminate()
        proc.wait(30)
