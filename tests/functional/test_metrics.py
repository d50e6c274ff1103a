"""The Prometheus endpoint ([metrics] listen) of an agent against the real
Placement: scraped over HTTP, its counters move by what the agent did; and
the probes it answers beside them (/healthz, /readyz) for a real daemon,
with Placement held away or hanging through the fault proxy."""
from __future__ import annotations

import copy
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.exception import ConfigError, InvalidRequest
from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault
from compute_agent.testing.local_placement import free_port
from tests.functional.helpers import placement_tree, put_allocations, wait_for, write_conf

HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}
SPEC = {"name": "scraped", "vcpus": 2, "memory_mb": 512}

Samples = dict[tuple[str, frozenset], float]


def scrape(port: int) -> Samples:
    resp = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert resp.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(resp.text)
            for s in family.samples}


def value(samples: Samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def requests_by_method_and_status(lines: list[str]) -> Counter:
    """Placement's own log lines ("GET /path 200") counted."""
    return Counter((line.split()[0], line.split()[-1]) for line in lines)


def agent_serving(tmp_path: Path, placement_url: str, port: int) -> Agent:
    # No cycle of its own in the test's time: each is the test's.
    conf = write_conf(tmp_path, placement_url, f"metrics-{uuid.uuid4().hex[:8]}", HOST,
                      DEFAULT={"update_interval": 3600},
                      metrics={"listen": f"127.0.0.1:{port}"})
    return compose(load_config(["--config-file", str(conf)]))


def test_cycles_requests_claims_and_findings_move_the_counters(tmp_path, placement):
    port = free_port()
    agent = agent_serving(tmp_path, placement.url, port)
    agent.start()
    try:
        before = scrape(port)
        # The first cycle, at start, registered the host.
        assert value(before, "compute_agent_cycles_total", result="ok") == 1
        assert value(before, "compute_agent_cycle_duration_seconds_count") == 1

        mark = placement.mark()
        assert agent.run_cycle().ok and agent.run_cycle().ok
        after_cycles = scrape(port)
        assert moved(before, after_cycles, "compute_agent_cycles_total", result="ok") == 2
        assert moved(before, after_cycles, "compute_agent_cycle_duration_seconds_count") == 2
        seen = requests_by_method_and_status(placement.requests_since(mark))
        assert seen == Counter({("GET", "200"): 2})  # steady state: one GET a cycle
        for (method, status), n in seen.items():
            assert moved(before, after_cycles, "compute_agent_placement_requests_total",
                         method=method, status=status) == n

        cell = placement_tree(placement.url, agent.policy.root_uuid)[
            f"{agent.policy.host}_numa_0"]["uuid"]
        instance = str(uuid.uuid4())
        allocations = {cell: {"resources": {"VCPU": 2, "MEMORY_MB": 512}}}
        put_allocations(placement.url, instance, allocations)
        agent.manager.build_instance(instance, SPEC, allocations)
        with pytest.raises(InvalidRequest):  # a provider of no host of ours
            agent.manager.build_instance(str(uuid.uuid4()), SPEC, {
                str(uuid.uuid4()): {"resources": {"VCPU": 1}}})
        after_claims = scrape(port)
        assert moved(after_cycles, after_claims, "compute_agent_claims_total",
                     kind="build", result="claimed") == 1
        assert moved(after_cycles, after_claims, "compute_agent_claims_total",
                     kind="build", result="invalid") == 1
        # Claim and completion of the build, and the refused claim: three
        # decisions, each timed waiting for the lock.
        assert moved(after_cycles, after_claims, "compute_agent_lock_wait_seconds_count") == 3
        assert value(after_claims, "compute_agent_assigned",
                     resource_class="VCPU", state="claimed") == 2
        assert value(after_claims, "compute_agent_assigned",
                     resource_class="MEMORY_MB", state="claimed") == 512

        # The store forgets the instance, its guest and allocation stay:
        # reconciliation reports both.
        agent.manager.tracker.release_instance(instance)
        agent.reconcile(at_start=False)
        after_reconcile = scrape(port)
        for rule in ("guest_without_assignments", "allocation_without_record"):
            assert moved(after_claims, after_reconcile,
                         "compute_agent_reconcile_findings_total",
                         rule=rule, outcome="reported") == 1
        assert value(after_reconcile, "compute_agent_assigned",
                     resource_class="VCPU", state="claimed") == 0
    finally:
        agent.stop()
    # Stopped: nothing listens there any more (a restart binds it, as any
    # server does, with SO_REUSEADDR past the closed connections).
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


VF_HOST = {**HOST, "pci_devices": [
    {"address": address, "vendor_id": "8086", "product_id": "1572", "numa_node": 0,
     "vfs": {"count": count, "product_id": "154c"}}
    for address, count in (("0000:3b:00.0", 8), ("0000:5e:00.0", 4))]}
VF_SPEC = '{"vendor_id": "8086", "product_id": "154c", "resource_class": "SRIOV_NET_VF"}'


def capacity(samples: Samples, provider: tuple[str, dict], resource_class: str) -> dict:
    """total, reserved and used of one provider's class (its name and
    Placement's record); a missing series is left out (not 0)."""
    name, record = provider
    labels = frozenset({"provider": name, "provider_uuid": record["uuid"],
                        "resource_class": resource_class}.items())
    return {field: samples[(f"compute_agent_provider_{field}", labels)]
            for field in ("total", "reserved", "used")
            if (f"compute_agent_provider_{field}", labels) in samples}


def test_capacity_per_provider_shows_a_vf_pool_before_and_after_a_claim(
        tmp_path, placement):
    port = free_port()
    conf = write_conf(tmp_path, placement.url, f"metrics-{uuid.uuid4().hex[:8]}", VF_HOST,
                      DEFAULT={"update_interval": 3600},
                      metrics={"listen": f"127.0.0.1:{port}"},
                      pci={"device_spec": [VF_SPEC]})
    agent = compose(load_config(["--config-file", str(conf)]))
    agent.start()
    try:
        tree = placement_tree(placement.url, agent.policy.root_uuid)
        host = agent.policy.host
        pool, other, cell = ((name, tree[name]) for name in (
            f"{host}_0000:3B:00.0", f"{host}_0000:5E:00.0", f"{host}_numa_0"))
        before = scrape(port)
        assert capacity(before, pool, "SRIOV_NET_VF") == {
            "total": 8, "reserved": 0, "used": 0}
        assert capacity(before, other, "SRIOV_NET_VF") == {
            "total": 4, "reserved": 0, "used": 0}
        assert capacity(before, cell, "VCPU") == {"total": 4, "reserved": 0, "used": 0}

        instance = str(uuid.uuid4())
        allocations = {cell[1]["uuid"]: {"resources": {"VCPU": 2, "MEMORY_MB": 512}},
                       pool[1]["uuid"]: {"resources": {"SRIOV_NET_VF": 1}}}
        put_allocations(placement.url, instance, allocations)
        agent.manager.build_instance(instance, SPEC, allocations)
        # Usage comes from the allocations reconciliation reads (the claim
        # touched these providers): the scrape itself asks Placement nothing.
        agent.reconcile(at_start=False)
        mark = placement.mark()
        after = scrape(port)
        assert placement.requests_since(mark) == []
        assert capacity(after, pool, "SRIOV_NET_VF") == {"total": 8, "reserved": 0, "used": 1}
        assert capacity(after, other, "SRIOV_NET_VF") == {"total": 4, "reserved": 0, "used": 0}
        assert capacity(after, cell, "VCPU") == {"total": 4, "reserved": 0, "used": 2}
        assert capacity(after, cell, "MEMORY_MB")["used"] == 512

        # The second PF leaves the host (the change wakes the loop's cycle),
        # its provider the tree: its series go.
        smaller = copy.deepcopy(VF_HOST)
        del smaller["pci_devices"][1]
        agent.driver.set_host(smaller)

        def without_other() -> Samples | None:
            samples = scrape(port)
            return samples if capacity(samples, other, "SRIOV_NET_VF") == {} else None

        gone = wait_for(without_other)
        assert capacity(gone, pool, "SRIOV_NET_VF") == {"total": 8, "reserved": 0, "used": 1}
    finally:
        agent.stop()


def test_a_placement_that_does_not_answer_is_counted(tmp_path, placement):
    port = free_port()
    agent = agent_serving(tmp_path, f"http://127.0.0.1:{free_port()}", port)
    agent.start()
    try:
        assert not agent.run_cycle().ok
        samples = scrape(port)
        assert value(samples, "compute_agent_cycles_total",
                     result="placement_unavailable") == 2
        assert value(samples, "compute_agent_cycles_total", result="ok") == 0
        assert value(samples, "compute_agent_placement_requests_total",
                     method="GET", status="no_answer") >= 2
    finally:
        agent.stop()


def test_agents_in_one_process_keep_their_counts_apart(tmp_path, placement):
    one, two = free_port(), free_port()
    first = agent_serving(tmp_path / "one", placement.url, one)
    second = agent_serving(tmp_path / "two", placement.url, two)
    first.start()
    second.start()
    try:
        first.run_cycle()
        assert value(scrape(one), "compute_agent_cycles_total", result="ok") == 2
        assert value(scrape(two), "compute_agent_cycles_total", result="ok") == 1
    finally:
        first.stop()
        second.stop()


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path, placement):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = agent_serving(tmp_path / "inproc", placement.url, port)
        with pytest.raises(ConfigError, match=r"\[metrics\] listen: .*address already "
                           r"in use \(value: '127\.0\.0\.1:\d+'\)"):
            agent.start()
        agent.stop()

        conf = write_conf(tmp_path / "daemon", placement.url, "metrics-port-in-use", HOST,
                          metrics={"listen": f"127.0.0.1:{port}"})
        done = subprocess.run([sys.executable, "-m", "compute_agent.cmd.agent",
                               "--config-file", str(conf)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, done.stderr
    assert errors[0].endswith(f": error: [metrics] listen: cannot serve metrics there: "
                              f"address already in use (value: '127.0.0.1:{port}')")


def probe(port: int, path: str) -> tuple[int, str] | None:
    """The probe's status and its one line; None while nothing listens."""
    try:
        resp = requests.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except requests.ConnectionError:
        return None
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert resp.text.endswith("\n") and resp.text.count("\n") == 1, resp.text
    return resp.status_code, resp.text.strip()


def answered(port: int, path: str, code: int) -> tuple[int, str] | None:
    """The probe's answer when it is ``code``, for wait_for."""
    answer = probe(port, path)
    return answer if answer is not None and answer[0] == code else None


def start_daemon(conf: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "compute_agent.cmd.agent", "--config-file",
                             str(conf)], stdout=open(log, "w"), stderr=subprocess.STDOUT)


def stop_daemon(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def test_readyz_is_503_until_a_cycle_reaches_placement_then_200(tmp_path, placement):
    port = free_port()
    with FaultProxy(placement.url, {PlacementFault.ERROR_503_BEFORE: 1.0}) as proxy:
        conf = write_conf(tmp_path, proxy.url, "probed-ready", HOST,
                          metrics={"listen": f"127.0.0.1:{port}"})
        log = tmp_path / "agent.log"
        proc = start_daemon(conf, log)
        try:
            wait_for(lambda: "compute-agent running as host" in log.read_text(), 60)
            # Serving RPC, its cycles failing: alive, not ready.
            code, reason = probe(port, "/readyz")
            assert code == 503
            assert reason.startswith("no cycle has reached Placement yet: "), reason
            assert probe(port, "/healthz")[0] == 200

            proxy.set_rates({})
            ready = wait_for(lambda: answered(port, "/readyz", 200))
            assert ready[1] == ("ready: a cycle reached Placement, RPC is served, the "
                                "store is open")
        finally:
            stop_daemon(proc)


def test_healthz_is_503_while_a_turn_runs_beyond_its_limit(tmp_path, placement):
    """A Placement that accepts requests and never answers holds the
    cycle for [placement] timeout: beyond a limit of 1 s, the loop is
    stuck; alive again once the cycle ends."""
    port = free_port()
    with FaultProxy(placement.url) as proxy:
        conf = write_conf(tmp_path, proxy.url, "probed-stuck", HOST,
                          placement={"timeout": 8},
                          metrics={"listen": f"127.0.0.1:{port}",
                                   "healthz_turn_limit": 1})
        log = tmp_path / "agent.log"
        proc = start_daemon(conf, log)
        try:
            alive = wait_for(lambda: answered(port, "/healthz", 200), 60)
            assert alive[1].startswith("alive: "), alive

            proxy.set_rates({PlacementFault.BLACK_HOLE: 1.0})
            stuck = wait_for(lambda: answered(port, "/healthz", 503))
            assert stuck[1].startswith("the update loop's turn has run "), stuck
            assert stuck[1].endswith(" s, beyond its limit of 1 s ([metrics] "
                                     "healthz_turn_limit)"), stuck
            # Still ready: a Placement that hangs is no reason to stop serving.
            assert probe(port, "/readyz")[0] == 200

            proxy.set_rates({})
            wait_for(lambda: answered(port, "/healthz", 200))
        finally:
            stop_daemon(proc)
