"""An upgrade in place, from each pinned earlier version (tests/upgrade/
pinned.py) to this checkout, on real services: a real Placement, the
machine's RabbitMQ, two private libvirtds running QEMU/KVM guests, and a
host on libvirt's test driver for the devices QEMU here cannot have.

The old version, installed from the repository's history into a virtualenv
of its own and driven through its own Python API, builds guests holding
devices and leaves a resize unconfirmed. It stops; this checkout's agent
starts on the same state directory, host and Placement. Then: every guest
is still its own, the store is at this version's schema, Placement is
changed only where this version owns more, the audit is clean, and every
operation on the old guests works through this version's RPC API.
"""
from __future__ import annotations

import json
import time
import uuid

import pytest

from compute_agent.conductor.live_migration import live_migrate_instance
from compute_agent.exception import DevicesInUse
from compute_agent.placement.allocations import move_allocations
from compute_agent.store.schema import SCHEMA_VERSION
from compute_agent.tree.ownership import agent_owns_trait
from tests.functional.helpers import put_allocations, unallocate
from tests.functional.libvirt_host import live_pins
from tests.upgrade.hosts import (
    DEDICATED_CPU,
    DeviceHost,
    NewAgent,
    QemuHost,
    consumer_allocations,
    manage,
    placement_view,
    store_schema,
)
from tests.upgrade.old_version import descends_from
from tests.upgrade.pinned import PINNED, short

# From this commit on a domain has ACPI, without which QEMU refuses an
# nvdimm: older versions' QEMU guests hold no pmem (the test driver's do).
ACPI = "88f9c57"


def spec(instance: str) -> dict:
    return {"name": f"up-{instance[:8]}", "vcpus": 1, "memory_mb": 64}


def held(view: dict) -> dict[str, list[str]]:
    """An instance's devices as the old side reports them:
    "owner:kind" -> device ids."""
    out: dict[str, list[str]] = {}
    for a in view["assignments"]:
        out.setdefault(f"{a['owner']}:{a['kind']}", []).append(a["device_id"])
    return {k: sorted(v) for k, v in out.items()}


def host_sized(resource_class: str, record: dict) -> dict:
    """An inventory record without what follows the host itself: this
    VM's memory grows while it runs (MEMORY_MB's total and max_unit, as
    libvirt reports them, moved by 128 MiB steps within one run)."""
    if resource_class != "MEMORY_MB":
        return record
    return {k: v for k, v in record.items() if k not in ("total", "max_unit")}


def owns_no_less(before: dict[str, dict], after: dict[str, dict]) -> dict[str, object]:
    """Placement's providers of a host after the upgrade against before:
    every provider kept (same UUID), every inventory record and trait kept,
    and the only traits added ones this version owns (ownership.py);
    returns what it added, which is all that may differ."""
    added: dict[str, object] = {}
    for name, old in before.items():
        assert name in after, f"provider {name} gone after the upgrade"
        new = after[name]
        assert new["uuid"] == old["uuid"], name
        for rc, record in old["inventories"].items():
            assert rc in new["inventories"], f"{name}: {rc} gone"
            kept = {k: v for k, v in new["inventories"][rc].items() if k in record}
            assert host_sized(rc, kept) == host_sized(rc, record), (name, rc, record, kept)
        assert old["traits"] <= new["traits"], (name, old["traits"] - new["traits"])
        more = {"classes": sorted(set(new["inventories"]) - set(old["inventories"])),
                "traits": sorted(new["traits"] - old["traits"])}
        assert all(agent_owns_trait(t, frozenset()) for t in more["traits"]), more
        if more["classes"] or more["traits"]:
            added[name] = more
    added.update(dict.fromkeys(set(after) - set(before), "new provider"))
    return added


class Phases:
    """How long each phase took, printed at the end (-s shows it)."""

    def __init__(self):
        self.last = time.monotonic()
        self.took: list[str] = []

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.took.append(f"{name} {now - self.last:.1f}s")
        self.last = now


def audit_clean(host) -> None:
    done = manage(host, "audit", "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)


@pytest.mark.parametrize("pinned", PINNED, ids=short)
def test_an_upgraded_host_keeps_its_guests_and_every_operation_on_them_works(
        pinned, installed, tmp_path, placement, services, libvirtd_pair, api,
        placement_client):
    phases = Phases()
    old = installed(pinned.commit)
    url = placement.url
    a = QemuHost(tmp_path / "a", libvirtd_pair[0], url, "up-a")
    t = DeviceHost(tmp_path / "t", url)
    nvdimm = descends_from(pinned.commit, ACPI)

    # --- the old version: providers, then guests and a resize left open ----
    for host in (a, t):
        old.run("host", {"config": str(host.conf), "steps": []})
    g1, g2, m2, g3 = (str(uuid.uuid4()) for _ in range(4))
    put_allocations(url, g1, a.allocations(pinned=False, pmem=nvdimm))
    put_allocations(url, g2, a.allocations(pinned=True, pmem=False))
    put_allocations(url, g3, t.allocations())
    # g2's resize from a dedicated to a shared CPU, after nova's allocation
    # swap: the migration holds the old flavor's, the instance the new's.
    g2_new = a.allocations(pinned=False, pmem=False)
    move_allocations(placement_client, g2, m2, replacement=g2_new)
    built_a = old.run("host", {"config": str(a.conf), "steps": [
        {"op": "build", "instance": g1, "spec": spec(g1),
         "allocations": a.allocations(pinned=False, pmem=nvdimm)},
        {"op": "build", "instance": g2, "spec": spec(g2),
         "allocations": a.allocations(pinned=True, pmem=False)},
        {"op": "resize", "migration": m2, "instance": g2, "spec": spec(g2),
         "allocations": g2_new}]})
    built_t = old.run("host", {"config": str(t.conf), "dump_domains": True, "steps": [
        {"op": "build", "instance": g3, "spec": spec(g3), "allocations": t.allocations()}]})
    t.keep(built_t["domains"])
    assert set(built_a["instances"]) == {g1, g2} and set(built_t["instances"]) == {g3}
    phases.done("old version builds")
    before = {host.name: placement_view(url, host.providers()) for host in (a, t)}
    allocations = {c: consumer_allocations(url, c) for c in (g1, g2, m2, g3)}

    # --- upgrade in place: this checkout's agent on the same state ----------
    # This version's upgrade-check on the old state: every check passes
    # but one warning, the resize left open.
    check = manage(a, "upgrade-check", "--json")
    results = {c["check"]: c["result"] for c in json.loads(check.stdout)["checks"]}
    assert results == {"Store schema": 0, "Healed under the configured model": 0,
                       "No move in flight": 1}, check.stdout
    phases.done("upgrade-check")
    agents: list[NewAgent] = []
    try:
        for host in (a, t):
            agents.append(NewAgent(host, api))
        b = QemuHost(tmp_path / "b", libvirtd_pair[1], url, "up-b")
        agents.append(NewAgent(b, api))

        phases.done("new agents start")
        # Every guest still its own, with the devices the old version chose.
        for host, built in ((a, built_a), (t, built_t)):
            assert store_schema(host.state) == SCHEMA_VERSION
            for instance, devices in built["instances"].items():
                view = api.get_instance(host.name, instance)
                assert held(view) == devices, (instance, view)
                assert view["running"], instance
        assert libvirtd_pair[0].domain(g1).isActive()
        # Before 88f9c57 a finished resize redefined a running guest and
        # left it running on its old devices.
        g2_moved = live_pins(libvirtd_pair[0].uri, g2) == []
        assert g2_moved == descends_from(pinned.commit, ACPI) or not pinned.has_manager
        # Placement: what the old version wrote, kept; allocations untouched.
        added = {host.name: owns_no_less(before[host.name],
                                         placement_view(url, host.providers()))
                 for host in (a, t)}
        print(f"Placement, added by this version over {short(pinned)}'s: {added}")
        assert {c: consumer_allocations(url, c) for c in allocations} == allocations
        for host in (a, t):
            audit_clean(host)

        phases.done("checks after the upgrade")
        # --- every operation on the old guests ---------------------------
        if not g2_moved:
            # Its confirm would give back the CPU the guest runs on: refused,
            # with a declared error, nothing given back. Reverted instead;
            # then resized again by this version, which moves it.
            with pytest.raises(DevicesInUse):
                api.confirm_resize(a.name, m2, g2)
            assert held(api.get_instance(a.name, g2)) == built_a["instances"][g2]
            api.revert_resize(a.name, m2, g2)
            move_allocations(placement_client, m2, g2, "INSTANCE")
            assert live_pins(libvirtd_pair[0].uri, g2) == [str(DEDICATED_CPU)]
            m2 = str(uuid.uuid4())
            move_allocations(placement_client, g2, m2, replacement=g2_new)
            api.prep_resize(a.name, m2, g2, spec(g2), g2_new)
            api.resize_instance(a.name, m2, g2)
            api.finish_resize(a.name, m2, g2)
        # The pending resize confirmed: the migration's allocations go.
        api.confirm_resize(a.name, m2, g2)
        unallocate(url, m2)
        assert live_pins(libvirtd_pair[0].uri, g2) == []

        phases.done("confirm")
        # g1 resized on the same host to a dedicated CPU, then reverted.
        m1 = str(uuid.uuid4())
        g1_new = a.allocations(pinned=True, pmem=nvdimm)
        move_allocations(placement_client, g1, m1, replacement=g1_new)
        api.prep_resize(a.name, m1, g1, spec(g1), g1_new)
        api.resize_instance(a.name, m1, g1)
        api.finish_resize(a.name, m1, g1)
        assert live_pins(libvirtd_pair[0].uri, g1) == [str(DEDICATED_CPU)]
        api.revert_resize(a.name, m1, g1)
        move_allocations(placement_client, m1, g1, "INSTANCE")
        assert live_pins(libvirtd_pair[0].uri, g1) == []
        assert held(api.get_instance(a.name, g1)) == built_a["instances"][g1]

        phases.done("resize and revert")
        # g1 live-migrated to B, which only this version has run.
        arrived = live_migrate_instance(api, placement_client, g1, a.name, b.name,
                                        spec(g1), b.allocations(pinned=False, pmem=nvdimm))
        assert arrived["running"]
        assert libvirtd_pair[1].domain(g1).isActive()
        assert libvirtd_pair[0].domain(g1) is None

        phases.done("live migration")
        # On the test driver: the guest with a VF, an mdev and pmem resized
        # to other ones, and reverted.
        m3 = str(uuid.uuid4())
        g3_new = t.allocations()
        move_allocations(placement_client, g3, m3, replacement=g3_new)
        api.prep_resize(t.name, m3, g3, spec(g3), g3_new)
        api.resize_instance(t.name, m3, g3)
        api.finish_resize(t.name, m3, g3)
        resized = held(api.get_instance(t.name, g3))
        assert resized["instance:vf"] != built_t["instances"][g3]["instance:vf"]
        api.revert_resize(t.name, m3, g3)
        move_allocations(placement_client, m3, g3, "INSTANCE")
        assert held(api.get_instance(t.name, g3)) == built_t["instances"][g3]

        phases.done("resize and revert on the test driver")
        # Deleted, each where it runs.
        for host, instance in ((b, g1), (a, g2), (t, g3)):
            api.delete_instance(host.name, instance)
            unallocate(url, instance)
        assert libvirtd_pair[0].domain(g2) is None
        assert libvirtd_pair[1].domain(g1) is None
        for host in (a, b, t):
            info = api.get_host_info(host.name)
            assert (info["instances"], info["assignments"]) == (0, 0), host.name
        # (Not t's: an audit's own test-driver connection starts from the
        # host file, where the deleted guest still stands.)
        for host in (a, b):
            audit_clean(host)
        phases.done("delete and audit")
    finally:
        for agent in agents:
            agent.stop()
        print(f"{short(pinned)}: " + ", ".join(phases.took))
