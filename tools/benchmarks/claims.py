"""Claims against the durable store on disk.

For 1 and for 32 concurrent claimers, over five runs of 2,048 claims each
(medians of the runs): the latency of ``claim_build``
(the choice, made in the store's writer thread, and the group-committed,
fsynced write; median and p99) and the throughput in claims per second. Each claim takes
two vCPUs and 1 GiB from a NUMA cell, one VF and one vGPU, so it writes an
instance and four assignments. The host has 4 PFs x 64 VFs and two GPUs
with 512 vGPUs each; claims run in rounds of 256 (one per VF) and every
round's instances are deleted, untimed, before the next, so capacity never
runs out.

Then the start-up time until ready with 1,000 claimed instances in the
store: opening the Store (schema check) and constructing the Tracker (which
loads every live assignment, instance and move), median of several; and,
apart, with the pools of the host built and set as the agent does before
it takes its first claim.

Targets: p99 under 10 ms at 32 claimers; start-up under 2 s.
"""
from __future__ import annotations

import gc
import os
import sqlite3
import statistics
import threading
import time
import uuid
from pathlib import Path

from compute_agent.claims.model import AssignmentState
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.fake import FakeDriver
from compute_agent.store.queries import live_assignments
from compute_agent.store.store import STORE_FILE, Store
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import MdevTypePolicy, TreePolicy, build_tree
from tools.benchmarks.common import device_host, percentile

RUNS = 5
ROUNDS = 8
ROUND_CLAIMS = 256  # one per VF of the claims host
CLAIMERS = (1, 32)
STARTUP_INSTANCES = 1000
STARTUP_RUNS = 7
BOOT_ID = "bench-boot"
SPEC = {"name": "bench", "vcpus": 2, "memory_mb": 1024}




class Host:
    """A fake host's pools keyed as the tracker wants them, and the
    allocations Placement would give the n-th instance."""

    def __init__(self, pfs: int, vfs_per_pf: int, gpus: int, vgpus_per_gpu: int):
        driver = FakeDriver(device_host(pfs, vfs_per_pf, gpus, vgpus_per_gpu))
        self.driver = driver
        self.policy = TreePolicy(
            host="bench", root_uuid=str(uuid.uuid4()),
            device_specs=parse_specs(['{"vendor_id": "8086", "product_id": "154c", '
                                      '"resource_class": "SRIOV_NET_VF"}']),
            mdev_types=(MdevTypePolicy("nvidia-35"),))
        self.pools = self.build_pools()
        self.cells = sorted((p for p, rcs in self.pools.items() if "VCPU" in rcs),
                            key=lambda p: self.pools[p]["VCPU"].numa_node)
        self.pfs = sorted(p for p, rcs in self.pools.items() if "SRIOV_NET_VF" in rcs)
        self.gpus = sorted(p for p, rcs in self.pools.items() if "VGPU" in rcs)
        assert len(self.pfs) == pfs and len(self.gpus) == gpus and len(self.cells) == 2

    def build_pools(self):
        built = build_tree(self.driver.get_host_inventory(), self.policy)
        return built.pools_by_uuid({})

    def allocations(self, n: int) -> dict:
        pf = self.pfs[n % len(self.pfs)]
        numa = self.pools[pf]["SRIOV_NET_VF"].numa_node
        gpu = next(g for g in self.gpus[n % len(self.gpus):] + self.gpus
                   if self.pools[g]["VGPU"].numa_node == numa)
        return {self.cells[numa]: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}},
                pf: {"resources": {"SRIOV_NET_VF": 1}},
                gpu: {"resources": {"VGPU": 1}}}




def check_no_double_holder(store: Store) -> int:
    live = store.read(live_assignments)
    exclusive = [(a.provider_uuid, a.resource_class, a.device_id) for a in live
                 if a.kind.value != "numa"]
    if len(exclusive) != len(set(exclusive)):
        raise AssertionError("a device is held by two live assignments")
    return len(live)


def measure_claims(workdir: Path, host: Host, claimers: int) -> dict:
    """RUNS runs, each on a new store: the median of each figure, and the
    p99 of every run (this machine is shared; one run can be unlucky)."""
    runs = [claim_run(workdir / f"claims-{claimers}-{n}", host, claimers)
            for n in range(RUNS)]

    def median_of(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 3)

    return {
        "case": "claims",
        "measure": "claim_build",
        "claimers": claimers,
        "runs": RUNS,
        "claims_per_run": runs[0]["claims"],
        "rows_per_claim": 4,
        "latency_ms_median": median_of("latency_ms_median"),
        "latency_ms_p99": median_of("latency_ms_p99"),
        "latency_ms_p99_each_run": [r["latency_ms_p99"] for r in runs],
        "latency_ms_max": max(r["latency_ms_max"] for r in runs),
        "claims_per_second": round(median_of("claims_per_second"), 1),
        "claims_per_commit_mean": median_of("claims_per_commit_mean"),
    }


def claim_run(workdir: Path, host: Host, claimers: int) -> dict:
    store = Store(workdir / STORE_FILE)
    tracker = Tracker(store, BOOT_ID)
    tracker.set_pools(host.pools)
    commits = store._commits  # counts its transactions and their jobs
    claim_batches = claim_jobs = 0
    per_thread = ROUND_CLAIMS // claimers
    latencies: list[list[float]] = [[] for _ in range(claimers)]
    round_instances: list[list[str]] = [[] for _ in range(claimers)]
    errors: list[BaseException] = []
    start_barrier = threading.Barrier(claimers + 1)
    end_barrier = threading.Barrier(claimers + 1)

    def claimer(t: int) -> None:
        try:
            for _ in range(ROUNDS):
                # What an RPC request brings, made before the round starts.
                requests = [(str(uuid.uuid4()), host.allocations(t * per_thread + j))
                            for j in range(per_thread)]
                start_barrier.wait()
                for instance, allocations in requests:
                    began = time.perf_counter()
                    tracker.claim_build(instance, SPEC, allocations)
                    latencies[t].append(time.perf_counter() - began)
                    round_instances[t].append(instance)
                end_barrier.wait()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            start_barrier.abort()
            end_barrier.abort()

    threads = [threading.Thread(target=claimer, args=(t,), name=f"claimer-{t}")
               for t in range(claimers)]
    for th in threads:
        th.start()
    busy = 0.0
    try:
        for _ in range(ROUNDS):
            before = (commits.batches, commits.jobs)
            start_barrier.wait()
            began = time.perf_counter()
            end_barrier.wait()
            busy += time.perf_counter() - began
            claim_batches += commits.batches - before[0]
            claim_jobs += commits.jobs - before[1]
            live_rows = check_no_double_holder(store)
            assert live_rows == 4 * per_thread * claimers, live_rows
            # Untimed: give the round's devices back for the next one.
            done = [u for lst in round_instances for u in lst]
            for lst in round_instances:
                lst.clear()
            release(tracker, done)
    except threading.BrokenBarrierError:
        pass
    finally:
        for th in threads:
            th.join()
        store.close()
    if errors:
        raise errors[0]
    flat = [x for lst in latencies for x in lst]
    return {
        "claims": len(flat),
        "latency_ms_median": round(statistics.median(flat) * 1000, 3),
        "latency_ms_p99": round(percentile(flat, 99) * 1000, 3),
        "latency_ms_max": round(max(flat) * 1000, 3),
        "claims_per_second": len(flat) / busy,
        "claims_per_commit_mean": round(claim_jobs / max(claim_batches, 1), 2),
    }


def release(tracker: Tracker, instances: list[str], threads: int = 16) -> None:
    chunks = [instances[i::threads] for i in range(threads)]
    workers = [threading.Thread(target=lambda c=c: [tracker.release_instance(u)
                                                    for u in c]) for c in chunks]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def fill_store(path: Path, host: Host, instances: int) -> None:
    """``instances`` claimed instances, made by the tracker itself."""
    store = Store(path)
    tracker = Tracker(store, BOOT_ID)
    tracker.set_pools(host.pools)
    threads = 32
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for n in range(t, instances, threads):
                u = str(uuid.uuid4())
                tracker.claim_build(u, dict(SPEC, name=f"vm-{n}"), host.allocations(n))
                tracker.complete(u)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    store.close()
    if errors:
        raise errors[0]


def measure_startup(workdir: Path) -> list[dict]:
    # 16 PFs x 64 VFs and 4 GPUs x 512 vGPUs: room for 1,000 instances.
    host = Host(16, 64, 4, 512)
    path = workdir / "startup" / STORE_FILE
    fill_store(path, host, STARTUP_INSTANCES)
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT count(*) FROM assignments").fetchone()[0]
    conn.close()
    size = path.stat().st_size
    plain, with_pools = [], []
    for _ in range(STARTUP_RUNS):
        began = time.perf_counter()
        store = Store(path)
        tracker = Tracker(store, BOOT_ID)
        plain.append(time.perf_counter() - began)
        instances, live, _ = tracker.snapshot()
        assert len(instances) == STARTUP_INSTANCES, len(instances)
        assert len(live) == rows and all(a.state is AssignmentState.CLAIMED for a in live)
        store.close()

        began = time.perf_counter()
        store = Store(path)
        tracker = Tracker(store, BOOT_ID)
        tracker.set_pools(host.build_pools())
        with_pools.append(time.perf_counter() - began)
        store.close()
    common = {"case": "claims", "instances": STARTUP_INSTANCES, "assignments": rows,
              "store_bytes": size, "runs": STARTUP_RUNS}
    return [
        dict(common, measure="startup_store_and_tracker",
             seconds_median=round(statistics.median(plain), 4),
             seconds_max=round(max(plain), 4)),
        dict(common, measure="startup_with_pools",
             seconds_median=round(statistics.median(with_pools), 4),
             seconds_max=round(max(with_pools), 4)),
    ]


def run(workdir: Path) -> list[dict]:
    host = Host(4, 64, 2, 512)
    gc.freeze()  # as the daemon does once started (compute_agent/cmd/daemon.py)
    results = [measure_claims(workdir, host, n) for n in CLAIMERS]
    one, many = results[0], results[-1]
    for r in results:
        r["p99_target_ms"] = 10
    results.append({
        "case": "claims", "measure": "throughput_ratio",
        "claimers": f"{many['claimers']}/{one['claimers']}",
        "ratio": round(many["claims_per_second"] / one["claims_per_second"], 2),
        "cpus": os.cpu_count(), "sqlite": sqlite3.sqlite_version,
    })
    for r in measure_startup(workdir):
        r["target_seconds"] = 2
        results.append(r)
    return results
