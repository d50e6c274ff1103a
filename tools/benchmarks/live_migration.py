"""A live migration of a small real QEMU/KVM guest (1 vCPU pinned, 64 MiB,
a 64 MiB file-backed nvdimm) between two agents, each on its own private
libvirtd on this machine, driven through rpcapi over the real RabbitMQ with
the real Placement (tests/functional/test_live_migration_agents.py's hosts).

Measured per run: from the conductor's check_can_live_migrate_destination
to the source's answer to live_migrate (its devices given back once the
guest is gone), and within it libvirt's migrateToURI3 call; the agent's
own share is the difference. Allocation writes and post at the destination
are outside the span. Medians over RUNS runs.
"""
from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path

import requests

from compute_agent.placement.allocations import move_allocations
from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.helpers import HEADERS
from tests.functional.private_services import PrivateLibvirtd, running_libvirtd_pair
from tests.functional.test_live_migration_agents import Cloud

RUNS = 5


def run(workdir: Path) -> dict:
    with running_libvirtd_pair(workdir / "libvirtd") as daemons:
        return run_on(workdir, daemons)


def run_on(workdir: Path, daemons: tuple[PrivateLibvirtd, PrivateLibvirtd]) -> dict:
    placement = LocalPlacement(workdir / "placement").start()
    cloud = Cloud(workdir / "agents", daemons, placement.url)
    guests = cloud.a.agent.driver._guests
    in_libvirt: list[float] = []
    timed_call = guests.live_migrate

    def timed(*args):
        began = time.perf_counter()
        try:
            return timed_call(*args)
        finally:
            in_libvirt.append(time.perf_counter() - began)
    guests.live_migrate = timed
    totals: list[float] = []
    try:
        for _ in range(RUNS):
            instance, spec = cloud.build_on_a()
            migration = str(uuid.uuid4())
            allocations = cloud.b.allocations(cloud.url)
            move_allocations(cloud.placement, instance, migration)
            requests.put(f"{cloud.url}/allocations/{instance}", headers=HEADERS,
                         timeout=10, json={"allocations": allocations,
                                           "project_id": str(uuid.uuid4()),
                                           "user_id": str(uuid.uuid4()),
                                           "consumer_generation": None,
                                           "consumer_type": "INSTANCE"})
            began = time.perf_counter()
            answer = cloud.api.check_can_live_migrate_destination(
                cloud.b.name, migration, instance, spec, allocations)
            cloud.api.live_migrate(cloud.a.name, migration, instance,
                                   {k: answer[k] for k in ("claimed", "migration_uri")})
            totals.append(time.perf_counter() - began)
            cloud.api.post_live_migration_at_destination(cloud.b.name, migration,
                                                         instance)
            cloud.api.delete_instance(cloud.b.name, instance)
            for consumer in (instance, migration):
                requests.delete(f"{cloud.url}/allocations/{consumer}", headers=HEADERS,
                                timeout=10)
    finally:
        cloud.close()
        placement.stop()
    own = [t - m for t, m in zip(totals, in_libvirt)]
    return {"case": "live_migration", "runs": RUNS,
            "check_to_source_release_s_median": round(statistics.median(totals), 3),
            "migrateToURI3_s_median": round(statistics.median(in_libvirt), 3),
            "agent_share_s_median": round(statistics.median(own), 3),
            "agent_share_s_max": round(max(own), 3)}
