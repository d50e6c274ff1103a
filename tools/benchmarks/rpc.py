"""The RPC API over the real RabbitMQ, against one compute-agent daemon
(fake driver, real Placement, durable store) in its own process.

- ``get_host_info`` from one caller: median and p99 latency.
- ``build_instance`` from one caller (1 vCPU, 256 MB and one VF each; the
  host has 4 PFs x 64 VFs): median and p99; deletes run untimed.
- 16 threads sharing one ``ComputeAgentAPI``: calls per second of
  ``get_host_info``, and of ``build_instance`` in rounds of 256 builds (one
  per VF) with the round's instances deleted, untimed, between rounds.

ENVIRONMENT.md's floor for 16 threads sharing one client with a trivial
endpoint on this kind of machine is about 340 calls/s; it is reported
beside ours as ``trivial_endpoint_floor_calls_per_second``, and so is the
same 16-caller figure measured in this run against a trivial server (its
own process, an endpoint that answers a constant) as
``trivial_endpoint_calls_per_second_here``: the machine is shared, so the
ratio to it is the figure to compare.
"""
from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from compute_agent.cmd.common import load_config
from compute_agent.messaging import messaging
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.helpers import write_conf
from tools.benchmarks.common import device_host, percentile

RABBIT = "rabbit://guest:guest@127.0.0.1:5672/"
SERVICES = Path(__file__).resolve().parents[1] / "services"
PFS, VFS_PER_PF = 4, 64
INFO_CALLS = 600
BUILDS = 200
CALLERS = 16
CONCURRENT_INFO_CALLS = 16 * 160  # 2,560
CONCURRENT_BUILD_ROUNDS = 2
TRIVIAL_FLOOR = 340  # ENVIRONMENT.md: 16 threads, one client, trivial endpoint
SPEC = {"name": "bench", "vcpus": 1, "memory_mb": 256}






def latency(case: str, method: str, seconds: list[float], **extra) -> dict:
    return {"case": case, "measure": f"{method} latency", "callers": 1,
            "calls": len(seconds),
            "latency_ms_median": round(statistics.median(seconds) * 1000, 2),
            "latency_ms_p99": round(percentile(seconds, 99) * 1000, 2),
            "latency_ms_max": round(max(seconds) * 1000, 2), **extra}


class Allocations:
    """The n-th instance's allocations: a NUMA cell and a PF on it."""

    def __init__(self, tree: list[dict], host: str):
        by_name = {p["name"]: p for p in tree}
        self.cells = [by_name[f"{host}_numa_{i}"]["uuid"] for i in (0, 1)]
        self.pfs = [(by_name[f"{host}_0000:{0x20 + i:02x}:00.0"]["uuid"], i % 2)
                    for i in range(PFS)]

    def __call__(self, n: int) -> dict:
        pf, cell = self.pfs[n % PFS]
        return {self.cells[cell]: {"resources": {"VCPU": 1, "MEMORY_MB": 256}},
                pf: {"resources": {"SRIOV_NET_VF": 1}}}


def timed(call) -> float:
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


def concurrently(jobs: list, callers: int = CALLERS) -> tuple[float, list[float]]:
    """Run the jobs (callables) on ``callers`` threads; wall time and each
    job's latency."""
    with ThreadPoolExecutor(callers) as pool:
        began = time.perf_counter()
        latencies = list(pool.map(timed, jobs))
        return time.perf_counter() - began, latencies


def throughput(method: str, wall: float, latencies: list[float], **extra) -> dict:
    return {"case": "rpc", "measure": f"{method} concurrent", "callers": CALLERS,
            "calls": len(latencies),
            "calls_per_second": round(len(latencies) / wall, 1),
            "trivial_endpoint_floor_calls_per_second": TRIVIAL_FLOOR,
            "latency_ms_median": round(statistics.median(latencies) * 1000, 2),
            "latency_ms_p99": round(percentile(latencies, 99) * 1000, 2), **extra}


class TrivialEndpoint:
    target = messaging.Target(version="1.0")

    def get_host_info(self, ctxt):
        return {"providers": 1}


def serve_trivial(conf_path: str, host: str) -> None:
    """The reference server, run as ``python -c`` by ``run``; until SIGTERM."""
    from compute_agent.messaging import TOPIC, transport
    server = messaging.get_rpc_server(
        transport(load_config(["--config-file", conf_path])),
        messaging.Target(topic=TOPIC, server=host), [TrivialEndpoint()],
        access_policy=messaging.DefaultRPCAccessPolicy)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    server.start()
    stopped.wait()
    server.stop()
    server.wait()


def start_trivial(conf_path: Path, host: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from tools.benchmarks.rpc import "
         "serve_trivial; serve_trivial(sys.argv[1], sys.argv[2])",
         str(conf_path), host], cwd=Path(__file__).resolve().parents[2])


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until_serving(conf, host: str, proc, timeout: float = 60) -> None:
    api = ComputeAgentAPI(conf, timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"compute-agent exited with {proc.returncode}")
            try:
                if api.get_host_info(host).get("providers"):
                    return
            except messaging.MessagingTimeout:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"compute-agent {host} did not answer in {timeout}s")
            time.sleep(0.2)
    finally:
        api.close()


def trivial_calls_per_second(api: ComputeAgentAPI, host: str) -> float:
    for _ in range(20):
        api.get_host_info(host)
    wall, lat = concurrently([lambda: api.get_host_info(host)] * CONCURRENT_INFO_CALLS)
    return round(len(lat) / wall, 1)


def measure(api: ComputeAgentAPI, host: str, trivial_here: float) -> list[dict]:
    results = []
    for _ in range(20):  # warm up both sides' connections and pools
        api.get_host_info(host)
    results.append(latency("rpc", "get_host_info",
                           [timed(lambda: api.get_host_info(host))
                            for _ in range(INFO_CALLS)]))

    allocations = Allocations(api.get_provider_tree(host), host)

    def build(n: int, instances: list[str]):
        instance = str(uuid.uuid4())
        instances.append(instance)
        return lambda: api.build_instance(host, instance, SPEC, allocations(n))

    def delete_all(instances: list[str]) -> None:  # untimed
        concurrently([lambda u=u: api.delete_instance(host, u) for u in instances])
        instances.clear()

    built: list[str] = []
    seconds = [timed(build(n, built)) for n in range(BUILDS)]
    delete_all(built)
    results.append(latency("rpc", "build_instance", seconds,
                           rows_per_build=3, driver="fake"))

    wall, lat = concurrently([lambda: api.get_host_info(host)] * CONCURRENT_INFO_CALLS)
    results.append(throughput("get_host_info", wall, lat,
                              trivial_endpoint_calls_per_second_here=trivial_here))

    walls, lats = 0.0, []
    for _ in range(CONCURRENT_BUILD_ROUNDS):
        jobs = [build(n, built) for n in range(PFS * VFS_PER_PF)]
        wall, lat = concurrently(jobs)
        walls += wall
        lats += lat
        if api.get_host_info(host)["instances"] != len(jobs):
            raise AssertionError("a concurrent build went missing")
        delete_all(built)
    results.append(throughput("build_instance", walls, lats, driver="fake",
                              trivial_endpoint_calls_per_second_here=trivial_here))
    return results


def run(workdir: Path) -> list[dict]:
    subprocess.run([str(SERVICES)], check=True, stdout=subprocess.DEVNULL, timeout=300)
    placement = LocalPlacement(workdir / "placement").start()
    host = f"bench-rpc-{uuid.uuid4().hex[:6]}"
    conf_path = write_conf(
        workdir / "agent", placement.url, host, device_host(PFS, VFS_PER_PF),
        pci={"device_spec": '{"vendor_id": "8086", "product_id": "154c", '
                           '"resource_class": "SRIOV_NET_VF"}'},
        # The loop and reconciliation stay out of the way of the figures.
        DEFAULT={"transport_url": RABBIT, "update_interval": 3600,
                 "reconcile_interval": 1000})
    log = open(workdir / "agent.log", "w")
    procs = [subprocess.Popen(
        [str(Path(sys.executable).with_name("compute-agent")), "--config-file",
         str(conf_path)], stdout=log, stderr=subprocess.STDOUT)]
    api = None
    try:
        procs.append(start_trivial(conf_path, host + "-trivial"))
        conf = load_config(["--config-file", str(conf_path)])
        wait_until_serving(conf, host + "-trivial", procs[1])
        wait_until_serving(conf, host, procs[0])
        api = ComputeAgentAPI(conf, timeout=30)
        trivial_here = trivial_calls_per_second(api, host + "-trivial")
        stop(procs.pop())  # the reference server idles apart from now on
        return measure(api, host, trivial_here)
    finally:
        if api is not None:
            api.close()
        for proc in procs:
            stop(proc)
        log.close()
        placement.stop()
