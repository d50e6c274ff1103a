"""The first cycle after a start waits its share of update_jitter, as the
loop's later cycles do: a fleet restarted at once does not reach Placement
in one burst."""
from __future__ import annotations

import threading

from compute_agent.daemon.service import Agent, AgentSettings, CycleOutcome, placement_sync
from compute_agent.drivers.fake import FakeDriver
from compute_agent.tree.host_tree import TreePolicy

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
HOST = {"numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}], "disk_gb": 10}


class UnusedClient:
    """No request is made: the cycles are the test's own."""
    keystone_url = None
    url = "http://placement.invalid"


class RecordedWaits(threading.Event):
    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def wait(self, timeout=None):
        self.seen.append(("wait", timeout))
        return self.is_set()


def started_agent(jitter: float, share: float) -> list:
    """What start() did, in order, with the jitter drawn at ``share`` of
    its range; the loop's own waits after it are left out."""
    sync, allocations = placement_sync(UnusedClient(), ROOT, lambda p: True, 300)
    agent = Agent(FakeDriver(HOST), TreePolicy(host="h", root_uuid=ROOT), sync, allocations,
                  settings=AgentSettings(update_interval=3600, update_jitter=jitter))
    seen: list = []
    agent.draw_jitter = lambda low, high: low + share * (high - low)
    agent.stopping = RecordedWaits(seen)
    agent.run_cycle = lambda: seen.append("cycle") or CycleOutcome(True)
    agent._loop = lambda watchdog: None
    agent.start()
    agent.stop()
    return seen[:2]


def test_the_first_cycle_waits_its_share_of_the_jitter():
    assert started_agent(jitter=30, share=0.5) == [("wait", 15.0), "cycle"]
    assert started_agent(jitter=30, share=1.0) == [("wait", 30.0), "cycle"]


def test_without_jitter_the_first_cycle_is_at_once():
    assert started_agent(jitter=0, share=0.7) == [("wait", 0.0), "cycle"]
