"""The start's steps around its first cycle (compute_agent/daemon/start_up.py):
each does its work with what the agent has, and the start outlives its
failure, an expected one as one warning, a bug as its traceback."""
from __future__ import annotations

import pytest

from compute_agent.daemon import start_up
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.exception import AgentError, PlacementError, PlacementUnavailable
from compute_agent.store.errors import StoreError
from tests.unit.daemon.agents import agent_on_fake_host


def raising(error: Exception):
    def step(*args, **kwargs):
        raise error
    return step


def said(caplog) -> list[tuple[str, str, bool]]:
    """What start_up logged: level, line, and whether a traceback came with it."""
    return [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records
            if r.name == start_up.__name__]


@pytest.fixture
def agent(tmp_path):
    agent = agent_on_fake_host(tmp_path)
    yield agent
    agent.manager.tracker.store.close()


def test_heal_at_start_heals_the_agent(agent, monkeypatch, caplog):
    healed = []
    monkeypatch.setattr(start_up, "run_heal", healed.append)
    start_up.heal_safely(agent)
    assert healed == [agent] and said(caplog) == []


@pytest.mark.parametrize("error,line", [
    (AgentError("the plan moves an instance's allocation twice"),
     ("WARNING", "Heal at start-up not done: the plan moves an instance's allocation twice",
      False)),
    (KeyError("a bug"), ("ERROR", "Heal at start-up failed", True)),
])
def test_a_heal_that_fails_leaves_the_start_going(agent, monkeypatch, caplog, error, line):
    monkeypatch.setattr(start_up, "run_heal", raising(error))
    start_up.heal_safely(agent)
    assert said(caplog) == [line]


def test_the_store_is_aligned_with_the_pools_the_agent_has(agent, monkeypatch):
    built = agent.build_model(agent.driver.get_host_inventory())
    agent.manager.tracker.set_pools(built.pools_by_uuid({}))
    seen = []
    monkeypatch.setattr(start_up, "align_store",
                        lambda healed, index: seen.append((healed, index.pools)))
    start_up.align_store_safely(agent)
    assert seen == [(agent, built.pools_by_uuid({}))] and seen[0][1]


@pytest.mark.parametrize("error,line", [
    (PlacementUnavailable("http://placement", "did not answer (connection refused)"),
     ("WARNING", "Store not aligned with Placement at start-up: Placement at "
      "http://placement did not answer (connection refused)", False)),
    (PlacementError("409 Conflict"),
     ("WARNING", "Store not aligned with Placement at start-up: 409 Conflict", False)),
    (StoreError("disk I/O error"),
     ("ERROR", "Aligning the store with Placement failed", True)),
])
def test_an_alignment_that_fails_leaves_the_start_going(agent, monkeypatch, caplog, error,
                                                        line):
    monkeypatch.setattr(start_up, "align_store", raising(error))
    start_up.align_store_safely(agent)
    assert said(caplog) == [line]


class VfRestoreSeen:
    """A VF restore that records the boot it restores after, or fails."""

    def __init__(self, error: Exception | None = None) -> None:
        self.boots: list[str] = []
        self.error = error

    def restore(self, boot_id: str) -> None:
        self.boots.append(boot_id)
        if self.error is not None:
            raise self.error


def test_the_vfs_are_restored_after_this_boot(agent, caplog):
    vf_restore = VfRestoreSeen()
    start_up.restore_after_reboot(vf_restore, agent.driver)
    assert vf_restore.boots == [agent.driver.boot_id()] and said(caplog) == []


@pytest.mark.parametrize("error,line", [
    (DriverUnavailable("libvirt gone"),
     ("WARNING", "VF counts not restored at start-up: libvirt gone", False)),
    (StoreError("database is locked"),
     ("WARNING", "VF counts not restored at start-up: database is locked", False)),
    (PermissionError(13, "Permission denied"),
     ("WARNING", "VF counts not restored at start-up: [Errno 13] Permission denied", False)),
    (ValueError("a bug"), ("ERROR", "Restoring VF counts at start-up failed", True)),
])
def test_a_vf_restore_that_fails_leaves_the_start_going(agent, caplog, error, line):
    start_up.restore_after_reboot(VfRestoreSeen(error), agent.driver)
    assert said(caplog) == [line]


def test_the_vgpu_types_not_restored_are_what_the_restore_says(agent, monkeypatch):
    asked = []

    def restore(manager, boot_id):
        asked.append((manager, boot_id))
        return {"0000:81:00.5": "its type's file refused the write"}

    monkeypatch.setattr(start_up, "restore_vgpu_types_after_reboot", restore)
    assert start_up.restore_vgpu_types(agent.manager, agent.driver) == {
        "0000:81:00.5": "its type's file refused the write"}
    assert asked == [(agent.manager, agent.driver.boot_id())]


def test_a_vgpu_type_restore_that_fails_knows_of_none(agent, monkeypatch, caplog):
    monkeypatch.setattr(start_up, "restore_vgpu_types_after_reboot",
                        raising(OSError("sysfs gone")))
    assert start_up.restore_vgpu_types(agent.manager, agent.driver) == {}
    assert said(caplog) == [("ERROR", "Restoring the vGPU VFs' types failed", True)]
