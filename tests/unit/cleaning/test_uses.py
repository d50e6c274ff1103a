"""One-time-use devices in the tracker and the store: a claim records its
one-time-use devices used in its own commit, used they are never chosen,
and the record survives a restart (schema 7, migrated from 6). (The
cleaner that gives them back is test_run.py's.)"""
import sqlite3

import pytest

from compute_agent.claims.choice import Pool, Slot
from compute_agent.claims.model import DeviceUse, UseState
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.base import DeviceKind
from compute_agent.exception import ClaimFailed, InvalidRequest
from compute_agent.store.queries import device_uses
from compute_agent.store.schema import SCHEMA_VERSION, migrate, schema_version
from compute_agent.store.store import Store
from tests.unit.cleaning.devices import GPU, THE_GPU, VF0, VF1, WHOLE, build, pools


def test_a_claim_records_its_one_time_use_device_used_in_its_commit(tracker):
    instance = build(tracker, THE_GPU)
    assert tracker.store.read(device_uses) == {WHOLE: DeviceUse(WHOLE)}
    assert tracker.device_uses() == [(DeviceUse(WHOLE), True)]
    assert tracker.awaiting_cleaning() == []
    tracker.release_instance(instance)
    assert tracker.device_uses() == [(DeviceUse(WHOLE), False)]
    assert tracker.awaiting_cleaning() == [WHOLE]


def test_a_used_device_is_never_chosen_until_given_back(tracker):
    first = build(tracker)
    second = build(tracker)
    tracker.release_instance(first)
    tracker.release_instance(second)
    with pytest.raises(ClaimFailed):
        build(tracker)
    tracker.give_back_device(VF1)
    third = build(tracker)
    assert [a.device_id for a in tracker.instance(third)[1]] == [VF1]
    assert tracker.store.read(device_uses) == {VF0: DeviceUse(VF0), VF1: DeviceUse(VF1)}


def test_a_device_whose_spec_dropped_one_time_use_is_chosen_again(tracker):
    tracker.release_instance(build(tracker, THE_GPU))
    pools_now = pools()
    pools_now[GPU]["CUSTOM_GPU"] = Pool("cmp_0000:AF:00.0", "CUSTOM_GPU", DeviceKind.PCI, 1,
                                        (Slot(WHOLE),))
    tracker.set_pools(pools_now)
    # Used and not cleaned, yet chosen: no longer one-time use; and again.
    for _ in range(2):
        instance = build(tracker, THE_GPU)
        assert [a.device_id for a in tracker.instance(instance)[1]] == [WHOLE]
        tracker.release_instance(instance)


def test_a_claim_or_release_of_a_used_device_is_told_once_on_disk(tracker):
    told = []
    tracker.on_uses_changed = lambda: told.append(
        (tracker.store.read(device_uses), tracker.awaiting_cleaning()))
    instance = build(tracker)
    assert told == [({VF0: DeviceUse(VF0)}, [])]
    tracker.release_instance(instance)
    assert told[1:] == [({VF0: DeviceUse(VF0)}, [VF0])]
    tracker.complete(build(tracker))  # no device newly used: not told
    assert len(told) == 3


def test_a_failed_cleaning_and_a_release_are_durable(tmp_path):
    store = Store(tmp_path / "state.db")
    t = Tracker(store, "boot-1")
    t.set_pools(pools())
    t.release_instance(build(t))
    t.release_instance(build(t))
    t.cleaning_failed(VF0, "exit status 3")
    t.give_back_device(VF1)
    store.close()
    again = Tracker(Store(tmp_path / "state.db"), "boot-2")
    assert again.device_uses() == [
        (DeviceUse(VF0, UseState.CLEANING_FAILED, "exit status 3"), False)]
    assert again.awaiting_cleaning() == []
    assert again.clean_again(VF0) == DeviceUse(VF0)
    assert again.awaiting_cleaning() == [VF0]
    again.store.close()


def test_what_an_operator_asks_of_a_device_is_refused_in_one_line(tracker):
    instance = build(tracker)
    with pytest.raises(InvalidRequest, match="is held by an instance"):
        tracker.give_back_device(VF0)
    with pytest.raises(InvalidRequest, match="is not a used one-time-use device"):
        tracker.give_back_device(VF1)
    tracker.release_instance(instance)
    tracker.give_back_device(VF0)
    assert tracker.device_uses() == []


def test_schema_7_adds_the_device_uses_to_a_schema_6_store(tmp_path):
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, target=6) == 6
    assert not conn.execute(
        "SELECT 1 FROM sqlite_master WHERE name='device_uses'").fetchone()
    conn.close()
    store = Store(path)
    try:
        assert store.read(schema_version) == SCHEMA_VERSION  # and on to the latest
        assert store.read(device_uses) == {}
        t = Tracker(store, "boot-1")
        t.set_pools(pools())
        build(t)
        assert store.read(device_uses) == {VF0: DeviceUse(VF0)}
    finally:
        store.close()


def test_a_device_held_before_it_was_one_time_use_is_recorded_used(tracker):
    """Its spec said one_time_use after a claim chose it (or its guest was
    adopted): recorded used once, so its release is followed by its
    cleaning."""
    tracker.set_pools(pools(one_time_use=False))
    instance = build(tracker)
    assert tracker.mark_held_used() == []
    tracker.set_pools(pools())
    assert tracker.mark_held_used() == [VF0]
    assert tracker.mark_held_used() == []
    assert tracker.store.read(device_uses) == {VF0: DeviceUse(VF0)}
    tracker.release_instance(instance)
    assert tracker.awaiting_cleaning() == [VF0]
