"""The store's check at every start, and what guarding a commit costs.

The start check (``inspect_store``, then the rules of compute_agent/store/check.py):
SQLite's ``integrity_check`` over the whole file, every index against its
table, and the commit sequence against the host's record. Measured on
stores of 1,000 and 10,000 instances, each holding four assignments (two
NUMA rows, a VF, a vGPU), as the claims case writes them; median of
several runs, the file in the page cache as at a restart. Target: under
2 s at 10,000.

The guard of each group commit (compute_agent/store/holding.py ``Holding``): the
store's file looked at, and the sequence written and synced in its record
(compute_agent/store/sequence.py): one ``fdatasync`` more per group commit. Measured
as the median time of one write that commits alone, and the commits per
second of 32 writers sharing group commits, with the guard (the daemon's
store) and without (a store nobody holds).
"""
from __future__ import annotations

import statistics
import threading
import time
import uuid
from pathlib import Path

from compute_agent.claims.model import Assignment, AssignmentState, Owner
from compute_agent.drivers.base import DeviceDetail, DeviceKind
from compute_agent.store.check import HostFacts, StoreVerdict, judge
from compute_agent.store.inspection import inspect_store
from compute_agent.store.queries import insert_assignments_sql, put_instance_sql
from compute_agent.store.store import Store

SIZES = (1_000, 10_000)
CHECK_RUNS = 5
COMMITS = 200  # one write each, one after the other
WRITERS = 32
WRITES_PER_WRITER = 32
COMMIT_RUNS = 5
ROOT = str(uuid.uuid4())
SPEC = {"name": "bench", "vcpus": 2, "memory_mb": 1024}


def instance_rows(n: int) -> tuple[str, list[Assignment]]:
    """The n-th instance and its four live assignments."""
    instance = str(uuid.uuid4())
    cell = f"cell-{n % 2}"

    def row(rc: str, provider: str, kind: DeviceKind, device: str, amount: int):
        return Assignment(str(uuid.uuid4()), instance, instance, Owner.INSTANCE, None, rc,
                          provider, kind, device, amount, AssignmentState.CLAIMED,
                          "bench-boot", DeviceDetail(numa_node=n % 2))

    return instance, [
        row("VCPU", cell, DeviceKind.NUMA, cell, 2),
        row("MEMORY_MB", cell, DeviceKind.NUMA, cell, 1024),
        row("SRIOV_NET_VF", f"pf-{n // 64}", DeviceKind.VF,
            f"0000:{0x20 + n // 4096:02x}:{n // 64 % 64:02x}.{n % 64}", 1),
        row("VGPU", f"gpu-{n // 512}", DeviceKind.MDEV, str(uuid.uuid4()), 1),
    ]


def fill(path: Path, instances: int) -> None:
    """A store as the daemon leaves it: held, ``instances`` claimed."""
    store = Store(path, ROOT)
    for start in range(0, instances, 1000):
        made = [instance_rows(n) for n in range(start, min(start + 1000, instances))]
        store.write([put_instance_sql(u, dict(SPEC, name=f"vm-{u[:8]}")) for u, _ in made]
                    + [insert_assignments_sql([a for _, rows in made for a in rows])])
    store.close()


def measure_check(workdir: Path, instances: int) -> dict:
    path = workdir / f"check-{instances}" / "state.db"
    fill(path, instances)
    host = HostFacts(ROOT, True, None, None)
    seconds = []
    for _ in range(CHECK_RUNS):
        began = time.perf_counter()
        verdict = judge(inspect_store(path), host).verdict
        seconds.append(time.perf_counter() - began)
        assert verdict is StoreVerdict.OPEN, verdict
    return {"case": "store_check", "measure": "start_check", "instances": instances,
            "assignments": 4 * instances, "store_bytes": path.stat().st_size,
            "runs": CHECK_RUNS, "seconds_median": round(statistics.median(seconds), 4),
            "seconds_max": round(max(seconds), 4), "target_seconds": 2}


def one_at_a_time(store: Store) -> float:
    """Median seconds of a write that commits alone."""
    took = []
    for n in range(COMMITS):
        began = time.perf_counter()
        store.write([put_instance_sql(f"alone-{n}", SPEC)])
        took.append(time.perf_counter() - began)
    return statistics.median(took)


def shared(store: Store) -> float:
    """Writes per second of WRITERS threads, their writes group-committed."""
    def writer(t: int) -> None:
        for n in range(WRITES_PER_WRITER):
            store.write([put_instance_sql(f"shared-{t}-{n}", SPEC)])

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return WRITERS * WRITES_PER_WRITER / (time.perf_counter() - began)


def measure_commits(workdir: Path) -> list[dict]:
    """Runs with and without the guard taken in turn, so that both see
    the shared machine's load alike."""
    alone: dict[bool, list[float]] = {False: [], True: []}
    together: dict[bool, list[float]] = {False: [], True: []}
    for run in range(COMMIT_RUNS):
        for guarded in (False, True):
            store = Store(workdir / f"commits-{guarded}-{run}" / "state.db",
                          ROOT if guarded else None)
            try:
                alone[guarded].append(one_at_a_time(store))
                together[guarded].append(shared(store))
            finally:
                store.close()
    return [{"case": "store_check", "measure": "group_commit", "guarded": guarded,
             "runs": COMMIT_RUNS,
             "commit_alone_ms_median": round(statistics.median(alone[guarded]) * 1000, 3),
             "writers": WRITERS,
             "writes_per_second_shared": round(statistics.median(together[guarded]), 1)}
            for guarded in (False, True)]


def run(workdir: Path) -> list[dict]:
    return [measure_check(workdir, n) for n in SIZES] + measure_commits(workdir)
