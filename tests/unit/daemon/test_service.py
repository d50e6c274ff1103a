"""The first cycle after a start waits its share of update_jitter, as the
loop's later cycles do: a fleet restarted at once does not reach Placement
in one burst."""
from __future__ import annotations

import threading
from pathlib import Path

from compute_agent.daemon.service import AgentSettings, CycleOutcome
from tests.unit.daemon.agents import agent_on_fake_host


class RecordedWaits(threading.Event):
    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def wait(self, timeout=None):
        self.seen.append(("wait", timeout))
        return self.is_set()


def started_agent(state_dir: Path, jitter: float, share: float) -> list:
    """What start() did, in order, with the jitter drawn at ``share`` of
    its range; the loop's own waits after it are left out."""
    agent = agent_on_fake_host(state_dir, AgentSettings(update_interval=3600,
                                                        update_jitter=jitter))
    seen: list = []
    agent.draw_jitter = lambda low, high: low + share * (high - low)
    agent.stopping = RecordedWaits(seen)
    agent.run_cycle = lambda: seen.append("cycle") or CycleOutcome(True)
    agent._loop = lambda watchdog: None
    agent.start()
    agent.stop()
    return seen[:2]


def test_the_first_cycle_waits_its_share_of_the_jitter(tmp_path):
    assert started_agent(tmp_path / "a", jitter=30, share=0.5) == [("wait", 15.0), "cycle"]
    assert started_agent(tmp_path / "b", jitter=30, share=1.0) == [("wait", 30.0), "cycle"]


def test_without_jitter_the_first_cycle_is_at_once(tmp_path):
    assert started_agent(tmp_path, jitter=0, share=0.7) == [("wait", 0.0), "cycle"]


def test_bug_claims_saw_a_device_taken_out_only_after_placement_reserved_it(tmp_path):
    """The cycle wrote Placement (the device reserved), then the store's
    copy of its view, and only then gave the tracker the pools without the
    device: a claim in that window got it (test_device_health's claim
    after an AER error, once in a clean-clone CI run). The tracker has
    this cycle's pools before the sync writes anything."""
    agent = agent_on_fake_host(tmp_path)
    seen_by_claims = []

    def sync(tree):
        seen_by_claims.append(agent.manager.tracker.pools())
        raise RuntimeError("the test's Placement stops here")

    built = agent.build_model(agent.driver.get_host_inventory())
    agent.build_model = lambda inventory: built
    agent.sync.sync = sync
    try:
        agent.update_provider_tree()
    except RuntimeError:
        pass
    assert built.pools_by_uuid({})  # the host has pools to see
    assert seen_by_claims == [built.pools_by_uuid({})]
