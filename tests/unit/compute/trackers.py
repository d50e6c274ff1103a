"""A tracker on a store of its own, for the unit tests of the tracker and
of what it keeps (the compute and cleaning packages)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compute_agent.compute.tracker import Tracker
from compute_agent.store.store import Store


@contextmanager
def tracker_on(directory: Path, pools: dict) -> Iterator[Tracker]:
    """A tracker holding ``pools``, on a store in ``directory``, closed after."""
    store = Store(directory / "state.db")
    tracker = Tracker(store, "boot-1")
    tracker.set_pools(pools)
    try:
        yield tracker
    finally:
        store.close()
