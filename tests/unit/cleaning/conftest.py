from __future__ import annotations

import pytest

from tests.unit.cleaning.devices import pools
from tests.unit.compute.trackers import tracker_on


@pytest.fixture
def tracker(tmp_path):
    """A tracker of devices.py's one-time-use devices, on its own store."""
    with tracker_on(tmp_path, pools()) as t:
        yield t
