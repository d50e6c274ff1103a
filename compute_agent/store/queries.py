"""The statements that write the store's tables, as data for
``Store.write``, and the readers that build their rows back, for
``Store.read``."""
from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable

from compute_agent.claims.model import (
    Assignment,
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
from compute_agent.store.errors import StoreError
from compute_agent.store.writer import Statement
from compute_agent.tree.provider_tree import Provider

# Made once: json.dumps with any option builds a new encoder every call.
_to_json = json.JSONEncoder(sort_keys=True).encode


def put_instance_sql(uuid: str, spec: dict, request: RequestDigest | None = None
                     ) -> Statement:
    """Record an instance, or its new spec; ``request``: the build that
    makes it (an instance that stays keeps its build's)."""
    return ("INSERT INTO instances (uuid, spec, created_at, request) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (uuid) DO UPDATE SET spec = excluded.spec, "
            "request = coalesce(excluded.request, request)",
            [(uuid, _to_json(spec), time.time(),
              None if request is None else request.to_json())])


def delete_instance_sql(uuid: str, moves_too: bool) -> list[Statement]:
    """Forget an instance and its released assignments. Its moves stay when
    it only left this host, so that a retried confirm still finds them."""
    out = [("DELETE FROM instances WHERE uuid = ?", [(uuid,)]),
           ("DELETE FROM assignments WHERE instance_uuid = ? AND state = 'released'",
            [(uuid,)])]
    if moves_too:
        out.append(("DELETE FROM migrations WHERE instance_uuid = ?", [(uuid,)]))
    return out


def insert_assignments_sql(rows: list[Assignment]) -> Statement:
    now = time.time()
    return ("INSERT INTO assignments VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(a.id, a.consumer_uuid, a.instance_uuid, a.owner.value, a.migration_uuid,
              a.resource_class, a.provider_uuid, a.kind.value, a.device_id, a.amount,
              a.detail.to_json(), a.state.value, a.boot_id, now)
             for a in rows])


def update_assignments_sql(rows: list[Assignment]) -> Statement:
    """Write back owner, consumer, migration, state and boot of rows."""
    now = time.time()
    return ("UPDATE assignments SET consumer_uuid=?, owner=?, migration_uuid=?, "
            "state=?, boot_id=?, updated_at=? WHERE id=?",
            [(a.consumer_uuid, a.owner.value, a.migration_uuid, a.state.value, a.boot_id,
              now, a.id)
             for a in rows])


def realign_assignments_sql(rows: list[Assignment]) -> Statement:
    """Write back where rows sit: provider, class, kind, device and detail
    (heal moved their allocations; compute_agent/heal/realign.py)."""
    now = time.time()
    return ("UPDATE assignments SET provider_uuid=?, resource_class=?, kind=?, "
            "device_id=?, detail=?, updated_at=? WHERE id=?",
            [(a.provider_uuid, a.resource_class, a.kind.value, a.device_id,
              a.detail.to_json(), now, a.id)
             for a in rows])


def delete_migration_sql(uuid: str) -> Statement:
    return ("DELETE FROM migrations WHERE uuid = ?", [(uuid,)])


def put_migration_sql(m: Migration) -> Statement:
    return ("INSERT OR REPLACE INTO migrations (uuid, instance_uuid, kind, role, state, "
            "old_spec, updated_at, request) VALUES (?,?,?,?,?,?,?,?)",
            [(m.uuid, m.instance_uuid, m.kind.value, m.role.value, m.state.value,
              None if m.old_spec is None else _to_json(m.old_spec),
              time.time(), None if m.request is None else m.request.to_json())])


def put_device_uses_sql(uses: list[DeviceUse]) -> Statement:
    now = time.time()
    return ("INSERT OR REPLACE INTO device_uses VALUES (?,?,?,?)",
            [(u.address, u.state.value, u.reason, now) for u in uses])


def delete_device_uses_sql(addresses: list[str]) -> Statement:
    return ("DELETE FROM device_uses WHERE address = ?", [(a,) for a in addresses])


def device_uses(conn: sqlite3.Connection) -> dict[str, DeviceUse]:
    """address -> the one-time-use device's use, for those not clean."""
    return {r["address"]: DeviceUse(r["address"], UseState(r["state"]), r["reason"])
            for r in conn.execute("SELECT * FROM device_uses")}


def _row_to_assignment(row: sqlite3.Row) -> Assignment:
    try:
        detail = DeviceDetail.from_json(row["detail"])
    except ValueError as e:
        raise StoreError(f"assignment {row['id']}: {e}") from None
    return Assignment(row["id"], row["consumer_uuid"], row["instance_uuid"],
                      Owner(row["owner"]), row["migration_uuid"], row["resource_class"],
                      row["provider_uuid"], DeviceKind(row["kind"]), row["device_id"],
                      row["amount"], AssignmentState(row["state"]), row["boot_id"],
                      detail)


def live_assignments(conn: sqlite3.Connection) -> list[Assignment]:
    return [_row_to_assignment(r) for r in conn.execute(
        "SELECT * FROM assignments WHERE state != 'released' ORDER BY id")]


def all_instances(conn: sqlite3.Connection) -> dict[str, dict]:
    return {r["uuid"]: json.loads(r["spec"])
            for r in conn.execute("SELECT uuid, spec FROM instances")}


def _request(row: sqlite3.Row, record: str) -> RequestDigest | None:
    """The request a record keeps; None in a store older than schema 6
    (read as it is by upgrade checks) and for a record made before it."""
    if "request" not in row.keys():  # noqa: SIM118 - a Row has no __contains__ by name
        return None
    try:
        return RequestDigest.from_json(row["request"])
    except (ValueError, TypeError, AttributeError) as e:
        raise StoreError(f"{record}: its request is not a request digest: "
                         f"{type(e).__name__}") from None


def instance_requests(conn: sqlite3.Connection) -> dict[str, RequestDigest]:
    """instance uuid -> the build that made it, for those that have one."""
    out = {}
    for r in conn.execute("SELECT uuid, request FROM instances "
                          "WHERE request IS NOT NULL"):
        if (digest := _request(r, f"instance {r['uuid']}")) is not None:
            out[r["uuid"]] = digest
    return out


def all_migrations(conn: sqlite3.Connection) -> dict[str, Migration]:
    return {r["uuid"]: Migration(r["uuid"], r["instance_uuid"], MoveKind(r["kind"]),
                                 MigrationRole(r["role"]), MigrationState(r["state"]),
                                 json.loads(r["old_spec"]) if r["old_spec"] else None,
                                 _request(r, f"migration {r['uuid']}"))
            for r in conn.execute("SELECT * FROM migrations")}


def migrations_changed_at(conn: sqlite3.Connection) -> dict[str, float]:
    """migration uuid -> when its record last changed (epoch s)."""
    return dict(conn.execute("SELECT uuid, updated_at FROM migrations").fetchall())


def live_changed_at(conn: sqlite3.Connection) -> dict[str, float]:
    """instance uuid -> when its live assignments last changed (epoch s)."""
    return dict(conn.execute(
        "SELECT instance_uuid, max(updated_at) FROM assignments "
        "WHERE state != 'released' GROUP BY instance_uuid").fetchall())


def placement_view(conn: sqlite3.Connection) -> list[Provider]:
    """The providers as Placement showed them after the last sync."""
    return [Provider(r["uuid"], r["name"], r["parent_uuid"], json.loads(r["inventories"]),
                     frozenset(json.loads(r["traits"])),
                     None if r["aggregates"] is None
                     else frozenset(json.loads(r["aggregates"])),
                     r["generation"])
            for r in conn.execute("SELECT * FROM placement_view ORDER BY uuid")]


def put_placement_view_sql(providers: list[Provider]) -> list[Statement]:
    return [("DELETE FROM placement_view", [()]),
            ("INSERT INTO placement_view VALUES (?,?,?,?,?,?,?)",
             [(p.uuid, p.parent_uuid, p.name, p.generation,
               _to_json(p.inventories), json.dumps(sorted(p.traits)),
               None if p.aggregates is None else json.dumps(sorted(p.aggregates)))
              for p in providers])]


# provider uuid -> (its generation in the tree read before its allocations
# were, consumer -> class -> amount): AllocationView's reads, saved.
SavedAllocations = dict[str, tuple[int | None, dict[str, dict[str, int]]]]


def allocation_view(conn: sqlite3.Connection) -> SavedAllocations:
    """Each provider's allocations as the agent last read them."""
    return {r["provider_uuid"]: (r["generation"], json.loads(r["allocations"]))
            for r in conn.execute("SELECT * FROM allocation_view")}


def put_allocation_view_sql(reads: SavedAllocations) -> list[Statement]:
    return [("DELETE FROM allocation_view", [()]),
            ("INSERT INTO allocation_view VALUES (?,?,?)",
             [(uuid, generation, _to_json(allocations))
              for uuid, (generation, allocations) in sorted(reads.items())])]


def meta_value(key: str) -> Callable[[sqlite3.Connection], str | None]:
    """A reader of one meta row's value (None when absent)."""
    def read(conn: sqlite3.Connection) -> str | None:
        row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]
    return read


def put_meta_sql(key: str, value: str) -> list[Statement]:
    return [("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(key, value)])]
