"""Run inside an earlier version's virtualenv (tests/upgrade/old_version.py):
that version's agent on one host, driven through its own Python API, as
its tests and its conductor did. Reads a JSON request on stdin, prints
one JSON answer.

Request: {"config": path, "steps": [step, ...], "dump_domains": bool}; a
step is one of
  {"op": "build", "instance": uuid, "spec": {...}, "allocations": {...}}
  {"op": "resize", "migration": uuid, "instance": uuid, "spec": {...},
   "allocations": {...}}   (a same-host resize, finished, left unconfirmed)
Answer: {"instances": {uuid: {"owner:kind": [device ids]}}, "domains": [XML,
...] (with dump_domains)}.

The oldest pinned version (d1b250d) has no manager: its tracker records
the claim and its guest manager runs the guest, glued here as its manager
later did it (a guest stops before its devices change). Nothing of the checkout
under test is imported: this file sees only the old version's packages.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from agent.cmd.common import load_config


def main() -> None:
    request = json.load(sys.stdin)
    conf = load_config(["--config-file", request["config"]])
    try:
        from agent.daemon.service import Agent
    except ImportError:  # before the daemon package: one module
        from agent.service import Agent
    agent = Agent.from_conf(conf)
    agent.driver.init_host()
    outcome = agent.run_cycle()
    assert outcome.ok, outcome.reason
    host = Manager(agent) if getattr(agent, "manager", None) else FirstCut(agent, conf)
    for step in request["steps"]:
        if step["op"] == "build":
            host.build(step["instance"], step["spec"], step["allocations"])
        elif step["op"] == "resize":
            host.resize(step["migration"], step["instance"], step["spec"],
                        step["allocations"])
        else:
            raise ValueError(f"unknown step {step['op']!r}")
    instances, rows, _ = host.tracker.snapshot()
    answer = {"instances": held(instances, rows)}
    if request.get("dump_domains"):
        answer["domains"] = dump_domains(agent.driver)
    host.close()
    agent.driver.cleanup()
    print(json.dumps(answer))


class Manager:
    """0c79eb6 and later: the manager a conductor's RPC reached."""

    def __init__(self, agent):
        self.agent = agent
        self.tracker = agent.manager.tracker

    def build(self, instance, spec, allocations):
        self.agent.manager.build_instance(instance, spec, allocations)

    def resize(self, migration, instance, spec, allocations):
        m = self.agent.manager
        m.prep_resize(migration, instance, spec, allocations)
        m.resize_instance(migration, instance)
        m.finish_resize(migration, instance)

    def close(self):
        self.tracker.store.close()


class FirstCut:
    """d1b250d: its Store, Tracker and GuestManager; the pools come from
    the tree its cycle built, by the provider UUIDs its sync cached."""

    def __init__(self, agent, conf):
        from agent import state
        from agent.host_tree import build_tree
        from agent.tracker import Tracker
        from drivers.libvirt.guests import GuestManager
        from drivers.libvirt.mdev import MdevSysfs
        self.agent = agent
        # Its driver left guests to its guest manager, on the driver's
        # connection.
        self.guests = GuestManager(agent.driver._conn, MdevSysfs(conf.sysfs_root), "kvm")
        self.store = state.Store(Path(conf.state_path) / "state.db")
        self.tracker = Tracker(self.store, agent.driver.boot_id())
        built = build_tree(agent.driver.get_host_inventory(), agent.policy)
        uuids = {p.name: p.uuid for p in agent.sync.cache}
        pools: dict = {}
        for pool in built.pools:
            pools.setdefault(uuids[pool.provider_name], {})[pool.resource_class] = pool
        self.tracker.set_pools(pools)

    def _guest(self, instance, migration=None):
        from drivers.base import DeviceKind, GuestDevice, GuestSpec
        spec, rows, _ = self.tracker.instance(instance)
        devices = tuple(
            GuestDevice(a.id, a.kind, a.device_id, a.amount,
                        a.detail.get("numa_node"),
                        frozenset({int(a.device_id)}) if a.kind is DeviceKind.PCPU
                        else frozenset(),
                        a.detail.get("size_bytes", 0), a.detail.get("dev_path"),
                        a.detail.get("mdev_parent"), a.detail.get("mdev_type"))
            for a in rows if a.owner == "instance" and a.migration_uuid == migration)
        return GuestSpec(instance, spec["name"], spec["vcpus"], spec["memory_mb"], devices)

    def build(self, instance, spec, allocations):
        self.tracker.claim_build(instance, spec, allocations)
        self.guests.spawn(self._guest(instance))
        self.tracker.complete(instance)

    def resize(self, migration, instance, spec, allocations):
        self.tracker.claim_move("resize", migration, instance, spec, allocations)
        self.guests.destroy(instance)
        self.guests.spawn(self._guest(instance, migration))
        self.tracker.finish_move(migration)

    def close(self):
        self.store.close()


def held(instances: dict, rows) -> dict:
    out: dict = {uuid: {} for uuid in instances}
    for a in rows:
        kind = getattr(a.kind, "value", a.kind)
        owner = getattr(a.owner, "value", a.owner)
        out.setdefault(a.instance_uuid, {}).setdefault(f"{owner}:{kind}", []).append(
            a.device_id)
    return {uuid: {k: sorted(v) for k, v in kinds.items()} for uuid, kinds in out.items()}


def dump_domains(driver) -> list[str]:
    """Every domain's persistent definition, for a test-driver host whose
    domains live only in this process: the test writes them into the host
    file, as a libvirtd keeps its domains across an agent's restart."""
    import libvirt
    # The driver's own connection: a test-driver connection opened anew
    # starts from the host file, without them.
    return driver._conn.call(lambda conn: [
        d.XMLDesc(libvirt.VIR_DOMAIN_XML_SECURE) for d in conn.listAllDomains()])


if __name__ == "__main__":
    main()
