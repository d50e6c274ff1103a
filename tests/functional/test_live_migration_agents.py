"""A live migration driven by a conductor through rpcapi between two agents:
each an in-process Agent with its own host name, state directory, sysfs
tree and private libvirtd (QEMU/KVM), serving RPC over the machine's
RabbitMQ, reporting to the real Placement.

No host device may be given to a guest here, so the guest holds what QEMU
really runs and what differs per host: a dedicated CPU (CPU 0 on A, CPU 1
on B) and a pmem namespace whose "device" is a 64 MiB file in each host's
own directory (ndctl JSON names it; a regular file backs an nvdimm as a dax
device does).

The pre-check's refusals of whole devices (a VF not marked live_migratable)
run on fake-driver hosts (tests/functional/claims_world.py): no VF exists
here.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import libvirt
import pytest
import requests
from keystoneauth1 import adapter, session

from compute_agent.cmd.common import load_config
from compute_agent.conductor.live_migration import live_migrate_instance
from compute_agent.daemon.composition import compose
from compute_agent.drivers.fake import FakeNetwork
from compute_agent.drivers.libvirt.guest_xml import domain_name
from compute_agent.exception import ClaimFailed, LiveMigrationFailed, LiveMigrationRefused
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc import host_server
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.claims_world import host_dict, make_world, new_uuid, spec
from tests.functional.helpers import (
    HEADERS,
    placement_tree,
    put_allocations,
    wait_for,
    write_conf,
)

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
PMEM_BYTES = 64 << 20
PMEM_RC = "CUSTOM_PMEM_NAMESPACE_SMALL"
MARK = b"written on the source\n"


class Host:
    """One agent on one private libvirtd, with its RPC server running."""

    def __init__(self, root: Path, daemon, placement_url: str, cpu: int):
        self.daemon = daemon
        (root / "sys").mkdir(parents=True)
        self.name = f"lm-{root.name}-{uuid.uuid4().hex[:6]}"
        self.pmem_file = daemon.root / f"pmem-{self.name}"
        self.pmem_file.write_bytes(b"")
        os.truncate(self.pmem_file, PMEM_BYTES)
        ndctl = root / "ndctl.json"
        # The namespace's "character device", as the agent makes its path
        # (/dev/<chardev>), leads to the file.
        ndctl.write_text(json.dumps([{
            "dev": "namespace0.0", "mode": "devdax", "size": PMEM_BYTES,
            "name": f"ns-{root.name}", "numa_node": 0,
            "chardev": f"..{self.pmem_file}"}]))
        path = write_conf(
            root, placement_url, self.name, host_dict=None,
            DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(root / "sys"),
                     "transport_url": BROKER},
            libvirt={"connection_uri": daemon.uri, "live_migration_uri": daemon.uri,
                     "instances_path": str(root / "instances")},
            compute={"cpu_dedicated_set": str(cpu)},
            pmem={"namespaces": f"SMALL:ns-{root.name}", "ndctl_json": str(ndctl)})
        self.conf = load_config(["--config-file", str(path)])
        self.agent = compose(self.conf)
        self.agent.driver.init_host()
        assert self.agent.run_cycle().ok
        self.server = host_server.make_server(self.conf, self.agent)
        self.server.start()

    def allocations(self, url: str) -> dict:
        tree = placement_tree(url, self.agent.policy.root_uuid)
        by_class = {rc: node["uuid"] for node in tree.values()
                    for rc in node["inventories"]}
        return {by_class["PCPU"]: {"resources": {"PCPU": 1, "MEMORY_MB": 64}},
                by_class[PMEM_RC]: {"resources": {PMEM_RC: 1}}}

    def providers(self, url: str) -> set[str]:
        return {n["uuid"] for n in placement_tree(url, self.agent.policy.root_uuid).values()}

    def audit_clean(self) -> None:
        self.agent.sync.refresh()
        report = self.agent.reconcile(at_start=True, fix=False)
        assert report.consistent, report.findings

    def close(self) -> None:
        self.server.stop()
        self.server.wait()
        self.agent.driver.cleanup()
        self.agent.manager.tracker.store.close()


class Cloud:
    def __init__(self, tmp: Path, daemons, placement_url: str):
        self.url = placement_url
        self.a = Host(tmp / "a", daemons[0], placement_url, 0)
        self.b = Host(tmp / "b", daemons[1], placement_url, 1)
        self.api = ComputeAgentAPI(self.a.conf, timeout=60)
        self.placement = PlacementClient(adapter.Adapter(
            session.Session(auth=NoAuth2(placement_url)), service_type="placement"))

    def build_on_a(self) -> tuple[str, dict]:
        instance = str(uuid.uuid4())
        s = {"name": f"lm-{instance[:8]}", "vcpus": 1, "memory_mb": 64}
        wanted = self.a.allocations(self.url)
        put_allocations(self.url, instance, wanted)
        self.api.build_instance(self.a.name, instance, s, wanted)
        return instance, s

    def migrate(self, instance: str, s: dict) -> dict:
        return live_migrate_instance(self.api, self.placement, instance, self.a.name,
                                     self.b.name, s, self.b.allocations(self.url))

    def allocated_on(self, consumer: str) -> set[str]:
        return set(self.placement.get_consumer_allocations(consumer)["allocations"])

    def close(self) -> None:
        self.api.close()
        for h in (self.a, self.b):
            h.close()


@pytest.fixture(scope="module")
def cloud(tmp_path_factory, placement, two_private_libvirtds):
    c = Cloud(tmp_path_factory.mktemp("agents"), two_private_libvirtds, placement.url)
    yield c
    c.close()


def delete_everywhere(cloud: Cloud, instance: str) -> None:
    for h in (cloud.a, cloud.b):
        cloud.api.delete_instance(h.name, instance)
    requests.delete(f"{cloud.url}/allocations/{instance}", headers=HEADERS, timeout=10)


def devices_of(view: dict) -> dict[str, str]:
    return {a["kind"]: a["device_id"] for a in view["assignments"]
            if a["kind"] in ("pcpu", "pmem")}


def test_a_running_guest_moves_to_b_with_bs_devices_and_a_keeps_nothing(cloud):
    a, b = cloud.a, cloud.b
    instance, s = cloud.build_on_a()
    with open(a.pmem_file, "r+b") as f:  # the guest's persistent memory
        f.write(MARK)
    try:
        arrived = cloud.migrate(instance, s)

        # B runs it, live, on B's CPU and B's file, with B's assignments.
        assert arrived["running"]
        assert devices_of(arrived) == {"pcpu": "1", "pmem": "ns-b"}
        live = b.daemon.domain(instance).XMLDesc(0)
        assert "cpuset='1'" in live and "cpuset='0'" not in live
        assert str(b.pmem_file) in live and str(a.pmem_file) not in live
        on_b = b.daemon.domain(instance)
        assert on_b.isActive() and on_b.isPersistent()
        assert {x["id"] for x in arrived["assignments"]} <= {
            x["id"] for x in cloud.api.get_instance(b.name, instance)["assignments"]}
        with open(b.pmem_file, "rb") as f:
            assert f.read(len(MARK)) == MARK  # the guest's memory came along
        # A holds nothing: no domain, no instance, no assignment.
        assert a.daemon.domain(instance) is None
        info = cloud.api.get_host_info(a.name)
        assert (info["instances"], info["assignments"]) == (0, 0)
        # Placement: the instance's allocations on B's providers only.
        assert cloud.allocated_on(instance) <= b.providers(cloud.url)
        assert cloud.allocated_on(instance)
        a.audit_clean()
        b.audit_clean()

        # A second guest has nowhere to go on B: its only dedicated CPU and
        # namespace are taken. The destination refuses; nothing is claimed.
        other, s2 = cloud.build_on_a()
        before = cloud.api.get_host_info(b.name)
        with pytest.raises(ClaimFailed):
            cloud.api.check_can_live_migrate_destination(
                b.name, str(uuid.uuid4()), other, s2, b.allocations(cloud.url))
        assert cloud.api.get_host_info(b.name) == before
        assert a.daemon.domain(other).isActive()
        delete_everywhere(cloud, other)
    finally:
        delete_everywhere(cloud, instance)


def test_a_migration_whose_destination_dies_midway_leaves_it_on_a(cloud):
    a, b = cloud.a, cloud.b
    instance, s = cloud.build_on_a()
    before = cloud.api.get_instance(a.name, instance)
    a_allocations = cloud.allocated_on(instance)
    conn = libvirt.open(a.daemon.uri)
    dom = conn.lookupByUUIDString(instance)
    dom.migrateSetMaxSpeed(1, 0)  # 1 MiB/s: still under way when B's QEMU dies
    raised: list[Exception] = []

    def migrate() -> None:
        try:
            cloud.migrate(instance, s)
        except Exception as exc:  # handed to the test's thread
            raised.append(exc)

    mover = threading.Thread(target=migrate)
    mover.start()
    try:
        def mid_way() -> bool:
            assert mover.is_alive()
            return (b.daemon.domain(instance) is not None
                    and dom.jobStats().get("memory_processed", 0) > 0)
        wait_for(mid_way, timeout=30, interval=0.05)
        os.kill(b.daemon.qemu_pid(domain_name(instance)), signal.SIGKILL)
        mover.join(60)
        assert not mover.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], LiveMigrationFailed), raised
        assert raised[0].cause == "aborted"
        assert "still runs on the source" in str(raised[0])

        # B holds nothing; A runs it with its devices; allocations on A.
        assert b.daemon.domain(instance) is None
        info = cloud.api.get_host_info(b.name)
        assert (info["instances"], info["assignments"]) == (0, 0)
        after = cloud.api.get_instance(a.name, instance)
        assert after["running"] and devices_of(after) == devices_of(before)
        assert {x["id"] for x in after["assignments"]} == {
            x["id"] for x in before["assignments"]}
        assert a.daemon.domain(instance).isActive()
        assert cloud.allocated_on(instance) == a_allocations
        a.audit_clean()
        b.audit_clean()
    finally:
        conn.close()
        delete_everywhere(cloud, instance)


# --- the pre-check's refusal of whole devices, on fake-driver hosts ------------

VF_AND_GPU = {"pf": {"SRIOV_NET_VF": 1}, "gpu": {"VGPU": 1},
              "numa0": {"VCPU": 1, "MEMORY_MB": 512}}


def fake_pair(tmp_path: Path, a_migratable: bool, b_migratable: bool):
    network = FakeNetwork()
    return (make_world(tmp_path / "a", "hosta", network=network,
                       live_migratable=a_migratable),
            # No mdev on B yet: the one it claims is made for the move.
            make_world(tmp_path / "b", "hostb", host_dict(existing_mdev=False),
                       network=network, live_migratable=b_migratable))


def test_a_plain_vf_is_refused_by_the_destination_before_anything_is_claimed(tmp_path):
    a, b = fake_pair(tmp_path, a_migratable=True, b_migratable=False)
    inst = new_uuid()
    a.manager.build_instance(inst, spec(), a.allocations(VF_AND_GPU))
    before = b.store.dump(), b.existing_mdevs()
    with pytest.raises(LiveMigrationRefused) as caught:
        b.manager.check_can_live_migrate_destination(new_uuid(), inst, spec(),
                                                     b.allocations(VF_AND_GPU))
    assert str(caught.value).startswith(
        f"live migration of instance {inst} refused on the destination: "
        "destination vf 0000:81:")
    assert "does not say live_migratable" in str(caught.value)
    assert b.live() == [] and inst not in b.instances()
    assert b.existing_mdevs() == before[1]


def test_a_plain_vf_is_refused_by_the_source_which_keeps_everything(tmp_path):
    a, b = fake_pair(tmp_path, a_migratable=False, b_migratable=True)
    inst, mig = new_uuid(), new_uuid()
    a.manager.build_instance(inst, spec(), a.allocations(VF_AND_GPU))
    held = a.store.dump()
    answer = b.manager.check_can_live_migrate_destination(mig, inst, spec(),
                                                          b.allocations(VF_AND_GPU))
    # libvirt's rule: the destination's mdev exists before the guest moves.
    mdev = next(d["device_id"] for d in answer["devices"] if d["kind"] == "mdev")
    assert b.existing_mdevs() == {mdev}
    with pytest.raises(LiveMigrationRefused, match="refused on the source: source vf"):
        a.manager.live_migrate(mig, inst, {k: answer[k]
                                           for k in ("claimed", "migration_uri")})
    assert a.store.dump() == held and a.driver.guest_state(inst).running
    b.manager.rollback_live_migration_at_destination(mig, inst)
    assert b.live() == [] and mdev not in b.existing_mdevs()


def test_both_ends_marking_the_vf_migratable_move_it(tmp_path):
    a, b = fake_pair(tmp_path, a_migratable=True, b_migratable=True)
    inst, mig = new_uuid(), new_uuid()
    a.manager.build_instance(inst, spec(), a.allocations(VF_AND_GPU))
    answer = b.manager.check_can_live_migrate_destination(mig, inst, spec(),
                                                          b.allocations(VF_AND_GPU))
    a.manager.live_migrate(mig, inst, {k: answer[k] for k in ("claimed", "migration_uri")})
    assert a.live() == [] and a.driver.guest_state(inst) is None
    arrived = b.manager.post_live_migration_at_destination(mig, inst)
    assert arrived["running"]
    moved = {d["assignment_id"] for d in answer["devices"]}
    assert b.driver.guest_state(inst).live == moved
    assert moved <= {x["id"] for x in arrived["assignments"]}
    # Rolling back a guest that runs at the destination is refused.
    with pytest.raises(Exception, match="settled here"):
        b.manager.rollback_live_migration_at_destination(mig, inst)


# --- the source's answer to live_migrate lost --------------------------------------

def test_bug_a_live_migration_with_a_lost_answer_was_rolled_back_at_the_destination(cloud, caplog):
    """The conductor's live_migrate call gets no answer in time (its timeout
    is short, the source's migration slowed to 1 MiB/s by libvirt), while
    the source goes on migrating. The conductor asks the source again
    instead of rolling the destination back (which would free B's devices
    under the arriving guest), and settles the move once it is done."""
    a, b = cloud.a, cloud.b
    instance, s = cloud.build_on_a()
    conn = libvirt.open(a.daemon.uri)
    dom = conn.lookupByUUIDString(instance)
    dom.migrateSetMaxSpeed(1, 0)
    impatient = ComputeAgentAPI(a.conf, timeout=1)
    done: dict = {}

    def migrate() -> None:
        try:
            done["arrived"] = live_migrate_instance(
                impatient, cloud.placement, instance, a.name, b.name, s,
                b.allocations(cloud.url), outcome_wait=90, ask_pause=0.5)
        except Exception as exc:  # handed to the test's thread
            done["error"] = exc

    mover = threading.Thread(target=migrate)
    mover.start()
    try:
        def under_way() -> bool:
            assert mover.is_alive()
            return dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE
        wait_for(under_way, timeout=30, interval=0.05)
        started = time.monotonic()
        # Until the conductor's call has timed out (it says so as it asks
        # again), or it gave up.
        wait_for(lambda: not mover.is_alive() or any("NoAnswer" in r.getMessage()
                                                     for r in caplog.records),
                 timeout=30, interval=0.05)
        if mover.is_alive():
            # Still under way: the answer really was lost, not merely slow.
            assert dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE, \
                f"the migration ended within {time.monotonic() - started:.1f}s"
            dom.migrateSetMaxSpeed(8 << 10, 0)  # now let it finish
        mover.join(120)
        assert not mover.is_alive()
        assert "error" not in done, done.get("error")
        assert done["arrived"]["running"]

        # The guest runs once, on B, with B's claim settled; A holds nothing.
        assert a.daemon.domain(instance) is None
        assert b.daemon.domain(instance).isActive()
        info = cloud.api.get_host_info(a.name)
        assert (info["instances"], info["assignments"]) == (0, 0)
        on_b = cloud.api.get_instance(b.name, instance)
        assert devices_of(on_b) == {"pcpu": "1", "pmem": "ns-b"}
        assert {x["state"] for x in on_b["assignments"]} == {"claimed"}
        assert [m["state"] for m in on_b["migrations"]] == ["confirmed"]
        devices = [(x["kind"], x["device_id"]) for x in on_b["assignments"]]
        assert len(devices) == len(set(devices))
        # Placement: the instance on B's providers only, the migration gone.
        assert cloud.allocated_on(instance) and \
            cloud.allocated_on(instance) <= b.providers(cloud.url)
        assert not cloud.allocated_on(
            next(m["uuid"] for m in on_b["migrations"]))
        a.audit_clean()
        b.audit_clean()
    finally:
        mover.join(120)
        impatient.close()
        conn.close()
        delete_everywhere(cloud, instance)
