"""Evacuations refused, through compute-agent-ctl and rpcapi, against two
compute-agent daemons on the libvirt test driver (VFs and a vGPU from
their own sysfs trees), the real Placement and the real RabbitMQ: an up
source, and a destination whose claim fails. Nothing moves in either."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.exception import NoSuchInstance, SourceHostUp
from compute_agent.moves.evacuation import evacuation_migration_uuid
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.helpers import get, put_allocations, unallocate
from tests.functional.test_rpc import BROKER, SPEC, AgentDaemon


@pytest.fixture
def two(tmp_path, placement, services):
    daemons = []
    for name in "ab":
        d = AgentDaemon(tmp_path / name, placement.url)
        d.conf = d.host.write_conf({"transport_url": BROKER, "update_interval": 1,
                                    "service_down_time": 2})
        daemons.append(d)
    api = ComputeAgentAPI(load_config(["--config-file", str(daemons[0].conf)]),
                          timeout=30)
    for d in daemons:
        d.start(api)
    yield daemons[0], daemons[1], api
    for d in daemons:
        d.stop()
    api.close()


def ctl(conf: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compute_agent.cmd.ctl", "--config-file",
                           str(conf), "--timeout", "20", *args],
                          capture_output=True, text=True, timeout=60)


def build(url: str, api, agent: AgentDaemon, **allocation_args) -> str:
    instance = str(uuid.uuid4())
    wanted = agent.allocations(**allocation_args)
    put_allocations(url, instance, wanted)
    api.build_instance(agent.name, instance, SPEC, wanted)
    return instance


def held(url: str, consumer: str) -> dict:
    """provider -> resources (generations aside)."""
    return {rp: a["resources"] for rp, a in
            get(url, f"/allocations/{consumer}")["allocations"].items()}


def stored_instances(agent: AgentDaemon) -> set[str]:
    path = Path(agent.host.dir) / "state" / "state.db"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT uuid FROM instances")}
    finally:
        conn.close()


def test_evacuating_from_an_up_host_is_refused_by_ctl_and_by_the_destination(
        two, placement):
    a, b, api = two
    instance = build(placement.url, api, a)
    before = held(placement.url, instance)
    b_before = b.store_dump()

    done = ctl(a.conf, "evacuate", a.name, "--json")
    assert done.returncode == 1 and done.stderr == "", done
    assert json.loads(done.stdout) == {
        "error": (f"source_host: {a.name} is up (its agent answered a heartbeat "
                  "within 2 s); evacuate only a down host, or force it"),
        "exit_code": 1}
    assert held(placement.url, instance) == before

    # A conductor that asserts it anyway: the destination asks the source.
    with pytest.raises(SourceHostUp, match=a.name):
        api.rebuild_instance(b.name, str(uuid.uuid4()), instance, SPEC, b.allocations(),
                             source_host=a.name)
    assert b.store_dump() == b_before
    assert api.get_instance(a.name, instance)["running"]


def test_a_destination_claim_that_fails_leaves_the_instance_on_the_source(
        two, placement):
    a, b, api = two
    url = placement.url
    instance = build(url, api, a)
    on_a = held(url, instance)
    # B's two VFs are held by its own instances, whose allocations Placement
    # has lost: Placement offers the VFs, B's claim cannot give them.
    for _ in range(2):
        unallocate(url, build(url, api, b))
    a.stop()  # A is down

    done = ctl(a.conf, "evacuate", a.name, "--target", b.name, "--json")
    assert done.returncode == 1, done
    # One line, named by the program as it was run (here python -m: "ctl").
    [closing] = done.stderr.strip().splitlines()
    assert closing.endswith("ctl: not every instance was evacuated (see above)"), closing
    [outcome] = json.loads(done.stdout)["instances"]
    assert outcome["instance"] == instance and outcome["state"] == "failed"
    assert outcome["destination"] == b.name
    assert outcome["error"].startswith("cannot claim 1 SRIOV_NET_VF from provider "), \
        outcome
    # Nothing moved: Placement has it on A again, B holds nothing of it, and
    # A's store still has it.
    assert held(url, instance) == on_a
    root = (Path(a.host.dir) / "state" / "compute_id").read_text().strip()
    assert get(url, f"/allocations/{evacuation_migration_uuid(instance, root)}"
               )["allocations"] == {}
    with pytest.raises(NoSuchInstance):
        api.get_instance(b.name, instance)
    assert instance in stored_instances(a)
