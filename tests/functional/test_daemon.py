"""compute-agent and compute-agent-manage as operators run them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from compute_agent.store import node_identity
from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault
from compute_agent.testing.local_placement import free_port
from tests.functional.helpers import wait_for, write_conf

BIN = Path(sys.executable).parent
CHECKOUT = Path(__file__).resolve().parents[2]
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}


def run(command: str, conf: Path, *args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / command), "--config-file", str(conf), *args],
                          capture_output=True, text=True, timeout=timeout)


def start_daemon(conf: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "compute-agent"), "--config-file", str(conf)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def test_once_registers_the_host_and_manage_shows_it(tmp_path, placement):
    conf = write_conf(tmp_path, placement.url, "daemon-once", HOST)
    done = run("compute-agent", conf, "--once")
    assert done.returncode == 0, done.stderr

    shown = run("compute-agent-manage", conf, "tree", "--json")
    assert shown.returncode == 0, shown.stderr
    tree = {p["name"]: p for p in json.loads(shown.stdout)["placement"]}
    assert tree["daemon-once_numa_0"]["inventories"]["VCPU"]["total"] == 4
    assert (tree["daemon-once_numa_0"]["parent_provider_uuid"]
            == tree["daemon-once"]["uuid"])


def test_an_invalid_option_is_one_line_naming_it_and_exit_2(tmp_path, placement):
    conf = write_conf(tmp_path, placement.url, "bad-conf", HOST,
                      DEFAULT={"update_interval": "soon"})
    done = run("compute-agent", conf, "--once")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "[DEFAULT] update_interval" in lines[0] and "'soon'" in lines[0]


def test_an_invalid_device_spec_names_the_option_and_the_field(tmp_path, placement):
    conf = write_conf(tmp_path, placement.url, "bad-spec", HOST,
                      pci={"device_spec": '{"vendor_id": "80861"}'})
    done = run("compute-agent", conf, "--once")
    assert done.returncode == 2
    assert "[pci] device_spec: vendor_id" in done.stderr and "80861" in done.stderr


def test_once_without_placement_fails_with_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    conf = write_conf(tmp_path, url, "no-placement", HOST)
    done = run("compute-agent", conf, "--once")
    assert done.returncode == 1
    reason = [l for l in done.stderr.splitlines() if l.startswith("compute-agent:")]
    assert len(reason) == 1 and reason[0].startswith("compute-agent: cycle failed ("), \
        done.stderr
    assert reason[0].endswith(f"): Placement at {url} did not answer (connection refused)")
    assert "Traceback" not in done.stderr


def test_the_daemon_outlives_a_placement_that_does_not_answer(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    conf = write_conf(tmp_path, url, "lonely", HOST)
    log = tmp_path / "agent.log"
    record = tmp_path / "state" / "last_cycle.json"
    proc = start_daemon(conf, log)

    def placement_failures() -> int:
        if not record.exists():
            return 0
        doc = json.loads(record.read_text())
        return next(d["failures"] for d in doc["dependencies"]
                    if d["dependency"] == "Placement")

    try:
        wait_for(lambda: placement_failures() >= 3)
        assert proc.poll() is None
        # Said once; the cycles after it only count.
        assert log.read_text().count(f"Placement at {url} did not answer") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_sigterm_stops_an_idle_daemon_within_2_s_with_exit_0_and_no_warning(
        tmp_path, placement):
    """Idle: its cycle done, the next a minute away, its RPC listeners
    waiting on the real broker (they took up to 5 s each to see the stop,
    and closing them logged two py-amqp warnings)."""
    conf = write_conf(tmp_path, placement.url, "sigterm", HOST,
                      DEFAULT={"update_interval": 60})
    log = tmp_path / "agent.log"
    proc = start_daemon(conf, log)
    wait_for(lambda: "compute-agent running as host" in log.read_text(), 60)
    time.sleep(3)  # the listeners' waits on the broker grow while idle
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    took = time.monotonic() - started
    text = log.read_text()
    assert "compute-agent stopped" in text
    assert [line for line in text.splitlines()
            if " WARNING " in line or " ERROR " in line] == []
    assert took < 2, f"SIGTERM to exit took {took:.2f} s"


def start_quiet_daemon(tmp_path: Path, placement, host: str
                       ) -> tuple[Path, Path, subprocess.Popen]:
    """A daemon whose next cycle is an hour away: its config, its log, it."""
    conf = write_conf(tmp_path, placement.url, host, HOST,
                      DEFAULT={"update_interval": 3600})
    log = tmp_path / "agent.log"
    return conf, log, start_daemon(conf, log)


def test_sighup_drops_the_placement_cache(tmp_path, placement):
    conf, log, proc = start_quiet_daemon(tmp_path, placement, "sighup")
    try:
        wait_for(lambda: "sighup_numa_0" in run("compute-agent-manage", conf, "tree").stdout)
        mark = placement.mark()
        proc.send_signal(signal.SIGHUP)
        # With its cache gone, the agent reads every provider again.
        wait_for(lambda: any("/inventories" in r for r in placement.requests_since(mark)))
        wait_for(lambda: "Placement cache dropped" in log.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_sigusr2_writes_every_threads_stack_and_the_daemon_goes_on(tmp_path, placement):
    conf, log, proc = start_quiet_daemon(tmp_path, placement, "sigusr2")
    try:
        wait_for(lambda: "compute-agent running as host" in log.read_text(), 60)
        proc.send_signal(signal.SIGUSR2)
        # The main thread waits in serve() for a stop; the RPC servers'
        # threads are there too.
        wait_for(lambda: 'in serve' in log.read_text())
        assert proc.poll() is None
        assert run("compute-agent-manage", conf, "tree").returncode == 0
    finally:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert log.read_text().count("Thread 0x") > 2


# Put on the daemon's PYTHONPATH, with the checkout for the tests' waiting
# helper: holds the import of oslo_messaging (one of the daemon's heavy
# modules, imported at start) until the test says go, so that a signal
# surely comes while the daemon imports its modules.
HOLD_AN_IMPORT = """
import os, sys

from tests.waiting import wait_for

class HoldImport:
    def find_spec(self, name, path=None, target=None):
        if name == "oslo_messaging":
            sys.meta_path.remove(self)
            open(os.environ["HOLD_MARK"], "w").close()
            wait_for(lambda: os.path.exists(os.environ["HOLD_GO"]), timeout=30, interval=0.01)
        return None

sys.meta_path.insert(0, HoldImport())
"""


def test_bug_sighup_while_the_daemon_imports_its_modules_ended_it(tmp_path, placement):
    """The SIGHUP handler was installed by main, after half a second or more
    of imports; a SIGHUP in that time ended the daemon."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD_AN_IMPORT)
    mark, go = tmp_path / "importing", tmp_path / "go"
    conf = write_conf(tmp_path, placement.url, "sighup-importing", HOST,
                      DEFAULT={"update_interval": 3600})
    log = tmp_path / "agent.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(CHECKOUT)]),
           "HOLD_MARK": str(mark), "HOLD_GO": str(go)}
    proc = start_daemon(conf, log, env)
    try:
        wait_for(lambda: mark.exists() or proc.poll() is not None)
        proc.send_signal(signal.SIGHUP)
        go.touch()
        wait_for(lambda: "compute-agent running as host" in log.read_text()
                 or proc.poll() is not None)
        assert proc.poll() is None, f"exit {proc.returncode}: {log.read_text()}"
        assert "SIGHUP during start-up" in log.read_text()
    finally:
        go.touch()
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_a_sighup_during_start_up_does_not_kill_the_daemon(tmp_path, placement):
    """A SIGHUP (logrotate, a reload) that comes while the daemon starts is
    a cache drop like any other, not the end of the process."""
    with FaultProxy(placement.url, delay=2) as proxy:
        conf = write_conf(tmp_path, proxy.url, "sighup-early", HOST,
                          DEFAULT={"update_interval": 3600})
        # A host known by its compute_id whose store is absent asks
        # Placement for its allocations before the agent exists: that
        # request, held, keeps the daemon in start-up while the signal comes.
        (tmp_path / "state").mkdir(mode=0o700)
        (tmp_path / "state" / node_identity.FILENAME).write_text(str(uuid.uuid4()))
        proxy.once(PlacementFault.DELAY, "GET", "/")
        log = tmp_path / "agent.log"
        proc = start_daemon(conf, log)
        try:
            wait_for(lambda: proxy.requests >= 1 or proc.poll() is not None)
            assert "compute-agent running as host" not in log.read_text()
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "compute-agent running as host" in log.read_text()
                     or proc.poll() is not None)
            assert proc.poll() is None, f"exit {proc.returncode}: {log.read_text()}"
            assert "SIGHUP during start-up" in log.read_text()
            assert "sighup-early_numa_0" in run("compute-agent-manage", conf,
                                                "tree").stdout
        finally:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
