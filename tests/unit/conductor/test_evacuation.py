"""The conductor's side of an evacuation (compute_agent/conductor/evacuation.py)."""
from __future__ import annotations

from compute_agent.conductor.evacuation import lost_a_race
from compute_agent.exception import GenerationConflict, PlacementError


def test_only_a_409_on_the_allocation_write_is_worth_fresh_candidates():
    capacity = PlacementError("Placement answered 409 to POST /allocations: Unable to "
                              "allocate inventory", 409, "placement.undefined_code")
    assert lost_a_race(capacity)
    assert lost_a_race(GenerationConflict("POST /allocations: consumer generation", 409,
                                          "placement.concurrent_update"))
    assert not lost_a_race(PlacementError("Placement answered 400 to POST "
                                          "/allocations: bad", 400, None))
