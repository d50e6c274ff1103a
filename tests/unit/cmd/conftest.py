"""Fixtures shared by the commands' unit tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def conf_file(tmp_path) -> Path:
    """A config file that sets [DEFAULT] host, and nothing else."""
    path = tmp_path / "agent.conf"
    path.write_text("[DEFAULT]\nhost = here\n")
    return path
