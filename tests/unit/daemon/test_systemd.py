"""The notify protocol's sender, the watchdog's period, and the supervisor
that takes the daemon down when a thread dies."""
from __future__ import annotations

import os
import socket
import threading
import uuid

import pytest

from compute_agent.daemon import systemd
from compute_agent.daemon.supervisor import Supervisor


@pytest.fixture
def manager_socket():
    """A datagram socket standing for systemd's end of NOTIFY_SOCKET."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.settimeout(5)
    yield s
    s.close()


def test_notify_sends_one_datagram_to_a_socket_path(tmp_path, manager_socket, monkeypatch):
    manager_socket.bind(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    assert systemd.notify("READY=1", "STATUS=serving")
    assert manager_socket.recv(4096) == b"READY=1\nSTATUS=serving"


def test_notify_reaches_an_abstract_socket_named_with_an_at(manager_socket, monkeypatch):
    name = f"compute-agent-test-{uuid.uuid4().hex}"
    manager_socket.bind("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    assert systemd.notify("WATCHDOG=1")
    assert manager_socket.recv(4096) == b"WATCHDOG=1"


def test_notify_outside_systemd_or_to_a_vanished_socket_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not systemd.notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert not systemd.notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert not systemd.notify("READY=1")


def test_the_watchdog_pings_at_half_its_timeout(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    watchdog = systemd.watchdog_from_environment()
    assert watchdog is not None
    assert (watchdog.timeout, watchdog.interval) == (4.0, 2.0)
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_from_environment() == watchdog


@pytest.mark.parametrize("usec, pid", [(None, None), ("4000000", "1"), ("soon", None),
                                       ("0", None), ("-5", None)])
def test_no_watchdog_unset_for_another_process_or_invalid(monkeypatch, usec, pid):
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert systemd.watchdog_from_environment() is None


def test_a_thread_that_dies_wakes_the_supervisor_naming_it_and_where(monkeypatch, caplog):
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    supervisor = Supervisor()
    supervisor.install()

    def loop():
        threading.Event().wait(10 ** 23)  # the OverflowError of a huge interval

    thread = threading.Thread(target=loop, name="update-provider-tree")
    thread.start()
    thread.join(5)
    assert supervisor.wake.wait(5)
    supervisor.report()
    [death] = supervisor.deaths
    assert death.thread == "update-provider-tree"
    assert death.error.startswith("OverflowError: ")
    # Where it was raised, and the project's last frame on the way.
    assert "threading.py:" in death.error
    assert "from tests/unit/daemon/test_systemd.py:" in death.error and "in loop)" in death.error
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "update-provider-tree" in errors[0].getMessage()
    assert errors[0].exc_info is None  # one line; the traceback is for --debug


def test_a_thread_ending_by_system_exit_is_a_death_too(monkeypatch):
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    supervisor = Supervisor()
    supervisor.install()

    def listener():
        raise SystemExit(3)

    thread = threading.Thread(target=listener, name="rpc-listener")
    thread.start()
    thread.join(5)
    assert supervisor.wake.wait(5)
    assert [d.thread for d in supervisor.deaths] == ["rpc-listener"]
