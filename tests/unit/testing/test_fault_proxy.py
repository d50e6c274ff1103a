"""The fault proxy (compute_agent/testing/fault_proxy.py) without a
Placement: which fault each request draws. (tests/reliability/
test_fault_proxy.py runs it in front of a real Placement.)"""
from __future__ import annotations

from collections import Counter

import pytest

from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault

# Nothing is sent there: these proxies are never started.
UPSTREAM = "http://127.0.0.1:1"


def test_one_seed_gives_one_sequence_of_faults():
    rates = {PlacementFault.CONFLICT: 0.2, PlacementFault.RESET_AFTER: 0.2,
             PlacementFault.DELAY: 0.2}
    runs = []
    for _ in range(2):
        proxy = FaultProxy(UPSTREAM, rates, seed=42)
        runs.append([proxy.draw("PUT", "/traits/CUSTOM_X") for _ in range(200)])
        proxy.stop()
    assert runs[0] == runs[1]
    assert {f for f in runs[0] if f} == set(rates)
    # About the configured share of each, not all of one.
    assert all(20 <= runs[0].count(f) <= 60 for f in rates), Counter(runs[0])


@pytest.mark.parametrize("rates", [{PlacementFault.DELAY: 1.5}, {PlacementFault.DELAY: -0.1},
                                   {PlacementFault.DELAY: 0.6, PlacementFault.CONFLICT: 0.6}])
def test_rates_out_of_range_are_refused_naming_them(rates):
    with pytest.raises(ValueError, match="DELAY"):
        FaultProxy(UPSTREAM, rates)
