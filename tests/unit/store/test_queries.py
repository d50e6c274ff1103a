"""The statements that write the store's tables and the readers that build
their rows back, on a database at this version's schema. (Through the
Store, its group commit and its files: test_store.py.)"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import pytest

from compute_agent.claims.model import (
    AssignmentState,
    DeviceUse,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    RequestDigest,
    UseState,
)
from compute_agent.drivers.base import DeviceDetail, DeviceKind
from compute_agent.store import queries
from compute_agent.store.errors import StoreError
from compute_agent.store.schema import migrate
from compute_agent.store.writer import Statement, run_statements
from compute_agent.tree.provider_tree import Provider, inventory
from tests.unit.store.stores import PROVIDER, assignment

OTHER_PROVIDER = "7c1e2d3f-0a4b-4c5d-8e6f-9a0b1c2d3e4f"
BUILD = RequestDigest.of(spec={"name": "a", "vcpus": 1, "memory_mb": 512}, allocations={})
RESIZE = RequestDigest.of(spec={"name": "a", "vcpus": 2, "memory_mb": 512}, allocations={})


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.row_factory = sqlite3.Row
    migrate(conn)
    yield conn
    conn.close()


def write(conn: sqlite3.Connection, *statements: Statement | list[Statement]) -> None:
    flat: list[Statement] = []
    for s in statements:
        flat.extend(s if isinstance(s, list) else [s])
    run_statements(conn, flat)


# --- instances -------------------------------------------------------------------

def test_an_instance_keeps_the_build_that_made_it_when_its_spec_changes(conn):
    write(conn, queries.put_instance_sql("i", {"name": "a"}, BUILD))
    write(conn, queries.put_instance_sql("i", {"name": "b"}))
    assert queries.all_instances(conn) == {"i": {"name": "b"}}
    assert queries.instance_requests(conn) == {"i": BUILD}
    write(conn, queries.put_instance_sql("i", {"name": "b"}, RESIZE))
    assert queries.instance_requests(conn) == {"i": RESIZE}


def test_an_instance_made_before_requests_were_recorded_has_none(conn):
    write(conn, queries.put_instance_sql("old", {"name": "a"}))
    assert queries.instance_requests(conn) == {}


def test_a_request_that_is_not_a_digest_is_refused_naming_its_record(conn):
    conn.execute("INSERT INTO instances (uuid, spec, created_at, request) "
                 "VALUES ('i', '{}', 0, '[1, 2]')")
    with pytest.raises(StoreError, match="^instance i: its request is not a request digest"):
        queries.instance_requests(conn)


def test_an_instance_leaving_keeps_its_moves_and_one_deleted_takes_them(conn):
    a = assignment(instance="i", st=AssignmentState.RELEASED)
    live = assignment(instance="i", device="0000:81:10.1")
    move = Migration("m", "i", MoveKind.RESIZE, MigrationRole.SOURCE, MigrationState.CONFIRMED)
    write(conn, queries.put_instance_sql("i", {}), queries.insert_assignments_sql([a, live]),
          queries.put_migration_sql(move))
    write(conn, queries.delete_instance_sql("i", moves_too=False))
    assert queries.all_instances(conn) == {}
    # Released rows go with it; a live one is no instance's to delete here.
    assert [r.id for r in queries.live_assignments(conn)] == [live.id]
    assert conn.execute("SELECT count(*) FROM assignments").fetchone()[0] == 1
    assert list(queries.all_migrations(conn)) == ["m"]
    write(conn, queries.delete_instance_sql("i", moves_too=True))
    assert queries.all_migrations(conn) == {}


# --- assignments ---------------------------------------------------------------------

def test_live_assignments_read_back_as_written_in_id_order_released_left_out(conn):
    rows = [assignment(aid="b", device="0000:81:10.1"),
            assignment(aid="a", device="5f1e0000-0000-4000-8000-000000000001", rc="VGPU",
                       kind=DeviceKind.MDEV, st=AssignmentState.CLAIMING).with_(
                detail=DeviceDetail(numa_node=1, mdev_parent="0000:af:00.0",
                                    mdev_type="nvidia-35")),
            assignment(aid="c", device="0000:81:10.2", st=AssignmentState.RELEASED)]
    write(conn, queries.insert_assignments_sql(rows))
    read = queries.live_assignments(conn)
    assert read == [rows[1], rows[0]]
    assert [r.detail for r in read] == [rows[1].detail, rows[0].detail]


def test_an_update_writes_back_owner_consumer_move_state_and_boot_only(conn):
    row = assignment(aid="a")
    write(conn, queries.insert_assignments_sql([row]))
    changed = row.with_(consumer_uuid="m", owner=Owner.MIGRATION, migration_uuid="m",
                        state=AssignmentState.CLAIMING, boot_id="boot-2",
                        provider_uuid=OTHER_PROVIDER, device_id="0000:82:00.1")
    write(conn, queries.update_assignments_sql([changed]))
    assert queries.live_assignments(conn) == [changed.with_(
        provider_uuid=PROVIDER, device_id=row.device_id)]


def test_a_realign_writes_back_where_a_row_sits_only(conn):
    row = assignment(aid="a", st=AssignmentState.CLAIMING)
    write(conn, queries.insert_assignments_sql([row]))
    moved = row.with_(provider_uuid=OTHER_PROVIDER, resource_class="CUSTOM_NIC",
                      kind=DeviceKind.PCI, device_id="0000:82:00.0",
                      detail=DeviceDetail(numa_node=1), state=AssignmentState.CLAIMED)
    write(conn, queries.realign_assignments_sql([moved]))
    (read,) = queries.live_assignments(conn)
    assert read == moved.with_(state=row.state)
    assert read.detail == DeviceDetail(numa_node=1)


def test_when_each_instances_live_rows_last_changed(conn, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(queries.time, "time", lambda: now[0])
    i, j = assignment(aid="a", instance="i"), assignment(aid="b", instance="j", device="0")
    write(conn, queries.insert_assignments_sql([i, j]))
    now[0] = 200.0
    write(conn, queries.update_assignments_sql([i]))
    now[0] = 300.0
    write(conn, queries.update_assignments_sql([j.with_(state=AssignmentState.RELEASED)]))
    assert queries.live_changed_at(conn) == {"i": 200.0}


# --- moves ---------------------------------------------------------------------------

def test_a_move_reads_back_as_written_with_when_it_last_changed(conn, monkeypatch):
    monkeypatch.setattr(queries.time, "time", lambda: 1234.5)
    moves = [Migration("m1", "i", MoveKind.RESIZE, MigrationRole.BOTH, MigrationState.ACTIVE,
                       {"name": "a", "vcpus": 1, "memory_mb": 512}, RESIZE),
             Migration("m2", "j", MoveKind.LIVE_MIGRATION, MigrationRole.SOURCE,
                       MigrationState.ANNOUNCED)]
    write(conn, *[queries.put_migration_sql(m) for m in moves])
    assert queries.all_migrations(conn) == {m.uuid: m for m in moves}
    assert queries.migrations_changed_at(conn) == {"m1": 1234.5, "m2": 1234.5}
    write(conn, queries.delete_migration_sql("m1"))
    assert list(queries.all_migrations(conn)) == ["m2"]


def test_a_move_whose_request_is_not_a_digest_is_refused_naming_it(conn):
    conn.execute("INSERT INTO migrations (uuid, instance_uuid, kind, role, state, updated_at, "
                 "request) VALUES ('m', 'i', 'resize', 'both', 'active', 0, '\"x\"')")
    with pytest.raises(StoreError, match="^migration m: its request is not a request digest"):
        queries.all_migrations(conn)


# --- one-time-use devices, the placement view, meta ----------------------------------------

def test_device_uses_are_kept_until_deleted(conn):
    write(conn, queries.put_device_uses_sql([DeviceUse("0000:81:00.1"),
                                             DeviceUse("0000:81:00.2")]))
    write(conn, queries.put_device_uses_sql([
        DeviceUse("0000:81:00.2", UseState.CLEANING_FAILED, "exit status 1")]))
    assert queries.device_uses(conn) == {
        "0000:81:00.1": DeviceUse("0000:81:00.1"),
        "0000:81:00.2": DeviceUse("0000:81:00.2", UseState.CLEANING_FAILED, "exit status 1")}
    write(conn, queries.delete_device_uses_sql(["0000:81:00.1", "0000:81:00.2"]))
    assert queries.device_uses(conn) == {}


def test_the_placement_view_keeps_unmanaged_aggregates_apart_from_none(conn):
    traits = frozenset(f"CUSTOM_T{n}" for n in range(8))
    view = [Provider(PROVIDER, "host", None, {"VCPU": inventory(8)}, traits, None, 3),
            Provider(OTHER_PROVIDER, "host_numa_0", PROVIDER, {}, frozenset(), frozenset(), 0)]
    write(conn, queries.put_placement_view_sql(view))
    assert queries.placement_view(conn) == sorted(view, key=lambda p: p.uuid)
    stored = conn.execute("SELECT traits FROM placement_view WHERE uuid = ?",
                          (PROVIDER,)).fetchone()["traits"]
    assert json.loads(stored) == sorted(traits)  # the same set, the same text


def test_a_meta_value_is_replaced_and_an_absent_one_is_none(conn):
    read = queries.meta_value("sriov_record")
    assert read(conn) is None
    write(conn, queries.put_meta_sql("sriov_record", "1"))
    write(conn, queries.put_meta_sql("sriov_record", "2"))
    assert read(conn) == "2"


def test_the_allocation_view_is_kept_whole_unknown_generation_included(conn):
    reads = {PROVIDER: (4, {"c1": {"VGPU": 1}, "c2": {"VCPU": 2, "MEMORY_MB": 512}}),
             OTHER_PROVIDER: (None, {})}
    write(conn, queries.put_allocation_view_sql(reads))
    assert queries.allocation_view(conn) == reads
    write(conn, queries.put_allocation_view_sql({OTHER_PROVIDER: (1, {})}))
    assert queries.allocation_view(conn) == {OTHER_PROVIDER: (1, {})}
