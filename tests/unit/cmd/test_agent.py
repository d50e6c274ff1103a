"""compute-agent's entry point (compute_agent/cmd/agent.py): SIGHUP is
caught before the daemon's modules are imported, since its default action
ends the process and those imports take half a second or more."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from compute_agent.cmd import agent, daemon
from compute_agent.daemon.reload_signal import ReloadSignal


@pytest.fixture
def sighup_as_it_was():
    before = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, before)


def test_the_daemon_runs_with_sighup_already_caught(monkeypatch, sighup_as_it_was):
    seen = []

    def body(reload_signal, argv):
        seen.append((reload_signal, argv, signal.getsignal(signal.SIGHUP)))
        return 7

    monkeypatch.setattr(daemon, "main", body)
    assert agent.main(["--once"]) == 7
    [(reload_signal, argv, handler)] = seen
    assert isinstance(reload_signal, ReloadSignal) and argv == ["--once"]
    assert handler == reload_signal._on_sighup


def test_the_entry_point_imports_nothing_of_the_daemon_before_main():
    """In a new interpreter, as the console script starts."""
    imported = subprocess.run(
        [sys.executable, "-c", "import json, sys; import compute_agent.cmd.agent; "
         "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
         "('compute_agent', 'oslo_config', 'oslo_messaging', 'libvirt'))))"],
        capture_output=True, text=True, check=True).stdout
    assert json.loads(imported) == ["compute_agent", "compute_agent.cmd",
                                    "compute_agent.cmd.agent", "compute_agent.daemon",
                                    "compute_agent.daemon.reload_signal"]
