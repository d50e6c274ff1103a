"""Configs for the start-up check's tests: a fake-driver agent's, with
the text a test adds, and paths under the test's own tmp_path."""
from __future__ import annotations

from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.exception import ConfigError

# Stands for a path under the test's own tmp_path that nothing creates: an
# absolute path such as /nonexistent may exist on a shared machine.
ABSENT = "<absent>"


def owned(value, tmp_path: Path):
    """``value`` with ABSENT made tmp_path / "absent"."""
    return value.replace(ABSENT, str(tmp_path / "absent")) if isinstance(value, str) else value


def conf_argv(tmp_path, text: str) -> list[str]:
    """The command line of a config for a fake-driver agent, with ``text``
    after its own lines."""
    host = tmp_path / "host.yaml"
    host.write_text("numa_cells: [{id: 0, cpus: '0-3', memory_mb: 4096}]\n")
    path = tmp_path / "agent.conf"
    path.write_text(f"[DEFAULT]\nstate_path = {tmp_path}/state\ncompute_driver = fake\n"
                    f"[fake]\nhost_file = {host}\n[DEFAULT]\n" + text)
    return ["--config-file", str(path)]


def refused(tmp_path, text: str, placement_required: bool = True) -> str:
    """The one line load_config refuses that config with."""
    with pytest.raises(ConfigError) as e:
        load_config(conf_argv(tmp_path, text), placement_required=placement_required)
    assert "\n" not in str(e.value)
    return str(e.value)
