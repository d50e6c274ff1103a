"""The store's migration at the agent's start, from the oldest schema (2,
d1b250d's) to this version's, at 10,000 instances: what an upgrade adds to
the first start after it.

The schema-2 store is made with this version's own migration steps up to
2, and filled as a busy host's would be: each instance holds its CPUs and
memory on a NUMA cell, its disk on the host (kind 'numa', device 'host',
which schema 4 rewrites), a VF, and one released assignment of an earlier
move; one instance in twenty has a resize left finished and unconfirmed.
The figure is the opening of the store by the agent (Store with the root
UUID: the migration's steps, each a transaction with its fsync, and the
mark that it is open), the median of RUNS fresh copies.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
import statistics
import time
import uuid
from pathlib import Path

from compute_agent.store.schema import SCHEMA_VERSION, migrate, schema_version
from compute_agent.store.store import Store

INSTANCES = 10_000
OLDEST_SCHEMA = 2
RUNS = 3
RESIZED_EVERY = 20


def assignment(instance: str, consumer: str, owner: str, migration: str | None,
               rc: str, provider: str, kind: str, device: str, amount: int,
               state: str) -> tuple:
    detail = json.dumps({"numa_node": 0} if kind in ("numa", "vf") else {})
    return (str(uuid.uuid4()), consumer, instance, owner, migration, rc, provider, kind,
            device, amount, detail, state, "boot", time.time())


def rows_of(n: int, cell: str, root: str, pf: str) -> tuple[list, list, list]:
    """The instances, migrations and assignments of the n-th instance."""
    instance = str(uuid.uuid4())
    spec = json.dumps({"name": f"guest-{n}", "vcpus": 2, "memory_mb": 2048})
    vf = f"0000:{0x81 + n // 4096:02x}:{(n // 8) % 512 // 16:02x}.{n % 8}-{n}"
    rows = [assignment(instance, instance, "instance", None, "VCPU", cell, "numa", "0", 2,
                       "claimed"),
            assignment(instance, instance, "instance", None, "MEMORY_MB", cell, "numa", "0",
                       2048, "claimed"),
            assignment(instance, instance, "instance", None, "DISK_GB", root, "numa", "host",
                       20, "claimed"),
            assignment(instance, instance, "instance", None, "SRIOV_NET_VF", pf, "vf", vf, 1,
                       "claimed"),
            assignment(instance, instance, "instance", None, "SRIOV_NET_VF", pf, "vf",
                       f"{vf}-old", 1, "released")]
    migrations = []
    if n % RESIZED_EVERY == 0:
        migration = str(uuid.uuid4())
        migrations.append((migration, instance, "resize", "both", "finished", spec,
                           time.time()))
        rows.append(assignment(instance, migration, "migration", migration, "SRIOV_NET_VF",
                               pf, "vf", f"{vf}-source", 1, "claimed"))
    return [(instance, spec, time.time())], migrations, rows


def oldest_store(path: Path) -> int:
    """A schema-2 store of INSTANCES instances; returns its row count."""
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, OLDEST_SCHEMA)
    root = str(uuid.uuid4())
    cell, pf = str(uuid.uuid4()), str(uuid.uuid4())
    count = 0
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO providers VALUES (?, ?)",
                     [("host", root), ("host_numa_0", cell), ("host_0000:81:00.0", pf)])
    for n in range(INSTANCES):
        instances, migrations, rows = rows_of(n, cell, root, pf)
        conn.executemany("INSERT INTO instances VALUES (?,?,?)", instances)
        conn.executemany("INSERT INTO migrations VALUES (?,?,?,?,?,?,?)", migrations)
        conn.executemany("INSERT INTO assignments VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         rows)
        count += len(instances) + len(migrations) + len(rows)
    conn.execute("COMMIT")
    conn.close()
    return count


def run(workdir: Path) -> dict:
    template = workdir / "schema2.db"
    rows = oldest_store(template)
    seconds = []
    for n in range(RUNS):
        path = workdir / f"run{n}" / "state.db"
        path.parent.mkdir()
        shutil.copy(template, path)
        started = time.perf_counter()
        store = Store(path, str(uuid.uuid4()))
        seconds.append(time.perf_counter() - started)
        version = store.read(schema_version)
        store.close()
        assert version == SCHEMA_VERSION, version
    return {"case": "store_migration", "instances": INSTANCES, "rows": rows,
            "from_schema": OLDEST_SCHEMA, "to_schema": SCHEMA_VERSION,
            "store_mb": round(template.stat().st_size / 1e6, 1),
            "open_and_migrate_s": round(statistics.median(seconds), 3),
            "runs_s": [round(s, 3) for s in seconds]}
