"""The supervisor's refusal: a thread that finds another agent serving
this host stops the daemon with exit 2, not as a death (exit 1, which
systemd would restart)."""
from __future__ import annotations

import threading

from compute_agent.daemon.errors import AnotherAgentServesHost
from compute_agent.daemon.supervisor import Supervisor


def test_a_thread_ending_because_another_agent_serves_the_host_is_a_refusal(monkeypatch):
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    supervisor = Supervisor()
    supervisor.install()

    def cycle():
        raise AnotherAgentServesHost("another agent serves host node1: ...")

    thread = threading.Thread(target=cycle, name="update-provider-tree")
    thread.start()
    thread.join(5)
    assert supervisor.wake.wait(5)
    assert supervisor.deaths == []
    assert str(supervisor.refusal) == "another agent serves host node1: ..."
