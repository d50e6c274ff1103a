"""``compute-agent-manage status`` and ``audit`` on a host whose agent ran a
cycle (the real LibvirtDriver on libvirt's test driver, a real Placement,
a real RabbitMQ), beside the agent holding its state directory; then each
part broken in turn: Placement stopped, libvirt unreachable, the broker
stopped, the store's bytes overwritten, Keystone refusing the agent.
Each gives its own line and the right exit code."""
from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.store import lock
from compute_agent.store.schema import SCHEMA_VERSION
from compute_agent.testing.local_placement import LocalPlacement, free_port
from tests.functional.keystone_standin import KeystoneStandin
from tests.functional.libvirt_host import Host

RABBIT = "rabbit://guest:guest@127.0.0.1:5672/"


def manage(conf: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "compute_agent.cmd.manage", "--config-file",
                           str(conf), *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def status(conf: Path) -> tuple[int, dict[str, dict], list[str]]:
    """exit code, the JSON checks by name, the plain lines."""
    done = manage(conf, "status", "--json")
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    plain = manage(conf, "status")
    assert plain.returncode == done.returncode, plain.stdout
    return done.returncode, checks, plain.stdout.splitlines()


def levels(checks: dict[str, dict]) -> dict[str, str]:
    return {name: c["level"] for name, c in checks.items()}


def rewrite(conf: Path, **sections: dict) -> None:
    """Set options in the config file, section by section; None removes
    one. Other lines (lists repeat their key) stay as they are."""
    out: list[str] = []
    section = None

    def flush_section() -> None:
        for key, value in sections.get(section, {}).items():
            if value is not None:
                out.append(f"{key} = {value}")

    for line in conf.read_text().splitlines():
        if line.startswith("["):
            flush_section()
            section = line.strip("[]")
        elif section in sections and line.split(" =")[0] in sections[section]:
            continue
        out.append(line)
    flush_section()
    conf.write_text("\n".join(out) + "\n")


class RunningHost:
    """A host whose agent ran a cycle and holds the state directory, as a
    running agent does (status takes no lock)."""

    def __init__(self, tmp_path: Path, placement_url: str, transport_url: str = RABBIT,
                 **placement_options):
        self.host = Host(tmp_path, placement_url)
        self.host.build_default()
        self.conf = self.host.write_conf(default={"transport_url": transport_url})
        if placement_options:
            self.rewrite(placement=placement_options)
        self.agent = compose(load_config(["--config-file", str(self.conf)]))
        self.lock = lock.acquire(str(tmp_path / "state"))
        self.agent.driver.init_host()

    def rewrite(self, **sections: dict) -> None:
        rewrite(self.conf, **sections)

    def close(self) -> None:
        self.lock.release()
        self.agent.stop()


@pytest.fixture
def running(tmp_path, placement, services):
    h = RunningHost(tmp_path, placement.url)
    yield h
    h.close()


def test_healthy_host(running):
    assert running.agent.run_cycle().ok
    code, checks, lines = status(running.conf)
    assert code == 0, lines
    assert set(levels(checks).values()) == {"ok"}, lines
    assert set(checks) == {"hypervisor", "placement", "broker", "store", "store_schema",
                           "store_integrity", "last_cycle", "unhealed", "audit",
                           "device_health"}
    assert checks["device_health"]["line"] == "no device out of scheduling"
    assert checks["hypervisor"]["line"].startswith("libvirt at test:///")
    assert checks["placement"]["line"] == (f"Placement at {running.host.url} answered "
                                           "(microversion 1.39)")
    assert checks["broker"]["line"] == "the message broker at rabbit://127.0.0.1:5672/ answered"
    assert checks["store_schema"]["line"] == f"store schema version {SCHEMA_VERSION}"
    assert checks["last_cycle"]["line"].startswith("last successful cycle ")
    assert lines[-1] == "healthy"
    # No credential of the transport URL is ever shown.
    assert "guest" not in "\n".join(lines)


def test_placement_stopped(tmp_path, services):
    own = LocalPlacement(tmp_path / "placement").start()
    try:
        h = RunningHost(tmp_path / "host", own.url)
        try:
            assert h.agent.run_cycle().ok
            own.stop()
            code, checks, lines = status(h.conf)
            assert code == 2, lines
            assert checks["placement"] == {
                "check": "placement", "level": "broken",
                "line": f"Placement at {own.url} did not answer (connection refused)"}
            # What needs Placement is unknown, never good.
            assert checks["unhealed"]["level"] == checks["audit"]["level"] == "warning"
            assert "unknown" in checks["audit"]["line"]
            assert levels(checks)["hypervisor"] == levels(checks)["broker"] == "ok"
            assert f"BROKEN  Placement at {own.url} did not answer (connection refused)" \
                in lines

            # audit: not "consistent" when it could not read Placement.
            done = manage(h.conf, "audit")
            assert done.returncode == 2, done.stdout
            assert done.stdout.splitlines()[-1] == "unknown"
            assert f"Placement at {own.url} did not answer" in done.stdout
            doc = json.loads(manage(h.conf, "audit", "--json").stdout)
            assert doc["consistent"] is None and doc["unknown"]
        finally:
            h.close()
    finally:
        own.stop()


def test_audit_of_a_reachable_placement_is_consistent(running):
    assert running.agent.run_cycle().ok
    done = manage(running.conf, "audit")
    assert (done.returncode, done.stdout) == (0, "consistent\n")


def test_libvirt_unreachable(running, tmp_path):
    assert running.agent.run_cycle().ok
    socket = tmp_path / "gone" / "libvirt-sock"
    uri = f"qemu+unix:///system?socket={socket}"
    running.rewrite(libvirt={"connection_uri": uri})
    code, checks, lines = status(running.conf)
    assert code == 2, lines
    assert checks["hypervisor"]["level"] == "broken"
    assert checks["hypervisor"]["line"].startswith(f"libvirt at {uri} did not answer (")
    assert str(socket) in checks["hypervisor"]["line"]
    assert levels(checks)["placement"] == "ok"
    assert len(checks["hypervisor"]["line"]) <= 160
    done = manage(running.conf, "audit")
    assert done.returncode == 2 and done.stdout.splitlines()[-1] == "unknown", done.stdout


def test_broker_stopped(tmp_path, placement, private_rabbitmq):
    h = RunningHost(tmp_path, placement.url, transport_url=private_rabbitmq.url)
    try:
        assert h.agent.run_cycle().ok
        code, checks, _ = status(h.conf)
        assert code == 0 and checks["broker"]["level"] == "ok"
        private_rabbitmq.stop_app()
        code, checks, lines = status(h.conf)
        assert code == 2, lines
        assert checks["broker"] == {
            "check": "broker", "level": "broken",
            "line": f"the message broker at rabbit://127.0.0.1:{private_rabbitmq.port}/ "
                    "did not answer (connection refused)"}
        assert levels(checks)["placement"] == levels(checks)["hypervisor"] == "ok"
    finally:
        h.close()


def test_corrupted_store(running):
    assert running.agent.run_cycle().ok
    running.agent.manager.tracker.store.close()
    store = running.host.dir / "state" / "state.db"
    # Overwrite the second page (a table's b-tree) with junk: the file
    # still opens as SQLite.
    with open(store, "r+b") as f:
        f.seek(4096)
        f.write(b"\xde\xad\xbe\xef" * 1024)
    code, checks, lines = status(running.conf)
    assert code == 2, lines
    assert checks["store"]["level"] == "broken"
    assert checks["store"]["line"].startswith(f"store {store}: corrupt")
    assert levels(checks)["placement"] == levels(checks)["hypervisor"] == "ok"
    assert checks["audit"]["level"] == "warning" and "unknown" in checks["audit"]["line"]
    done = manage(running.conf, "audit")
    assert done.returncode == 2 and done.stdout.splitlines()[-1] == "unknown", done.stdout


def test_a_stale_record_says_the_loop_is_not_running(running):
    assert running.agent.run_cycle().ok
    running.rewrite(DEFAULT={"update_interval": 1})
    record = running.host.dir / "state" / "last_cycle.json"
    doc = json.loads(record.read_text())
    doc["last_success_at"] -= 3600
    record.write_text(json.dumps(doc))
    code, checks, lines = status(running.conf)
    assert code == 2, lines
    assert checks["last_cycle"]["line"].startswith("last successful cycle 36")
    assert "not running" in checks["last_cycle"]["line"]


def test_keystone_refusing_is_said_as_keystone_once_each_way(tmp_path, placement,
                                                             services, caplog):
    keystone = KeystoneStandin(free_port(), placement.url).start()
    try:
        h = RunningHost(tmp_path, placement.url, auth_type="password",
                        auth_url=keystone.auth_url, username="compute-agent",
                        password="s3cret-pw", project_name="service",
                        user_domain_name="Default", project_domain_name="Default",
                        endpoint=None)
        try:
            with caplog.at_level(logging.DEBUG):
                assert h.agent.run_cycle().ok  # through Keystone's catalog
                keystone.refuse = True
                # A new process, as after a restart: it must ask Keystone.
                code, checks, lines = status(h.conf)
                assert code == 2, lines
                assert checks["keystone"]["level"] == "broken"
                assert checks["keystone"]["line"].startswith(
                    f"Keystone at {keystone.auth_url} refused the credentials (401)")
                assert checks["placement"]["level"] == "warning"
                h.agent.sync.client.adapter.session.auth.invalidate()
                outcomes = [h.agent.run_cycle() for _ in range(3)]
                keystone.refuse = False
                assert h.agent.run_cycle().ok and h.agent.run_cycle().ok
            assert [o.ok for o in outcomes] == [False] * 3
            assert outcomes[0].reason.startswith(f"Keystone at {keystone.auth_url} refused")
            said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
                    and any(word in r.getMessage() for word in (
                        "Keystone", "Placement at", "did not answer", "Unauthorized"))]
            # The outage's length in whole seconds: 0, or 1 on a loaded machine.
            assert [re.sub(r", \d s$", ", N s", line) for line in said] == [
                f"Keystone at {keystone.auth_url} refused the credentials (401): check "
                "[placement] username, password and domains",
                f"Keystone at {keystone.auth_url} is back after 3 failed cycles, N s"]
            assert all(len(line) <= 160 for line in said)
            text = caplog.text
            assert "s3cret-pw" not in text
        finally:
            h.close()
    finally:
        keystone.stop()


def test_keystone_not_answering_is_said_as_keystone(tmp_path, placement):
    port = free_port()  # nothing listens there
    host = Host(tmp_path, placement.url)
    host.build_default()
    conf = host.write_conf()
    rewrite(conf, placement={"auth_type": "password",
                         "auth_url": f"http://127.0.0.1:{port}/v3",
                         "username": "u", "password": "p", "project_name": "service",
                         "user_domain_name": "Default", "project_domain_name": "Default",
                         "endpoint": None})
    done = subprocess.run([sys.executable, "-m", "compute_agent.cmd.agent", "--config-file",
                           str(conf), "--once"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    # Placement was never asked.
    last = done.stderr.splitlines()[-1]
    assert last.startswith("compute-agent: cycle failed (0 Placement requests, "), last
    assert last.endswith(f"): Keystone at http://127.0.0.1:{port}/v3 did not answer "
                         "(connection refused)"), last
    assert "Placement at" not in done.stderr
