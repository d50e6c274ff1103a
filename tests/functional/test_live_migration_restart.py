"""A live migration's source agent killed mid-way, on real QEMU: two
compute-agent daemons on private libvirtds (test_evacuation's QemuAgent),
the real Placement and the real RabbitMQ, and a conductor that runs
rpcapi.live_migrate_instance as nova's does.

libvirt carries a peer-to-peer migration on inside libvirtd after the
process that asked for it died: the restarted agent finds its migration
still under way, and must not take libvirt's refusal of a second one for
the end of the first.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import uuid

import libvirt
from keystoneauth1 import adapter, session

from compute_agent.cmd.common import load_config
from compute_agent.conductor.live_migration import live_migrate_instance
from compute_agent.drivers.libvirt.guest_xml import domain_name
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.helpers import put_allocations, wait_for
from tests.functional.test_evacuation import SPEC, allocations_of, command, hosts, providers_of  # noqa: F401

# The conductor's calls: short, so that its asks while the source is down
# time out soon (the agent's answer is what is tested, not the wait).
CONDUCTOR_TIMEOUT = 5


def test_bug_a_source_restarted_mid_migration_rolled_back_a_guest_that_left(
        hosts, placement):
    """The conductor, its answer lost with the killed source, asked the
    restarted source again; it asked libvirt to migrate again, was refused
    ("another migration job is already running": an invalid operation, as
    for a guest that does not run), took it for "no running guest" and
    rolled the move back, while libvirt's migration took the guest to B."""
    a, b, api = hosts
    url = placement.url
    instance = str(uuid.uuid4())
    on_a = {a.cell(): {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}
    put_allocations(url, instance, on_a)
    assert api.build_instance(a.name, instance, SPEC, on_a)["running"]
    conn = libvirt.open(a.daemon.uri)
    dom = conn.lookupByUUIDString(instance)
    dom.migrateSetMaxSpeed(1, 0)  # MiB/s: still under way when A is killed

    conductor = ComputeAgentAPI(load_config(["--config-file", str(a.conf)]),
                                timeout=CONDUCTOR_TIMEOUT)
    placement_client = PlacementClient(adapter.Adapter(
        session.Session(auth=NoAuth2(url)), service_type="placement"))
    migration = str(uuid.uuid4())
    answer: dict = {}

    def migrate() -> None:
        try:
            answer["instance"] = live_migrate_instance(
                conductor, placement_client, instance, a.name, b.name, SPEC,
                {b.cell(): {"resources": {"VCPU": 1, "MEMORY_MB": 64}}},
                migration_uuid=migration, outcome_wait=120, ask_pause=0.5)
        except Exception as e:  # handed to the test's thread
            answer["error"] = e

    mover = threading.Thread(target=migrate)
    mover.start()
    incoming = None
    try:
        # Mid-way: B's QEMU takes the memory A sends; held there (B's QEMU
        # stopped) for as long as A's agent takes to die and come back.
        wait_for(lambda: dom.jobStats().get("memory_processed", 0) > 0, timeout=60,
                 interval=0.05)
        incoming = b.daemon.qemu_pid(domain_name(instance))
        os.kill(incoming, signal.SIGSTOP)
        a.kill()
        assert dom.jobStats()["type"] != libvirt.VIR_DOMAIN_JOB_NONE  # libvirt goes on
        a.start(api)
        # The conductor asks the restarted A again, which waits for its
        # migration to end (or, before the fix, rolled it back at once).
        wait_for(lambda: "still runs the migration started before" in
                 a.log.read_text() or not mover.is_alive(), timeout=60)
    finally:
        if incoming is not None:
            os.kill(incoming, signal.SIGCONT)
        mover.join(180)
        conn.close()
        conductor.close()
    assert not mover.is_alive()
    assert "error" not in answer, answer
    assert answer["instance"]["running"], answer

    # B runs it, A holds nothing of it: not a guest, not a device, not an
    # allocation.
    assert set(b.domains(active_only=True)) == {instance}
    assert instance not in a.domains()
    assert a.store("SELECT id FROM assignments WHERE state != 'released' AND "
                   f"instance_uuid = '{instance}'") == []
    assert a.store(f"SELECT state FROM migrations WHERE uuid = '{migration}'") == [
        ("confirmed",)]
    assert allocations_of(url, instance) <= providers_of(url, b.root())
    assert allocations_of(url, migration) == set()
    for agent in (a, b):
        audit = command("manage", agent.conf, "audit", "--json")
        assert audit.returncode == 0, (audit.stdout, audit.stderr)
        assert json.loads(audit.stdout) == {"consistent": True, "findings": [],
                                            "unknown": []}
