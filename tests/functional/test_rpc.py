"""Conductor to agent over a real RabbitMQ.

Each agent is a real `compute-agent` daemon on the libvirt test driver with
a fake sysfs tree and the real Placement; this test process is the
conductor: it writes allocations to Placement as a scheduler would, swaps
them with the rpcapi helper, and drives the agents through rpcapi.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from keystoneauth1 import adapter, session
from lxml import etree

from compute_agent.cmd.common import load_config
from compute_agent.exception import (
    ClaimFailed,
    InvalidRequest,
    LiveMigrationRefused,
    NoSuchInstance,
    RetryMismatch,
    StoreUnavailable,
    VersionCapped,
)
from compute_agent.messaging import TOPIC, messaging, transport
from compute_agent.placement.allocations import move_allocations
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.store.schema import COMMIT_SEQUENCE
from tests.functional.helpers import HEADERS, put_allocations, wait_for
from tests.functional.libvirt_host import GPU, PF, Host

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
SPEC = {"name": "guest", "vcpus": 2, "memory_mb": 1024}
BIGGER = {"name": "guest", "vcpus": 4, "memory_mb": 2048}


class AgentDaemon:
    """A compute-agent process on a test host."""

    def __init__(self, tmp_path: Path, placement_url: str):
        self.host = Host(tmp_path, placement_url)
        self.host.build_default()
        self.conf = self.host.write_conf({"transport_url": BROKER, "update_interval": 2})
        self.log = tmp_path / "agent.log"
        self.proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return self.host.name

    def start(self, api: ComputeAgentAPI) -> AgentDaemon:
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "compute-agent"), "--config-file",
             str(self.conf)], stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        wait_for(lambda: self._answers(api), timeout=60)
        return self

    def _answers(self, api: ComputeAgentAPI) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        try:
            api._call(self.name, "get_host_info", timeout=2)
            return True
        except Exception:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    def store_dump(self) -> str:
        """Every row of the agent's store, read beside the running agent,
        but for its saved view of Placement, a cache that follows the
        generations every allocation moves, and the commit sequence, which
        each write of that cache moves too."""
        path = Path(self.host.dir) / "state" / "state.db"
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return "\n".join(sorted(
                line for line in conn.iterdump()
                if not line.startswith('INSERT INTO "placement_view"')
                and not line.startswith(f'INSERT INTO "meta" VALUES(\'{COMMIT_SEQUENCE}\'')))
        finally:
            conn.close()

    def provider(self, suffix: str) -> str:
        return self.host.uuid_of(suffix)

    def allocations(self, vcpus: int = 2, memory_mb: int = 1024, vfs: int = 1) -> dict:
        gpu = "pci_" + GPU.replace(":", "_").replace(".", "_")
        return {self.provider("numa_1"): {"resources": {"VCPU": vcpus,
                                                         "MEMORY_MB": memory_mb}},
                self.provider(PF.upper()): {"resources": {"SRIOV_NET_VF": vfs}},
                self.provider(gpu): {"resources": {"VGPU": 1}}}


@pytest.fixture
def conductor(tmp_path, placement, services):
    first = AgentDaemon(tmp_path / "a", placement.url)
    # The conductor of an upgrade that has not finished: pinned at the
    # oldest version, so every test here makes every 1.0 call that way.
    conf = load_config(["--config-file", str(first.conf)])
    conf.set_override("compute_agent", "1.0", group="upgrade_levels")
    api = ComputeAgentAPI(conf, timeout=30)
    ks = adapter.Adapter(session.Session(auth=NoAuth2(placement.url)),
                         service_type="placement")
    daemons = [first]

    class Conductor:
        rpc = api
        placement_client = PlacementClient(ks)

        def agent(self, name="a") -> AgentDaemon:
            if name == "a":
                return first.start(api) if first.proc is None else first
            daemon = AgentDaemon(tmp_path / name, placement.url).start(api)
            daemons.append(daemon)
            return daemon

        def schedule(self, consumer: str, allocations: dict) -> None:
            put_allocations(placement.url, consumer, allocations)

        def forget(self, consumer: str) -> None:
            requests.delete(f"{placement.url}/allocations/{consumer}", headers=HEADERS,
                            timeout=10)

    yield Conductor()
    for d in daemons:
        d.stop()
    api.close()


def devices(view: dict, owner: str = "instance") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in view["assignments"]:
        if a["owner"] == owner and a["kind"] != "numa":
            out.setdefault(a["kind"], []).append(a["device_id"])
    return {k: sorted(v) for k, v in out.items()}


def build(c, agent: AgentDaemon, **allocation_args) -> tuple[str, dict]:
    instance = str(uuid.uuid4())
    wanted = agent.allocations(**allocation_args)
    c.schedule(instance, wanted)
    return instance, c.rpc.build_instance(agent.name, instance, SPEC, wanted)


def test_a_build_over_rpc_is_in_the_store_and_the_domain_xml(conductor):
    agent = conductor.agent()
    instance, built = build(conductor, agent)

    view = conductor.rpc.get_instance(agent.name, instance)
    assert view == built
    assert {a["state"] for a in view["assignments"]} == {"claimed"}
    assert view["running"] is True
    dom = etree.fromstring(view["definition"].encode())
    vf = devices(view)["vf"][0]
    bus, slot_fn = vf.split(":")[1], vf.split(":")[2]
    addr = dom.find("devices/interface[@type='hostdev']/source/address")
    assert (int(addr.get("bus"), 16), int(addr.get("slot"), 16),
            int(addr.get("function"), 16)) == (int(bus, 16), int(slot_fn.split(".")[0], 16),
                                               int(slot_fn.split(".")[1]))
    mdev = dom.find("devices/hostdev[@type='mdev']/source/address").get("uuid")
    assert [mdev] == devices(view)["mdev"]
    ns = {"ca": "http://compute-agent.openstack.org/xmlns/instance/1"}
    assert {e.get("id") for e in dom.iterfind("metadata/ca:instance/ca:assignment",
                                              namespaces=ns)} == {
        a["id"] for a in view["assignments"]}


def test_same_host_resize_then_confirm_and_another_then_revert(conductor):
    c, agent = conductor, conductor.agent()
    instance, built = build(c, agent)
    original = devices(built)

    # Resize, confirmed: the conductor swaps the allocations, schedules the
    # new flavor, and drives both sides (here one host).
    first = str(uuid.uuid4())
    move_allocations(c.placement_client, instance, first)
    c.schedule(instance, agent.allocations(vcpus=4, memory_mb=2048))
    c.rpc.prep_resize(agent.name, first, instance, BIGGER,
                      agent.allocations(vcpus=4, memory_mb=2048))
    c.rpc.resize_instance(agent.name, first, instance)
    during = devices(c.rpc.finish_resize(agent.name, first, instance))
    assert during["vf"] != original["vf"]
    c.rpc.confirm_resize(agent.name, first, instance)
    c.forget(first)
    confirmed = c.rpc.get_instance(agent.name, instance)
    assert devices(confirmed) == during and devices(confirmed, "migration") == {}
    assert confirmed["spec"]["vcpus"] == 4

    # Another resize, reverted: everything returns to the confirmed state.
    second = str(uuid.uuid4())
    move_allocations(c.placement_client, instance, second)
    c.schedule(instance, agent.allocations())
    c.rpc.prep_resize(agent.name, second, instance, SPEC, agent.allocations())
    c.rpc.resize_instance(agent.name, second, instance)
    c.rpc.finish_resize(agent.name, second, instance)
    c.rpc.revert_resize(agent.name, second, instance)
    move_allocations(c.placement_client, second, instance, "INSTANCE")
    reverted = c.rpc.get_instance(agent.name, instance)
    assert devices(reverted) == during
    assert reverted["spec"]["vcpus"] == 4
    assert devices(reverted, "migration") == {}


def test_a_cross_host_resize_between_two_agents(conductor):
    c = conductor
    source, dest = c.agent("a"), c.agent("b")
    instance, built = build(c, source)
    migration = str(uuid.uuid4())

    moved = move_allocations(c.placement_client, instance, migration)
    assert set(moved) == set(source.allocations())
    c.schedule(instance, dest.allocations(vcpus=4, memory_mb=2048))
    c.rpc.prep_resize(dest.name, migration, instance, BIGGER,
                      dest.allocations(vcpus=4, memory_mb=2048))
    c.rpc.resize_instance(source.name, migration, instance)
    at_source = c.rpc.get_instance(source.name, instance)
    assert devices(at_source, "migration") == devices(built)
    finished = c.rpc.finish_resize(dest.name, migration, instance)
    assert finished["running"] and devices(finished)["vf"]
    c.rpc.confirm_resize(source.name, migration, instance)
    c.forget(migration)

    with pytest.raises(NoSuchInstance):
        c.rpc.get_instance(source.name, instance)
    assert c.rpc.get_host_info(source.name)["assignments"] == 0
    assert c.rpc.get_instance(dest.name, instance)["spec"]["vcpus"] == 4


def test_every_state_changing_call_twice_is_one_claim_and_one_answer(conductor):
    c, agent = conductor, conductor.agent()
    instance = str(uuid.uuid4())
    wanted = agent.allocations()
    c.schedule(instance, wanted)
    first = c.rpc.build_instance(agent.name, instance, SPEC, wanted)
    assert c.rpc.build_instance(agent.name, instance, SPEC, wanted) == first
    assert c.rpc.get_host_info(agent.name)["assignments"] == len(first["assignments"])

    migration = str(uuid.uuid4())
    bigger = agent.allocations(vcpus=4, memory_mb=2048)
    steps = [("prep_resize", (migration, instance, BIGGER, bigger)),
             ("resize_instance", (migration, instance)),
             ("finish_resize", (migration, instance)),
             ("confirm_resize", (migration, instance))]
    for method, args in steps:
        once = getattr(c.rpc, method)(agent.name, *args)
        dump = agent.store_dump()
        twice = getattr(c.rpc, method)(agent.name, *args)
        assert twice == once, method
        assert agent.store_dump() == dump, method

    gone = c.rpc.delete_instance(agent.name, instance)
    assert c.rpc.delete_instance(agent.name, instance) == gone
    assert c.rpc.get_host_info(agent.name)["assignments"] == 0


def test_calls_work_again_soon_after_the_broker_returns(tmp_path, placement,
                                                         private_rabbitmq):
    """On a RabbitMQ node of the test's own: the machine's broker serves
    other tests and users, and is never stopped."""
    agent = AgentDaemon(tmp_path, placement.url)
    agent.conf = agent.host.write_conf({"transport_url": private_rabbitmq.url,
                                        "update_interval": 2})
    api = ComputeAgentAPI(load_config(["--config-file", str(agent.conf)]), timeout=30)
    try:
        agent.start(api)
        instance = str(uuid.uuid4())
        wanted = agent.allocations()
        put_allocations(placement.url, instance, wanted)
        built = api.build_instance(agent.name, instance, SPEC, wanted)
        private_rabbitmq.stop_app()
        try:
            time.sleep(2)  # an outage of 2 s, which the agent must outlive
        finally:
            private_rabbitmq.start_app()
        back = time.monotonic()

        def answers() -> bool:
            try:
                return bool(api._call(agent.name, "get_host_info", timeout=3))
            except Exception:
                return False

        wait_for(answers, timeout=30, interval=0.5)
        assert time.monotonic() - back < 30
        assert api.get_instance(agent.name, instance) == built
        assert agent.proc.poll() is None
    finally:
        agent.stop()
        api.close()


# Well-formed allocations, so that each payload below has one fault only.
ALLOCATED = {str(uuid.uuid4()): {"resources": {"VCPU": 1}}}
BAD_PAYLOADS = [
    ("build_instance", {"spec": SPEC, "allocations": ALLOCATED}, "instance_uuid"),
    ("build_instance", {"instance_uuid": 42, "spec": SPEC, "allocations": ALLOCATED},
     "instance_uuid"),
    ("build_instance", {"instance_uuid": "x" * 100_000, "spec": SPEC, "allocations": ALLOCATED},
     "instance_uuid"),
    ("build_instance", {"instance_uuid": str(uuid.uuid4()),
                        "spec": {**SPEC, "name": "n" * 10_000}, "allocations": ALLOCATED},
     "spec.name"),
    ("build_instance", {"instance_uuid": str(uuid.uuid4()),
                        "spec": {"name": "x", "vcpus": "two", "memory_mb": 1},
                        "allocations": ALLOCATED}, "spec.vcpus"),
    ("build_instance", {"instance_uuid": str(uuid.uuid4()), "spec": SPEC,
                        "allocations": {str(uuid.uuid4()): {"resources": {"VCPU": -1}}}},
     "resources.VCPU"),
    ("build_instance", {"instance_uuid": str(uuid.uuid4()), "spec": SPEC,
                        "allocations": {str(uuid.uuid4()): {"resources": {"VCPU": 10**12}}}},
     "resources.VCPU"),
    ("prep_resize", {"migration_uuid": "nope", "instance_uuid": str(uuid.uuid4()),
                     "spec": SPEC, "allocations": ALLOCATED}, "migration_uuid"),
    ("get_instance", {"instance_uuid": str(uuid.uuid4()), "extra": 1}, "extra"),
    ("confirm_resize", {"migration_uuid": str(uuid.uuid4())}, "instance_uuid"),
]


def test_bad_payloads_name_the_field_and_change_nothing(conductor):
    c, agent = conductor, conductor.agent()
    build(c, agent)
    before = agent.store_dump()
    for method, payload, field in BAD_PAYLOADS:
        with pytest.raises(InvalidRequest) as caught:
            c.rpc._call(agent.name, method, **payload)
        assert field in str(caught.value).splitlines()[0], (method, payload)

    # Well-formed but wrong for this host: unknown classes, providers that
    # are not ours, more than the host has (each with the vCPUs and memory
    # the spec asks, which the next test is about).
    cell = agent.provider("numa_1")
    fitting = {"VCPU": SPEC["vcpus"], "MEMORY_MB": SPEC["memory_mb"]}
    for spec, allocations, field in [
            (SPEC, {cell: {"resources": {**fitting, "CUSTOM_NO_SUCH_THING": 1}}},
             "resources"),
            (SPEC, {str(uuid.uuid4()): {"resources": fitting}}, "allocations."),
            ({**SPEC, "vcpus": 4096}, {cell: {"resources": {**fitting, "VCPU": 4096}}},
             "resources.VCPU")]:
        with pytest.raises(InvalidRequest) as caught:
            c.rpc.build_instance(agent.name, str(uuid.uuid4()), spec, allocations)
        assert field in str(caught.value).splitlines()[0]
    with pytest.raises(ClaimFailed):
        c.rpc.build_instance(agent.name, str(uuid.uuid4()), SPEC,
                             {cell: {"resources": fitting},
                              agent.provider(PF.upper()): {"resources": {"SRIOV_NET_VF": 2}}})
    assert agent.store_dump() == before


def test_bug_a_spec_unlike_its_allocations_is_refused_naming_both(conductor):
    """vcpus 1 with VCPU 3 and memory_mb 256 with MEMORY_MB 8000 were
    accepted: the guest defined from the spec, Placement counting other
    amounts."""
    c, agent = conductor, conductor.agent()
    before = agent.store_dump()
    instance = str(uuid.uuid4())
    spec = {"name": "guest", "vcpus": 1, "memory_mb": 256}
    for allocations, message in [
            (agent.allocations(vcpus=3, memory_mb=256),
             "spec.vcpus: must equal what the allocations carry on this host's "
             "providers: VCPU plus PCPU 3 (value: 1)"),
            (agent.allocations(vcpus=1, memory_mb=8000),
             "spec.memory_mb: must equal what the allocations carry on this host's "
             "providers: MEMORY_MB 8000 (value: 256)"),
            (agent.allocations(vcpus=3, memory_mb=8000),
             "spec.vcpus, spec.memory_mb: must equal what the allocations carry on this "
             "host's providers: VCPU plus PCPU 3, MEMORY_MB 8000 (value: 1, 256)")]:
        with pytest.raises(InvalidRequest) as caught:
            c.rpc.build_instance(agent.name, instance, spec, allocations)
        assert str(caught.value).splitlines()[0] == message
    # And a move's claim, the same way.
    built, _ = build(c, agent)
    with pytest.raises(InvalidRequest, match="^spec.vcpus: must equal"):
        c.rpc.prep_resize(agent.name, str(uuid.uuid4()), built, BIGGER,
                          agent.allocations(vcpus=2, memory_mb=2048))
    assert c.rpc.get_instance(agent.name, built)["migrations"] == []
    assert before != agent.store_dump()  # the build above, and nothing else
    with pytest.raises(NoSuchInstance):
        c.rpc.get_instance(agent.name, instance)


def cpus_and_memory(agent: AgentDaemon, vcpus: int = 2, memory_mb: int = 1024) -> dict:
    """Allocations of CPUs and memory only: no device a live migration's
    source would refuse to move."""
    return {agent.provider("numa_1"): {"resources": {"VCPU": vcpus, "MEMORY_MB": memory_mb}}}


def test_bug_a_retry_asking_something_else_is_refused_naming_what_differs(conductor):
    """A build retried with other allocations or another spec, a revert
    after a confirm (and the reverse), a second announcement of a live
    migration naming another destination: each got the first call's answer
    and no error."""
    c, agent = conductor, conductor.agent()
    instance, built = build(c, agent)
    assert c.rpc.build_instance(agent.name, instance, SPEC, agent.allocations()) == built
    dump = agent.store_dump()
    for spec, allocations, fields in [
            (SPEC, agent.allocations(vfs=2), ["allocations"]),
            ({**SPEC, "name": "other"}, agent.allocations(), ["spec.name"]),
            (BIGGER, agent.allocations(vcpus=4, memory_mb=2048),
             ["allocations", "spec.memory_mb", "spec.vcpus"])]:
        with pytest.raises(RetryMismatch) as caught:
            c.rpc.build_instance(agent.name, instance, spec, allocations)
        assert caught.value.fields == fields
        assert str(caught.value).splitlines()[0] == (
            f"instance {instance} was built here by an earlier call; this call differs "
            f"from that one in {', '.join(fields)}: it is not its retry, and nothing was "
            "changed (another request takes another uuid)")
    assert agent.store_dump() == dump

    # A move claim retried with another flavor.
    confirmed = same_host_resize_to_finish(c, agent, instance)
    with pytest.raises(RetryMismatch) as caught:
        c.rpc.prep_resize(agent.name, confirmed, instance, SPEC, agent.allocations())
    assert caught.value.fields == ["allocations", "spec.memory_mb", "spec.vcpus"]

    # A move ends once: confirmed, it is not reverted; reverted, not confirmed.
    c.rpc.confirm_resize(agent.name, confirmed, instance)
    c.forget(confirmed)
    dump = agent.store_dump()
    with pytest.raises(RetryMismatch) as caught:
        c.rpc.revert_resize(agent.name, confirmed, instance)
    assert str(caught.value).startswith(
        f"move {confirmed} was confirmed here (confirm_resize), not reverted; this "
        "call differs from that one in method:")
    assert agent.store_dump() == dump
    reverted = str(uuid.uuid4())
    move_allocations(c.placement_client, instance, reverted)
    c.schedule(instance, agent.allocations())
    c.rpc.prep_resize(agent.name, reverted, instance, SPEC, agent.allocations())
    c.rpc.revert_resize(agent.name, reverted, instance)
    dump = agent.store_dump()
    with pytest.raises(RetryMismatch, match=f"^move {reverted} was reverted here "
                       r"\(revert_resize\), not confirmed"):
        c.rpc.confirm_resize(agent.name, reverted, instance)
    assert agent.store_dump() == dump

    # A live migration announced to one destination, then to another (API
    # 1.4, which the pinned client may not send).
    newest = ComputeAgentAPI(load_config(["--config-file", str(agent.conf)]), timeout=30)
    try:
        moving = str(uuid.uuid4())
        wanted = cpus_and_memory(agent)
        c.schedule(moving, wanted)
        newest.build_instance(agent.name, moving, SPEC, wanted)
        migration = str(uuid.uuid4())
        announced = newest.check_can_live_migrate_source(agent.name, migration, moving,
                                                         "host-b")
        assert newest.check_can_live_migrate_source(agent.name, migration, moving,
                                                    "host-b") == announced
        dump = agent.store_dump()
        with pytest.raises(RetryMismatch) as caught:
            newest.check_can_live_migrate_source(agent.name, migration, moving, "host-c")
        assert caught.value.fields == ["destination_host"]
        assert agent.store_dump() == dump
    finally:
        newest.close()


def test_bug_a_confirm_after_a_revert_no_longer_destroys_the_sources_guest(conductor):
    """A cross-host resize reverted on both sides, then confirmed at the
    source: the confirm was answered "confirmed", having destroyed the guest
    the revert had just restarted there."""
    c = conductor
    source, dest = c.agent("a"), c.agent("b")
    instance, built = build(c, source)
    migration = str(uuid.uuid4())
    move_allocations(c.placement_client, instance, migration)
    c.schedule(instance, dest.allocations())
    c.rpc.prep_resize(dest.name, migration, instance, SPEC, dest.allocations())
    c.rpc.resize_instance(source.name, migration, instance)
    c.rpc.finish_resize(dest.name, migration, instance)
    c.rpc.revert_resize(dest.name, migration, instance)
    c.rpc.revert_resize(source.name, migration, instance)
    assert c.rpc.get_instance(source.name, instance)["running"]
    dump = source.store_dump()
    with pytest.raises(RetryMismatch, match=f"^move {migration} was reverted here"):
        c.rpc.confirm_resize(source.name, migration, instance)
    assert c.rpc.get_instance(source.name, instance)["running"]
    assert source.store_dump() == dump


def a_resizing_and_b_built(c, agent: AgentDaemon) -> tuple[str, str, str]:
    """Instance A built and resized on ``agent`` up to finish_resize, and
    instance B built beside it: A's, B's and the move's uuids."""
    a, _ = build(c, agent)
    b = str(uuid.uuid4())
    c.schedule(b, cpus_and_memory(agent))
    c.rpc.build_instance(agent.name, b, SPEC, cpus_and_memory(agent))
    return a, b, same_host_resize_to_finish(c, agent, a)


def test_bug_prep_resize_of_another_instances_move_is_refused(conductor):
    """prep_resize(migration_uuid=M, instance_uuid=B), M instance A's move,
    answered OK with no assignments and claimed nothing."""
    c, agent = conductor, conductor.agent()
    a, b, migration = a_resizing_and_b_built(c, agent)
    dump = agent.store_dump()
    with pytest.raises(InvalidRequest) as caught:
        c.rpc.prep_resize(agent.name, migration, b, BIGGER,
                          agent.allocations(vcpus=4, memory_mb=2048))
    assert str(caught.value).splitlines()[0] == (
        f"instance_uuid: migration {migration} moves instance {a} (value: '{b}')")
    assert agent.store_dump() == dump


def test_bug_an_instance_and_a_move_never_share_a_uuid(conductor):
    """build_instance with the uuid of a move open here was accepted: one
    consumer both an instance and a migration."""
    c, agent = conductor, conductor.agent()
    a, b, migration = a_resizing_and_b_built(c, agent)
    dump = agent.store_dump()
    with pytest.raises(InvalidRequest) as caught:
        c.rpc.build_instance(agent.name, migration, SPEC, cpus_and_memory(agent))
    assert str(caught.value).splitlines()[0] == (
        f"instance_uuid: is a move's uuid on this host; an instance and a move never "
        f"share a uuid (value: '{migration}')")
    with pytest.raises(InvalidRequest) as caught:
        c.rpc.prep_resize(agent.name, a, b, SPEC, cpus_and_memory(agent))
    assert str(caught.value).startswith("migration_uuid: is an instance's uuid on this "
                                        "host")
    with pytest.raises(InvalidRequest, match="^migration_uuid: is an instance's uuid"):
        c.rpc.resize_instance(agent.name, a, b)
    assert agent.store_dump() == dump


def test_bug_an_unknown_method_or_version_is_one_warning_line(conductor):
    """Each wrote a full ERROR traceback to the agent's log."""
    c, agent = conductor, conductor.agent()
    # A client of no version cap, which sends any version.
    newest = messaging.get_rpc_client(transport(load_config(["--config-file",
                                                            str(agent.conf)])),
                                      messaging.Target(topic=TOPIC), timeout=30)
    try:
        logged = len(agent.log.read_text().splitlines())
        with pytest.raises(messaging.RemoteError) as caught:
            c.rpc._call(agent.name, "no_such_method")
        assert caught.value.exc_type == "NoSuchMethod"
        for version in ("1.99", "2.0"):
            with pytest.raises(messaging.RemoteError) as caught:
                newest.prepare(server=agent.name, version=version).call({}, "get_host_info")
            assert caught.value.exc_type == "UnsupportedVersion"
        wait_for(lambda: len(agent.log.read_text().splitlines()) >= logged + 3,
                 timeout=10)
        new = agent.log.read_text().splitlines()[logged:]
        assert len(new) == 3, new
        assert all(" WARNING oslo_messaging.rpc.server [" in line for line in new), new
        assert new[0].endswith("RPC call refused: this agent does not serve it: "
                               "oslo_messaging.rpc.dispatcher.NoSuchMethod: Endpoint "
                               "does not support RPC method no_such_method"), new[0]
        assert new[1].endswith("UnsupportedVersion: Endpoint does not support RPC "
                               "version 1.99. Attempted method: get_host_info"), new[1]
    finally:
        newest.transport.cleanup()


def twice(c, method: str, host: str, *args):
    """Send a call twice; both answers must agree."""
    once = getattr(c.rpc, method)(host, *args)
    assert getattr(c.rpc, method)(host, *args) == once, method
    return once


def test_live_migration_rollback_and_evacuation_calls_twice(conductor):
    c = conductor
    source, dest = c.agent("a"), c.agent("b")
    instance, built = build(c, source)

    # A live migration: the destination's pre-check refuses its plain VF
    # (no device_spec says live_migratable), claiming nothing.
    # And 1.0's live_migrate (records only, no guest moved) is refused,
    # naming what it lacks; the source is unchanged.
    refused = str(uuid.uuid4())
    move_allocations(c.placement_client, instance, refused)
    c.schedule(instance, dest.allocations())
    with pytest.raises(LiveMigrationRefused, match="refused on the destination: "
                       "destination vf .* does not say live_migratable"):
        c.rpc.check_can_live_migrate_destination(dest.name, refused, instance,
                                                 SPEC, dest.allocations())
    assert c.rpc.get_host_info(dest.name)["assignments"] == 0
    before = source.store_dump()
    with pytest.raises(InvalidRequest, match="destination: missing: since API 1.2"):
        c.rpc._move("live_migrate", source.name, refused, instance)
    assert source.store_dump() == before
    move_allocations(c.placement_client, refused, instance, "INSTANCE")
    assert devices(c.rpc.get_instance(source.name, instance)) == devices(built)

    # The source dies; the instance is rebuilt on the other host.
    evacuation = str(uuid.uuid4())
    c.forget(instance)
    c.schedule(instance, dest.allocations())
    rebuilt = twice(c, "rebuild_instance", dest.name, evacuation, instance, SPEC,
                    dest.allocations())
    assert rebuilt["running"] and devices(rebuilt)["vf"]
    assert {"uuid": evacuation, "kind": "evacuation", "role": "destination",
            "state": "confirmed"} in rebuilt["migrations"]


def test_a_client_pinned_at_1_0_is_refused_a_1_1_call_before_sending_it(conductor):
    """The N-1 case: the conductor fixture's client is pinned at 1.0 and
    every test above drives today's server with it; the 1.1 call is refused
    in the client, and the client at the newest version makes it."""
    c, agent = conductor, conductor.agent()
    instance, _ = build(c, agent)
    assert c.rpc.get_provider_tree(agent.name)
    with pytest.raises(VersionCapped) as caught:
        c.rpc.list_instances(agent.name)
    message = str(caught.value)
    assert "list_instances" in message and "1.1" in message and "1.0" in message

    newest = ComputeAgentAPI(load_config(["--config-file", str(agent.conf)]), timeout=30)
    try:
        assert newest.list_instances(agent.name) == [
            {"uuid": instance, "name": SPEC["name"], "state": "active",
             "migration_uuid": None}]
    finally:
        newest.close()


def test_endpoint_attributes_are_not_rpc_methods(conductor):
    agent = conductor.agent()
    for name in ("agent", "_agent", "target", "no_such_method"):
        with pytest.raises(messaging.RemoteError) as caught:
            conductor.rpc._call(agent.name, name)
        assert caught.value.exc_type == "NoSuchMethod", (name, caught.value)


def same_host_resize_to_finish(c, agent: AgentDaemon, instance: str) -> str:
    """A same-host resize of ``instance`` up to finish_resize; its uuid."""
    migration = str(uuid.uuid4())
    move_allocations(c.placement_client, instance, migration)
    bigger = agent.allocations(vcpus=4, memory_mb=2048)
    c.schedule(instance, bigger)
    c.rpc.prep_resize(agent.name, migration, instance, BIGGER, bigger)
    c.rpc.resize_instance(agent.name, migration, instance)
    c.rpc.finish_resize(agent.name, migration, instance)
    return migration


def test_a_uuid_with_a_trailing_newline_is_refused_and_confirms_nothing(conductor):
    c, agent = conductor, conductor.agent()
    instance, _ = build(c, agent)
    migration = same_host_resize_to_finish(c, agent, instance)
    before = agent.store_dump()
    for args, field in [((migration, instance + "\n"), "instance_uuid"),
                        ((migration + "\n", instance), "migration_uuid")]:
        with pytest.raises(InvalidRequest) as caught:
            c.rpc.confirm_resize(agent.name, *args)
        assert str(caught.value).startswith(f"{field}: "), caught.value
    assert agent.store_dump() == before
    assert c.rpc.get_instance(agent.name, instance)["migrations"] == [
        {"uuid": migration, "kind": "resize", "role": "both", "state": "finished"}]


def test_upper_case_uuids_are_accepted_and_used_in_lower_case(conductor):
    c, agent = conductor, conductor.agent()
    instance = str(uuid.uuid4())
    wanted = agent.allocations()
    c.schedule(instance, wanted)
    built = c.rpc.build_instance(agent.name, instance.upper(), SPEC,
                                 {p.upper(): a for p, a in wanted.items()})
    assert built["uuid"] == instance
    assert {a["state"] for a in built["assignments"]} == {"claimed"}
    assert {a["provider_uuid"] for a in built["assignments"]} == set(wanted)
    assert c.rpc.get_instance(agent.name, instance.upper()) == built

    migration = str(uuid.uuid4())
    move_allocations(c.placement_client, instance, migration)
    bigger = agent.allocations(vcpus=4, memory_mb=2048)
    c.schedule(instance, bigger)
    c.rpc.prep_resize(agent.name, migration.upper(), instance.upper(), BIGGER,
                      {p.upper(): a for p, a in bigger.items()})
    c.rpc.resize_instance(agent.name, migration.upper(), instance.upper())
    finished = c.rpc.finish_resize(agent.name, migration.upper(), instance.upper())
    assert finished["uuid"] == instance and finished["running"]
    c.rpc.confirm_resize(agent.name, migration.upper(), instance.upper())
    c.forget(migration)
    confirmed = c.rpc.get_instance(agent.name, instance)
    assert confirmed["migrations"] == [{"uuid": migration, "kind": "resize",
                                        "role": "both", "state": "confirmed"}]
    assert {a["state"] for a in confirmed["assignments"]} == {"claimed"}
    c.rpc.delete_instance(agent.name, instance.upper())
    assert c.rpc.get_host_info(agent.name)["assignments"] == 0


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_deeply_nested_payload_is_refused_at_once(conductor):
    c, agent = conductor, conductor.agent()
    # A caller near the top of its stack (a script) can send about 990
    # levels at Python's default recursion limit; this test's own stack is
    # deeper, so the limit is raised while it sends.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 5000)
    try:
        for depth in (990, 4000):
            began = time.monotonic()
            with pytest.raises(InvalidRequest) as caught:
                c.rpc._call(agent.name, "build_instance", timeout=10,
                            instance_uuid=str(uuid.uuid4()), spec=nested(depth),
                            allocations=ALLOCATED)
            assert time.monotonic() - began < 5, depth
            assert str(caught.value).startswith("spec."), caught.value
            assert "nested deeper than" in str(caught.value).splitlines()[0]
    finally:
        sys.setrecursionlimit(limit)


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time process ``pid`` has used (proc(5):
    utime and stime, fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_map_of_200000_keys_is_refused_at_once(conductor):
    c, agent = conductor, conductor.agent()
    huge = {str(uuid.uuid4()): {"resources": {"VCPU": 1}} for _ in range(200_000)}

    def timed(method: str, error) -> tuple[float, Exception]:
        """The agent's CPU time for the call, which the machine's load (the
        suite's other workers) does not stretch as it does wall time."""
        began = cpu_seconds(agent.proc.pid)
        with pytest.raises(error) as caught:
            c.rpc._call(agent.name, method, timeout=60, instance_uuid=str(uuid.uuid4()),
                        spec=SPEC, allocations=huge)
        return cpu_seconds(agent.proc.pid) - began, caught.value

    # The same message to a method that does not exist: what carrying and
    # decoding it costs the agent.
    carried, _ = timed("no_such_method", messaging.RemoteError)
    took, refused = timed("build_instance", InvalidRequest)
    assert str(refused).splitlines()[0] == (
        "allocations: has 200000 entries, at most 64 (value: an object)")
    assert took - carried < 1, (took, carried)


def test_a_failed_store_write_reaches_the_caller_as_a_declared_error(conductor):
    c, agent = conductor, conductor.agent()
    # Another process changes the store under the running agent: the table
    # claims are written to is gone, so the next claim's write fails.
    path = Path(agent.host.dir) / "state" / "state.db"
    conn = sqlite3.connect(path)
    try:
        conn.execute("ALTER TABLE assignments RENAME TO assignments_elsewhere")
    finally:
        conn.close()
    logged = len(agent.log.read_text().splitlines())
    instance = str(uuid.uuid4())
    wanted = agent.allocations()
    c.schedule(instance, wanted)
    with pytest.raises(StoreUnavailable) as caught:
        c.rpc.build_instance(agent.name, instance, SPEC, wanted)
    assert "assignments" in str(caught.value).splitlines()[0]
    new = agent.log.read_text().splitlines()[logged:]
    assert len(new) == 1 and "build_instance" in new[0] and "ERROR" in new[0], new
