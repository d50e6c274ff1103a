"""Fixtures shared by unit and functional tests."""
import pytest

from agent.testing.local_placement import LocalPlacement


@pytest.fixture(scope="session")
def placement(tmp_path_factory):
    """A real openstack-placement on SQLite, shared by the session. Tests
    keep apart by using their own host names (so their own trees)."""
    server = LocalPlacement(tmp_path_factory.mktemp("placement")).start()
    yield server
    server.stop()
