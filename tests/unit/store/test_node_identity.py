"""The compute node's UUID in <state_path>/compute_id, the file and format
nova-compute uses."""
from __future__ import annotations

import stat
import uuid

import pytest

from compute_agent.exception import ConfigError
from compute_agent.store import node_identity

NODE = "5d2bd8a6-8f2f-4f0b-9c55-0e1c9d1b6c11"


def test_a_host_without_the_file_has_no_uuid_yet(tmp_path):
    assert node_identity.load(str(tmp_path)) is None
    assert node_identity.load(str(tmp_path / "not-made-yet")) is None


def test_novas_file_is_read_as_it_writes_it(tmp_path):
    # nova-compute writes the UUID and a newline; an operator's editor may
    # leave spaces or capitals.
    (tmp_path / "compute_id").write_text(f"  {NODE.upper()}\n")
    assert node_identity.load(str(tmp_path)) == NODE


def test_a_file_that_is_not_a_uuid_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "compute_id"
    path.write_text("compute-1\n")
    with pytest.raises(ConfigError) as raised:
        node_identity.load(str(tmp_path))
    assert str(raised.value) == f"{path}: not a UUID (value: 'compute-1')"


def test_a_recorded_uuid_is_read_back_from_a_private_file(tmp_path):
    node_identity.record(str(tmp_path), NODE)
    path = tmp_path / "compute_id"
    assert path.read_text() == f"{NODE}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert node_identity.load(str(tmp_path)) == NODE


def test_a_new_uuid_is_random_and_written_only_when_recorded(tmp_path):
    made = node_identity.new_uuid()
    assert uuid.UUID(made).version == 4 and made != node_identity.new_uuid()
    assert node_identity.load(str(tmp_path)) is None
