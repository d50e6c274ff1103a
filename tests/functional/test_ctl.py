"""compute-agent-ctl against a real compute-agent daemon over the real
RabbitMQ, with a fake-driver host (a PF with allowlisted VFs) and a real
Placement. Every command runs as the operator runs it: the console script
in a subprocess, its stdout, stderr and exit code."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from compute_agent.cmd.ctl import EXIT_SECONDS
from compute_agent.rpc.versions import VERSION
from compute_agent.testing.local_placement import LocalPlacement, free_port
from tests.functional.helpers import provider_uuid, put_allocations, unallocate, wait_serving, write_conf

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
RABBIT = "rabbit://guest:guest@127.0.0.1:5672/"
PF = "0000:81:00.0"
HOST = {"disk_gb": 50,
        "numa_cells": [{"id": 0, "cpus": "0-7", "memory_mb": 8192}],
        "pci_devices": [{"address": PF, "vendor_id": "8086", "product_id": "1572",
                         "numa_node": 0, "vfs": {"count": 8, "product_id": "154c"}}]}
VF_SPEC = '{"vendor_id": "8086", "product_id": "154c", "resource_class": "SRIOV_NET_VF"}'


def ctl(conf: Path, *args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "compute-agent-ctl"), "--config-file", str(conf),
                           *args], capture_output=True, text=True, timeout=timeout)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """A failed command: exit 1, nothing on stdout, one line on stderr
    (after those saying what it waited for, while it waited)."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = [line for line in done.stderr.strip().splitlines()
             if not line.startswith("compute-agent-ctl: waiting for ")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("compute-agent-ctl: "), lines[0]
    return lines[0]


class Agent:
    """A compute-agent daemon and what the tests need to address it."""

    def __init__(self, directory: Path, placement_url: str):
        self.name = f"ctl-{uuid.uuid4().hex[:8]}"
        self.dir = directory
        self.placement_url = placement_url
        self.conf = write_conf(directory, placement_url, self.name, HOST,
                               pci={"device_spec": VF_SPEC},
                               DEFAULT={"transport_url": RABBIT})
        self.log = directory / "agent.log"
        self.proc = subprocess.Popen(
            [str(BIN / "compute-agent"), "--config-file", str(self.conf)],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def ctl(self, *args, **kw) -> subprocess.CompletedProcess:
        return ctl(self.conf, *args, **kw)

    def info(self) -> dict:
        done = self.ctl("host-info", self.name, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


    def uuid_of(self, suffix: str) -> str:
        return provider_uuid(self.placement_url, f"{self.name}_{suffix}")

    def allocations(self, vcpus: int = 2, memory_mb: int = 1024, vfs: int = 1) -> dict:
        return {self.uuid_of("numa_0"): {"resources": {"VCPU": vcpus,
                                                       "MEMORY_MB": memory_mb}},
                self.uuid_of(PF): {"resources": {"SRIOV_NET_VF": vfs}}}

    def spec_file(self, name: str, **content) -> Path:
        path = self.dir / f"{name}-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(content))
        return path

    def build(self, vcpus: int = 2) -> tuple[str, dict]:
        """Allocate in Placement as a scheduler would, then build by ctl."""
        instance = str(uuid.uuid4())
        allocations = self.allocations(vcpus=vcpus)
        put_allocations(self.placement_url, instance, allocations)
        spec = self.spec_file("build", instance_uuid=instance, allocations=allocations,
                              spec={"name": "guest", "vcpus": vcpus, "memory_mb": 1024})
        done = self.ctl("build", self.name, "--spec", str(spec), "--json")
        assert done.returncode == 0, done.stderr
        return instance, json.loads(done.stdout)

    def delete(self, instance: str) -> None:
        assert self.ctl("delete", self.name, instance).returncode == 0
        unallocate(self.placement_url, instance)


@pytest.fixture(scope="module")
def agent(tmp_path_factory, placement, services):
    a = Agent(tmp_path_factory.mktemp("ctl-agent"), placement.url)
    try:
        wait_serving(a.conf, a.name, a.proc, a.log)
        yield a
    finally:
        a.proc.send_signal(signal.SIGTERM)
        code = a.proc.wait(30)
    assert code == 0, a.log.read_text()


def vfs_of(instance: dict) -> list[str]:
    return [r["device_id"] for r in instance["assignments"]
            if r["resource_class"] == "SRIOV_NET_VF" and r["owner"] == "instance"]


def test_host_info_human_and_json(agent):
    info = agent.info()
    assert info["host"] == agent.name and info["rpc_version"] == VERSION
    assert info["providers"] == 3  # root, NUMA cell, PF
    human = agent.ctl("host-info", agent.name)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert f"host: {agent.name}" in lines
    assert f"root uuid: {info['root_uuid']}" in lines
    assert "providers: 3" in lines and f"instances: {info['instances']}" in lines


def test_tree_human_and_json(agent):
    done = agent.ctl("tree", agent.name, "--json")
    assert done.returncode == 0, done.stderr
    tree = {p["name"]: p for p in json.loads(done.stdout)}
    root, numa, pf = agent.name, f"{agent.name}_numa_0", f"{agent.name}_{PF}"
    assert set(tree) == {root, numa, pf}
    assert tree[root]["uuid"] == agent.info()["root_uuid"]
    assert tree[pf]["parent_provider_uuid"] == tree[numa]["uuid"]
    assert "parent_uuid" not in tree[pf]
    assert tree[pf]["inventories"]["SRIOV_NET_VF"]["reserved"] == 0
    assert tree[numa]["inventories"]["VCPU"]["allocation_ratio"] == 4.0
    assert tree[pf]["inventories"]["SRIOV_NET_VF"]["total"] == 8
    assert tree[numa]["inventories"]["VCPU"]["total"] == 8

    human = agent.ctl("tree", agent.name)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].startswith(f"{root}  [{tree[root]['uuid']}]")
    # The PF sits two levels down, under the NUMA cell, with its VFs.
    pf_line = lines.index(next(l for l in lines if l.strip().startswith(pf)))
    assert lines[pf_line].startswith(" " * 8 + pf)
    assert "SRIOV_NET_VF=8" in lines[pf_line + 1]


def test_build_from_a_spec_file_then_show(agent):
    before = agent.info()["instances"]
    instance, built = agent.build()
    try:
        assert built["uuid"] == instance and built["running"] is True
        assert built["spec"] == {"name": "guest", "vcpus": 2, "memory_mb": 1024}
        (vf,) = vfs_of(built)
        assert vf.startswith("0000:81:") and vf != PF  # a VF of the PF, not the PF

        shown = agent.ctl("show", agent.name, instance, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["assignments"] == built["assignments"]

        human = agent.ctl("show", agent.name, instance)
        assert human.returncode == 0, human.stderr
        first, *rest = human.stdout.splitlines()
        assert first.startswith(f"instance {instance}  guest  2 vCPU  1024 MB")
        assert first.endswith("running")
        assert "assignments: 3" in rest
        assert any("SRIOV_NET_VF" in l and vf in l and "claimed" in l for l in rest)
        assert agent.info()["instances"] == before + 1
    finally:
        agent.delete(instance)


def test_delete_gives_the_devices_back(agent):
    before = agent.info()
    instance, built = agent.build()
    done = agent.ctl("delete", agent.name, instance)
    unallocate(agent.placement_url, instance)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"instance: {instance}"
    assert "no such instance" in one_error_line(agent.ctl("show", agent.name, instance))
    after = agent.info()
    assert (after["instances"], after["assignments"]) == \
        (before["instances"], before["assignments"])


def test_a_bad_spec_file_is_one_line_naming_the_field(agent):
    before = agent.info()
    instance = str(uuid.uuid4())
    good = agent.allocations()
    cases = [
        # Checked by the agent's schema, answered as InvalidRequest.
        ({"instance_uuid": instance, "allocations": good,
          "spec": {"name": "g", "vcpus": "two", "memory_mb": 1024}}, "spec.vcpus"),
        ({"instance_uuid": "not-a-uuid", "allocations": good,
          "spec": {"name": "g", "vcpus": 2, "memory_mb": 1024}}, "instance_uuid"),
        ({"instance_uuid": instance,
          "allocations": {agent.uuid_of(PF): {"resources": {"SRIOV_NET_VF": -1}}},
          "spec": {"name": "g", "vcpus": 2, "memory_mb": 1024}},
         f"allocations.{agent.uuid_of(PF)}.resources.SRIOV_NET_VF"),
        # Checked before anything is sent.
        ({"instance_uuid": instance, "spec": {"name": "g", "vcpus": 2,
                                              "memory_mb": 1024}}, "allocations: missing"),
    ]
    for content, field in cases:
        spec = agent.spec_file("bad", **content)
        line = one_error_line(agent.ctl("build", agent.name, "--spec", str(spec)))
        assert field in line, (field, line)
    unreadable = agent.dir / "not-json.json"
    unreadable.write_text("{spec")
    assert "not JSON" in one_error_line(
        agent.ctl("build", agent.name, "--spec", str(unreadable)))
    # Refused means nothing was claimed.
    assert "no such instance" in one_error_line(agent.ctl("show", agent.name, instance))
    assert agent.info() == before


def test_a_claim_the_host_cannot_give_names_the_resource(agent):
    allocations = agent.allocations(vfs=9)
    spec = agent.spec_file("big", instance_uuid=str(uuid.uuid4()), allocations=allocations,
                           spec={"name": "g", "vcpus": 2, "memory_mb": 1024})
    line = one_error_line(agent.ctl("build", agent.name, "--spec", str(spec)))
    assert "SRIOV_NET_VF" in line and "9" in line, line


def test_same_host_resize_then_confirm_and_a_second_move_refused(agent):
    instance, built = agent.build(vcpus=2)
    migration = str(uuid.uuid4())
    move = ["--instance", instance, "--migration", migration]
    new = agent.spec_file("resize", allocations=agent.allocations(vcpus=4),
                          spec={"name": "guest", "vcpus": 4, "memory_mb": 1024})
    try:
        for command in (["prep-resize", agent.name, *move, "--spec", str(new)],
                        ["resize", agent.name, *move],
                        ["finish-resize", agent.name, *move]):
            done = agent.ctl(*command)
            assert done.returncode == 0, (command, done.stderr)
        # Another move of the same instance before this one is confirmed.
        other = ["--instance", instance, "--migration", str(uuid.uuid4())]
        line = one_error_line(agent.ctl("prep-resize", agent.name, *other,
                                        "--spec", str(new)))
        assert f"is in move {migration}" in line

        done = agent.ctl("confirm-resize", agent.name, *move, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["migration_uuid"] == migration
        shown = json.loads(agent.ctl("show", agent.name, instance, "--json").stdout)
        assert shown["spec"]["vcpus"] == 4
        assert [m["state"] for m in shown["migrations"]] == ["confirmed"]
        # Only the new flavor's claims are left: the old ones went back.
        live = sorted((r["resource_class"], r["amount"]) for r in shown["assignments"]
                      if r["state"] == "claimed")
        assert live == [("MEMORY_MB", 1024), ("SRIOV_NET_VF", 1), ("VCPU", 4)]
    finally:
        agent.delete(instance)


def test_an_unknown_host_times_out_after_timeout_with_a_hint(agent):
    """--timeout N: the command ends about N s after its start-up, not up
    to 5 s later: oslo.messaging's reply listener, stopped when the
    transport closes, noticed it only at the end of its current wait on
    the broker (at N = 5, the one from 4.1 s to 8.2 s)."""
    # Start-up: the interpreter, the imports, the config read and checked,
    # the transport made and closed; a spec file that is not there ends
    # the command before any call. Measured before and after the timed
    # run, the longer taken: on a loaded machine one start-up may take
    # seconds more than the next.
    def measure_start_up() -> float:
        started = time.monotonic()
        assert agent.ctl("build", "nowhere", "--spec", str(agent.dir / "absent.json")
                         ).returncode == 1
        return time.monotonic() - started

    before = measure_start_up()
    started = time.monotonic()
    done = agent.ctl("--timeout", "5", "host-info", f"nowhere-{uuid.uuid4().hex[:6]}")
    elapsed = time.monotonic() - started
    start_up = max(before, measure_start_up())
    line = one_error_line(done)
    # Within --timeout of its start, less what it keeps for its exit.
    assert 5 - EXIT_SECONDS <= elapsed < start_up + 5 + 1.5, (elapsed, start_up)
    assert "no answer from nowhere-" in line and "within 5s" in line
    assert "host may be down" in line


def test_bug_ctl_hosts_blamed_placement_while_a_down_hosts_heartbeat_waited(
        tmp_path, services):
    """A heartbeat waits service_down_time for its answer, not --timeout:
    ctl's watchdog did not see those calls, and said "Placement did not
    answer within 6s" (--timeout 1 plus 5) while a down host's was still
    waiting (at 1,000 hosts, checked 32 at a time, with them all up)."""
    own = LocalPlacement(tmp_path / "placement").start()
    try:
        conf = write_conf(tmp_path, own.url, f"ctl-down-{uuid.uuid4().hex[:6]}", HOST,
                          DEFAULT={"transport_url": RABBIT, "service_down_time": 7})
        once = subprocess.run([str(BIN / "compute-agent"), "--config-file", str(conf),
                               "--once"], capture_output=True, text=True, timeout=60)
        assert once.returncode == 0, once.stderr
        done = ctl(conf, "--timeout", "5", "hosts", "--json")
    finally:
        own.stop()
    assert done.returncode == 0, done.stdout
    [host] = json.loads(done.stdout)
    assert host["state"] == "down" and host["host"].startswith("ctl-down-")


def test_errors_with_json_are_one_object_on_stdout(agent):
    # --timeout counts from the command's start, its imports included: 1 s
    # was spent before the question was sent under the suite's load.
    done = agent.ctl("--timeout", "5", "host-info", "nowhere-json", "--json")
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["exit_code"] == 1 and answer["error"].startswith(
        "no answer from nowhere-json within 5s")
    assert "no answer" not in done.stderr

    unreadable = agent.dir / "not-json-either.json"
    unreadable.write_text("{spec")
    done = agent.ctl("build", agent.name, "--spec", str(unreadable), "--json")
    assert done.returncode == 1
    assert "not JSON" in json.loads(done.stdout)["error"]
    # Refused by the agent: its one line, as JSON.
    done = agent.ctl("show", agent.name, str(uuid.uuid4()), "--json")
    assert done.returncode == 1
    assert "no such instance" in json.loads(done.stdout)["error"]


def test_no_traceback_when_the_reader_closes_stdout(agent):
    for args in (["tree", agent.name], ["tree", agent.name, "--json"],
                 ["host-info", agent.name]):
        proc = subprocess.Popen([str(BIN / "compute-agent-ctl"), "--config-file",
                                 str(agent.conf), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(60) == 0, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_an_unreachable_broker_is_one_line_not_a_hang(tmp_path, placement):
    conf = write_conf(tmp_path, placement.url, "ctl-no-broker", HOST, DEFAULT={
        "transport_url": f"rabbit://guest:guest@127.0.0.1:{free_port()}/"})
    started = time.monotonic()
    line = one_error_line(ctl(conf, "--timeout", "1", "host-info", "ctl-no-broker",
                              timeout=30))
    assert time.monotonic() - started < 20
    assert "message broker did not answer" in line and "transport_url" in line


def test_a_config_error_exits_2(tmp_path, placement):
    conf = write_conf(tmp_path, placement.url, "ctl-bad-conf", HOST,
                      DEFAULT={"transport_url": RABBIT, "update_interval": "soon"})
    done = ctl(conf, "host-info", "ctl-bad-conf")
    assert done.returncode == 2
    assert "[DEFAULT] update_interval" in done.stderr
