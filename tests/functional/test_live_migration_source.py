"""The live migration's source is told first (RPC API 1.4), and
``compute-agent-ctl live-migrate``: two in-process agents (their own host
names, state directories and fake hypervisors, which reach each other as
libvirtds on one network do), serving RPC over the machine's RabbitMQ and
reporting to the real Placement. ctl runs as the operator runs it, in a
subprocess. (A real QEMU guest's live migration between two libvirtds:
test_live_migration_agents.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from keystoneauth1 import adapter, session

from compute_agent.claims.model import MigrationState
from compute_agent.cmd.common import load_config
from compute_agent.conductor.live_migration import _write_allocations
from compute_agent.daemon import composition
from compute_agent.daemon.composition import compose
from compute_agent.drivers.fake import FakeDriver, FakeNetwork
from compute_agent.placement.allocations import move_allocations
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc import host_server
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.helpers import placement_tree, put_allocations, write_conf

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}
MEMORY_MB = 1024


class Host:
    """One agent, restartable: its fake hypervisor outlives the agent, as a
    host's libvirtd and guests outlive a restart of the agent."""

    def __init__(self, root: Path, placement_url: str, network: FakeNetwork):
        self.name = f"lms-{root.name}-{uuid.uuid4().hex[:6]}"
        path = write_conf(root, placement_url, self.name, HOST,
                          DEFAULT={"transport_url": BROKER})
        self.conf = load_config(["--config-file", str(path)])
        self.driver = FakeDriver(HOST, f"{self.name}-boot", network=network,
                                 uri=f"fake://{self.name}")
        self.start()

    def start(self) -> None:
        """The agent's own start-up: first cycle, store aligned, start-up
        reconciliation (fixing), then RPC."""
        original = composition.load_driver
        composition.load_driver = lambda conf: self.driver
        try:
            self.agent = compose(self.conf)
        finally:
            composition.load_driver = original
        self.start_report = None
        reconcile = self.agent.reconcile

        def recorded(at_start, fix=True):
            report = reconcile(at_start, fix)
            if at_start:
                self.start_report = report
            return report
        self.agent.reconcile = recorded
        self.agent.start()
        self.server = host_server.make_server(self.conf, self.agent)
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.server.wait()
        self.agent.stop()
        self.agent.manager.tracker.store.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def allocations(self, url: str) -> dict:
        tree = placement_tree(url, self.agent.policy.root_uuid)
        by_class = {rc: node["uuid"] for node in tree.values()
                    for rc in node["inventories"]}
        # One provider may have both (the root, on a host without NUMA
        # providers): each class is added to its provider's resources.
        out: dict = {}
        for rc, amount in (("VCPU", 1), ("MEMORY_MB", MEMORY_MB)):
            out.setdefault(by_class[rc], {"resources": {}})["resources"][rc] = amount
        return out

    def providers(self, url: str) -> set[str]:
        return {n["uuid"] for n in placement_tree(url, self.agent.policy.root_uuid).values()}

    def audit(self) -> dict:
        self.agent.sync.refresh()
        return self.agent.reconcile(at_start=True, fix=False).as_dict()


class Cloud:
    def __init__(self, tmp: Path, placement_url: str):
        self.url = placement_url
        network = FakeNetwork()
        self.a = Host(tmp / "a", placement_url, network)
        self.b = Host(tmp / "b", placement_url, network)
        self.api = ComputeAgentAPI(self.a.conf, timeout=30)
        self.placement = PlacementClient(adapter.Adapter(
            session.Session(auth=NoAuth2(placement_url)), service_type="placement"))

    def build_on_a(self) -> str:
        instance = str(uuid.uuid4())
        wanted = self.a.allocations(self.url)
        put_allocations(self.url, instance, wanted)
        self.api.build_instance(self.a.name, instance,
                                {"name": f"lms-{instance[:8]}", "vcpus": 1,
                                 "memory_mb": MEMORY_MB}, wanted)
        return instance

    def allocated_on(self, consumer: str) -> set[str]:
        return set(self.placement.get_consumer_allocations(consumer)["allocations"])

    def ctl(self, *args, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "compute_agent.cmd.ctl", "--config-file",
             str(Path(self.a.conf.config_file[0])), "--timeout", str(timeout), *args],
            capture_output=True, text=True, timeout=120)

    def close(self) -> None:
        self.api.close()
        for h in (self.a, self.b):
            h.stop()


@pytest.fixture
def cloud(tmp_path, placement, services):
    c = Cloud(tmp_path, placement.url)
    yield c
    c.close()


CLEAN = {"consistent": True, "findings": [], "unknown": []}
# A migration that takes longer than ctl's --timeout plus its 5 s grace.
CTL_TIMEOUT = 3
SLOW_MIGRATION_SECONDS = 12


def error_line(done: subprocess.CompletedProcess) -> str:
    """A refusal: exit 1, one line on stderr after the program's name
    (run as ``python -m compute_agent.cmd.ctl``, so that this worktree's code runs)."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    return line.split(": ", 1)[1]


def test_ctl_live_migrate_moves_the_instance_and_refuses_what_cannot_move(cloud):
    a, b = cloud.a, cloud.b
    instance = cloud.build_on_a()

    done = cloud.ctl("live-migrate", instance, "--target", b.name, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["instance"], answer["source"], answer["destination"],
            answer["running"]) == (instance, a.name, b.name, True)
    # The work happened: the guest runs on B, A holds nothing of it, and
    # Placement has the instance on B's providers only, no migration left.
    assert b.driver.guest_is_running(instance) and instance not in a.driver.guests
    assert not a.agent.manager.tracker.knows(instance)
    assert cloud.allocated_on(instance) <= b.providers(cloud.url)
    assert cloud.allocated_on(answer["migration"]) == set()
    assert a.agent.manager.tracker.migration(answer["migration"]).state \
        is MigrationState.CONFIRMED
    assert a.audit() == CLEAN and b.audit() == CLEAN

    # Human output: one line naming both hosts.
    back = cloud.ctl("live-migrate", instance, "--target", a.name)
    assert back.returncode == 0, back.stderr
    assert back.stdout.strip().startswith(
        f"instance {instance}  live-migrated from {b.name} to {a.name}  migration ")
    assert a.driver.guest_is_running(instance)

    # Refused by the source: a stopped guest cannot live-migrate. Nothing
    # changed anywhere: Placement, both stores.
    a.driver.power_off(instance)
    held = cloud.allocated_on(instance)
    moves = dict(a.agent.manager.tracker.snapshot()[2])
    refused = cloud.ctl("live-migrate", instance, "--target", b.name)
    assert refused.stdout == ""
    assert error_line(refused) == (
        f"instance_uuid: its guest does not run here; a live "
        f"migration moves a running guest (value: '{instance}')")
    assert cloud.allocated_on(instance) == held
    assert a.agent.manager.tracker.snapshot()[2] == moves
    assert not b.agent.manager.tracker.knows(instance)

    # Refused before any agent is asked: its own host, an unknown host.
    same = cloud.ctl("live-migrate", instance, "--target", a.name, "--json")
    assert same.returncode == 1
    assert json.loads(same.stdout)["error"] == (
        f"--target: {a.name} is the instance's host already")
    unknown = cloud.ctl("live-migrate", instance, "--target", "no-such-host")
    assert error_line(unknown) == "--target: no-such-host is no compute host in Placement"


def test_ctl_live_migrate_waits_out_a_migration_longer_than_its_timeout(cloud):
    """--timeout bounds each answer: a migration that takes longer is asked
    after (the conductor's outcome wait) until the source says it is done,
    not given up at --timeout plus 5 s with the move left open."""
    a, b = cloud.a, cloud.b
    instance = cloud.build_on_a()
    migrate = a.driver.live_migrate

    def slow(*args, **kwargs):
        time.sleep(SLOW_MIGRATION_SECONDS)  # a migration longer than --timeout
        migrate(*args, **kwargs)
    a.driver.live_migrate = slow
    try:
        done = cloud.ctl("live-migrate", instance, "--target", b.name, "--json",
                         timeout=CTL_TIMEOUT)
    finally:
        del a.driver.live_migrate
    assert done.returncode == 0, (done.stdout, done.stderr)
    answer = json.loads(done.stdout)
    assert answer["running"] and answer["destination"] == b.name
    assert b.driver.guest_is_running(instance) and instance not in a.driver.guests
    assert cloud.allocated_on(instance) <= b.providers(cloud.url)
    assert cloud.allocated_on(answer["migration"]) == set()
    assert a.audit() == CLEAN and b.audit() == CLEAN


def test_ctl_live_migrate_from_a_source_that_does_not_answer_moves_nothing(cloud):
    """The source's agent is down: ctl says so in one line naming the
    migration; nothing changed in Placement or on either host (at most the
    source recorded the move as announced, if only its answer was lost).
    Run again with --migration once the source is back, the move goes."""
    a, b = cloud.a, cloud.b
    instance = cloud.build_on_a()
    held = cloud.allocated_on(instance)
    a.stop()
    try:
        down = cloud.ctl("live-migrate", instance, "--target", b.name, timeout=2)
    finally:
        a.start()
    line = error_line(down)
    assert line.startswith(f"no answer from {a.name} within 2s: the host may be down"), \
        line
    migration = line.rsplit("--migration ", 1)[1].split()[0]
    assert cloud.allocated_on(instance) == held
    assert cloud.allocated_on(migration) == set()
    assert a.driver.guest_is_running(instance)
    assert not b.agent.manager.tracker.knows(instance)
    assert a.audit() == CLEAN and b.audit() == CLEAN

    again = cloud.ctl("live-migrate", instance, "--target", b.name,
                      "--migration", migration, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["migration"] == migration
    assert b.driver.guest_is_running(instance) and instance not in a.driver.guests
    assert cloud.allocated_on(instance) <= b.providers(cloud.url)
    assert a.audit() == CLEAN and b.audit() == CLEAN


@pytest.mark.parametrize("outcome", ["completes", "rolls back"])
def test_a_source_restarted_after_the_swap_keeps_its_guest(cloud, outcome):
    """The conductor's steps by hand, the source's agent restarted between
    the allocation swap and live_migrate: at start-up it neither destroys
    the guest (its instance's allocations sit on B's providers) nor finds
    the migration's allocations unexplained; then the move goes on."""
    a, b, api = cloud.a, cloud.b, cloud.api
    instance, migration = cloud.build_on_a(), str(uuid.uuid4())
    spec = api.get_instance(a.name, instance)["spec"]
    wanted = b.allocations(cloud.url)
    assert api.check_can_live_migrate_source(a.name, migration, instance, b.name)[
        "state"] == "announced"
    move_allocations(cloud.placement, instance, migration)
    _write_allocations(cloud.placement, instance, migration, wanted)

    a.restart()
    assert a.start_report.findings == [], a.start_report.as_dict()
    assert a.driver.guest_is_running(instance)
    assert a.agent.manager.tracker.migration(migration).state is MigrationState.ANNOUNCED
    assert cloud.allocated_on(migration) <= a.providers(cloud.url)
    assert cloud.allocated_on(instance) <= b.providers(cloud.url)
    assert a.audit() == CLEAN

    if outcome == "completes":
        claimed = api.check_can_live_migrate_destination(b.name, migration, instance,
                                                         spec, wanted)
        api.live_migrate(a.name, migration, instance,
                         {"claimed": claimed["claimed"],
                          "migration_uri": claimed["migration_uri"]})
        api.post_live_migration_at_destination(b.name, migration, instance)
        _write_allocations(cloud.placement, migration, migration, {}, "MIGRATION")
        assert b.driver.guest_is_running(instance) and instance not in a.driver.guests
        assert cloud.allocated_on(instance) <= b.providers(cloud.url)
    else:
        move_allocations(cloud.placement, migration, instance, "INSTANCE")
        api.rollback_live_migration_at_source(a.name, migration, instance)
        assert a.driver.guest_is_running(instance)
        assert a.agent.manager.tracker.migration(migration).state \
            is MigrationState.REVERTED
        assert cloud.allocated_on(instance) <= a.providers(cloud.url)
        assert not b.agent.manager.tracker.knows(instance)
    assert cloud.allocated_on(migration) == set()
    assert a.audit() == CLEAN and b.audit() == CLEAN


def test_an_announced_move_its_conductor_left_is_ended_past_the_bound(cloud):
    """The conductor swapped the allocations and died: past
    [DEFAULT] live_migration_announced_timeout the source gives the
    migration's allocations back to the instance and ends the move; the
    guest never stopped."""
    a, b, api = cloud.a, cloud.b, cloud.api
    instance, migration = cloud.build_on_a(), str(uuid.uuid4())
    api.check_can_live_migrate_source(a.name, migration, instance, b.name)
    move_allocations(cloud.placement, instance, migration)
    _write_allocations(cloud.placement, instance, migration, b.allocations(cloud.url))

    within = a.agent.reconcile(at_start=False)
    assert within.findings == [] and cloud.allocated_on(migration)
    # The bound has passed.
    a.agent.settings = replace(a.agent.settings, live_migration_announced_timeout=0)
    report = a.agent.reconcile(at_start=False)
    assert [(f.kind, f.fixed) for f in report.findings] == [
        ("live_migration_never_started", True)], report.as_dict()
    assert a.agent.manager.tracker.migration(migration).state is MigrationState.REVERTED
    assert cloud.allocated_on(instance) <= a.providers(cloud.url)
    assert cloud.allocated_on(instance) and cloud.allocated_on(migration) == set()
    assert a.driver.guest_is_running(instance)
    assert a.audit() == CLEAN
