"""The real daemon behind the fault proxy, while its host changes under
it: it stays up, and once the faults stop Placement shows the tree of an
agent that was never faulted, within three cycles."""
from __future__ import annotations

from tests.reliability.placement_faults import Scenario


def test_the_daemon_converges_after_20_percent_placement_faults(tmp_path, placement):
    outcome = Scenario(tmp_path, placement.url, fault_rate=0.2, seed=16).run(
        seconds=15, fault_kinds=6, longest=60)
    assert outcome.problems == [], "\n".join(outcome.problems)
    # The run did meet faults of each kind and changed the host.
    assert len(outcome.injected) >= 6, outcome.injected
    assert outcome.changes >= 10 and outcome.cycles >= 5, outcome
