"""rename-host: the store recorded as another host name's, on purpose."""
from __future__ import annotations

import pytest

from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import inspect_store, stored_host
from compute_agent.store.renaming import Renaming, rename_host
from compute_agent.store.store import Store
from tests.unit.store.stores import ROOT_UUID


def test_rename_host_records_the_new_name_and_says_what_it_was(tmp_path):
    path = tmp_path / "state.db"
    Store(path, ROOT_UUID, host="node1").close()
    renamed = rename_host(path, "node1.example.com")
    assert renamed == Renaming(path, "node1", "node1.example.com")
    assert renamed.describe() == (
        f"store {path} now belongs to host node1.example.com (it belonged to host "
        "node1); the next start renames its root provider in Placement to "
        "node1.example.com")
    assert stored_host(path).name == "node1.example.com"
    facts = inspect_store(path)
    assert (facts.root_uuid, facts.sequence) == (ROOT_UUID, 0)  # nothing else changed


def test_rename_host_names_an_older_store_that_recorded_none(tmp_path):
    path = tmp_path / "state.db"
    Store(path, ROOT_UUID).close()
    renamed = rename_host(path, "node2")
    assert renamed.previous is None and "it recorded no host name" in renamed.describe()
    assert stored_host(path).name == "node2"


def test_rename_host_refuses_when_there_is_no_store(tmp_path):
    with pytest.raises(StoreError, match="is missing: there is no store to rename"):
        rename_host(tmp_path / "state.db", "node2")
    assert not (tmp_path / "state.db").exists()
