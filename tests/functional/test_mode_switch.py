"""Switching ``[compute] provider_tree_mode`` under running guests, against a
real Placement.

Guests holding a vGPU, a VF, a pmem namespace and pinned CPUs are built
through the agent's manager on the fake driver, so the store has their
devices and the driver runs them. The mode then changes under them: the
agent takes the new policy in place, keeping its driver, because the fake
driver's guests (like the libvirt test driver's) live in the process and a
restart would lose them. While unhealed, and at every write Placement
sees, the capacity offered stays within the host's; heal then puts every
allocation where the new mode says, in one reshape.

And the reason for the third mode: a flavor larger than a NUMA cell fits,
while ``same_subtree`` still keeps a vGPU and a VF on one cell.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.heal.run import run_heal
from compute_agent.tree.host_tree import (
    TreeMode,
    build_tree,
    compute_on_cells,
    devices_under_cells,
    gpu_provider_name,
    numa_provider_name,
    pci_provider_name,
    pmem_provider_name,
)
from compute_agent.tree.policy import tree_policy_from_conf
from tests.functional.helpers import (
    assert_never_more_than_physical,
    get,
    offered,
    placement_tree,
    put_allocations,
    used,
    write_conf,
)

PF, GPU = "0000:3b:00.0", "0000:af:00.0"
HOST = {
    "disk_gb": 100,
    "numa_cells": [{"id": 0, "cpus": "0-7", "memory_mb": 16384},
                   {"id": 1, "cpus": "8-15", "memory_mb": 16384}],
    "pci_devices": [{"address": PF, "vendor_id": "8086", "product_id": "1572",
                     "numa_node": 0, "vfs": {"count": 4, "product_id": "154c"}}],
    "gpus": [{"address": GPU, "numa_node": 1,
              "mdev_types": {"nvidia-35": {"available_instances": 4}}}],
    "pmem_namespaces": [{"name": "ns0", "size_bytes": 2**30, "numa_node": 0},
                        {"name": "ns1", "size_bytes": 2**30, "numa_node": 1}],
}
VF, PMEM = "CUSTOM_PCI_8086_154C", "CUSTOM_PMEM_NAMESPACE_SMALL"
# Shared CPUs 0-11 at 4.0, CPUs 12-15 (cell 1) pinned, memory less the
# host's 512 MB.
PHYSICAL = {"VCPU": 48, "PCPU": 4, "MEMORY_MB": 32768 - 512, "DISK_GB": 100,
            "VGPU": 4, VF: 4, PMEM: 2}
# name -> (its NUMA cell, where a scheduler puts it in nested mode; what it
# holds)
GUESTS = {
    "vgpu": (1, {"VCPU": 2, "MEMORY_MB": 2048, "VGPU": 1}),
    "vf": (0, {"VCPU": 1, "MEMORY_MB": 1024, VF: 1}),
    "pinned": (1, {"PCPU": 2, "MEMORY_MB": 2048, PMEM: 1}),
    "plain": (0, {"VCPU": 1, "MEMORY_MB": 512}),
}
COUNTED = ("VCPU", "PCPU", "MEMORY_MB")


def conf_in_mode(directory: Path, url: str, host: str, mode: TreeMode,
                 host_dict: dict = HOST, **compute) -> Path:
    """``compute`` overrides the CPU options; None leaves one out."""
    options = {"provider_tree_mode": mode.value, "cpu_dedicated_set": "12-15",
               "cpu_shared_set": "0-11", **compute}
    return write_conf(directory, url, host, host_dict,
                      compute={k: v for k, v in options.items() if v is not None},
                      pci={"device_spec": json.dumps({"vendor_id": "8086",
                                                      "product_id": "154c"})},
                      devices={"enabled_mdev_types": "nvidia-35"},
                      pmem={"namespaces": "SMALL:ns0|ns1"})


def scheduled(tree: dict[str, dict], host: str, mode: TreeMode, cell: int,
              holds: dict[str, int]) -> dict:
    """A guest's allocations as a scheduler makes them in ``mode``."""
    compute = numa_provider_name(host, cell) if compute_on_cells(mode) else host
    home = dict.fromkeys(COUNTED, compute)
    home |= {"VGPU": gpu_provider_name(host, GPU), VF: pci_provider_name(host, PF),
             PMEM: pmem_provider_name(host, "SMALL",
                                      cell if devices_under_cells(mode) else None)}
    out: dict[str, dict] = {}
    for rc, n in holds.items():
        out.setdefault(tree[home[rc]]["uuid"], {"resources": {}})["resources"][rc] = n
    return out


class Switch:
    """One host with the guests built in ``old`` mode."""

    def __init__(self, tmp_path: Path, placement, old: TreeMode):
        self.dir, self.url = tmp_path, placement.url
        self.placement = placement
        self.host = f"mode-{uuid.uuid4().hex[:8]}"
        self.agent = compose(load_config(
            ["--config-file", str(conf_in_mode(tmp_path, self.url, self.host, old))]))
        self.root = self.agent.policy.root_uuid
        self.agent.update_provider_tree()
        tree = placement_tree(self.url, self.root)
        self.consumers: dict[str, str] = {}
        for name, (cell, holds) in GUESTS.items():
            consumer = str(uuid.uuid4())
            allocations = scheduled(tree, self.host, old, cell, holds)
            put_allocations(self.url, consumer, allocations)
            self.agent.manager.build_instance(
                consumer, {"name": name, "vcpus": holds.get("VCPU") or holds["PCPU"],
                           "memory_mb": holds["MEMORY_MB"]}, allocations)
            self.consumers[name] = consumer
        assert {u for u, g in self.agent.driver.guests.items()
                if g.state().running} == set(self.consumers.values())

    def switch_to(self, new: TreeMode) -> None:
        """The operator's new mode, taken by the running agent."""
        path = conf_in_mode(self.dir, self.url, self.host, new)
        self.agent.policy = tree_policy_from_conf(
            load_config(["--config-file", str(path)]), self.root)
        assert self.agent.policy.mode is new

    def tree(self) -> dict[str, dict]:
        return placement_tree(self.url, self.root)

    def allocations(self) -> dict[str, dict[str, dict[str, int]]]:
        return {c: {rp: body["resources"] for rp, body in
                    get(self.url, f"/allocations/{c}")["allocations"].items()}
                for c in self.consumers.values()}

    def check_at_every_write(self) -> None:
        """Run the capacity check after each write the agent sends that can
        change capacity: inventories, reshapes, deletions."""
        client = self.agent.sync.client
        real = client._call

        def checked(method, url, body=None, expected=(200,)):
            answer = real(method, url, body, expected)
            if ((url.endswith("/inventories") and method == "PUT")
                    or url == "/reshaper" or method == "DELETE"):
                self.checked_writes += 1
                assert_never_more_than_physical(self.url, self.root, PHYSICAL)
            return answer

        self.checked_writes = 0

        client._call = checked

    def expected_allocations(self) -> dict[str, dict[str, dict[str, int]]]:
        """Where the model in force puts each guest's allocations: a device
        on the provider of the device the store assigns it; CPU and memory
        on the root, or in nested mode on the cell of its pinned CPUs, else
        of its device, else (the plain guest) the one cell it is on, which
        the even rule chose."""
        tree = self.tree()
        names = {node["uuid"]: n for n, node in tree.items()}
        built = build_tree(self.agent.driver.get_host_inventory(), self.agent.policy)
        pools = built.pools_by_uuid({n: node["uuid"] for n, node in tree.items()})
        where = {(pool.kind, s.device_id): (rp, rc, s.numa_node)
                 for rp, by_rc in pools.items() for rc, pool in by_rc.items()
                 for s in pool.slots}
        _, rows, _ = self.agent.manager.tracker.snapshot()
        now = self.allocations()
        out = {}
        for name, consumer in self.consumers.items():
            found = [where[(a.kind, a.device_id)] for a in rows
                     if a.consumer_uuid == consumer and not a.kind.counted]
            home = self.root
            if compute_on_cells(self.agent.policy.mode):
                pinned = [cell for _, rc, cell in found if rc == "PCPU"]
                cells = pinned + [cell for _, _, cell in found if cell is not None]
                if not cells:
                    (home,) = [rp for rp, res in now[consumer].items() if "VCPU" in res]
                    assert names[home].startswith(f"{self.host}_numa_"), names[home]
                else:
                    home = tree[numa_provider_name(self.host, cells[0])]["uuid"]
            expected: dict[str, dict[str, int]] = {}
            for rp, rc, _ in found:
                expected.setdefault(rp, {})[rc] = expected.get(rp, {}).get(rc, 0) + 1
            for rc in ("VCPU", "MEMORY_MB"):
                if rc in GUESTS[name][1]:
                    expected.setdefault(home, {})[rc] = GUESTS[name][1][rc]
            out[consumer] = expected
        return out


def class_totals(allocations: dict) -> dict[str, dict[str, int]]:
    out = {}
    for consumer, by_rp in allocations.items():
        sums: dict[str, int] = {}
        for res in by_rp.values():
            for rc, n in res.items():
                sums[rc] = sums.get(rc, 0) + n
        out[consumer] = sums
    return out


SWITCHES = [(TreeMode.FLAT, TreeMode.NESTED), (TreeMode.NESTED, TreeMode.FLAT),
            (TreeMode.NESTED, TreeMode.NUMA_DEVICES), (TreeMode.NUMA_DEVICES, TreeMode.NESTED),
            (TreeMode.FLAT, TreeMode.NUMA_DEVICES)]


@pytest.mark.parametrize("old,new", SWITCHES,
                         ids=[f"{a.value}-to-{b.value}" for a, b in SWITCHES])
def test_mode_switch_under_running_guests_holds_then_heals(tmp_path, placement, old, new):
    s = Switch(tmp_path, placement, old)
    before_tree, before = s.tree(), s.allocations()
    assert offered(s.url, s.root) == PHYSICAL
    s.check_at_every_write()

    s.switch_to(new)
    s.agent.update_provider_tree()
    held = s.tree()
    # No provider duplicated: each device's provider is one, under one name
    # (the pmem providers that change name are the old ones, kept while they
    # hold allocations); a provider whose name stays keeps its UUID.
    model = build_tree(s.agent.driver.get_host_inventory(), s.agent.policy).tree
    assert {p.name for p in model} <= set(held), set(held)
    assert set(held) <= {p.name for p in model} | set(before_tree)
    for name in set(held) & set(before_tree):
        assert held[name]["uuid"] == before_tree[name]["uuid"], name
    # Nothing moved yet, nothing lost.
    assert s.allocations() == before
    assert_never_more_than_physical(s.url, s.root, PHYSICAL)
    # Steady while unhealed: one request a cycle.
    mark = placement.mark()
    s.agent.update_provider_tree()
    assert placement.requests_since(mark) == [
        f"GET /resource_providers?in_tree={s.root} 200"]

    result = run_heal(s.agent)
    assert result.applied
    assert s.checked_writes >= 2  # the switch's inventories, heal's reshape
    healed = s.tree()
    assert set(healed) == {p.name for p in model}
    for name in set(healed) & set(before_tree):
        assert healed[name]["uuid"] == before_tree[name]["uuid"], name
    for p in model:  # each where the model hangs it
        parent = model.get(p.parent_uuid).name if p.parent_uuid else None
        assert healed[p.name]["parent"] == parent, p.name
    after = s.allocations()
    assert class_totals(after) == class_totals(before)
    assert after == s.expected_allocations()
    assert offered(s.url, s.root) == PHYSICAL
    assert used(s.url, s.root) == {rc: sum(h.get(rc, 0) for _, h in GUESTS.values())
                                   for rc in PHYSICAL if rc != "DISK_GB"}

    mark = placement.mark()
    again = run_heal(s.agent)
    assert not again.applied and again.plan.empty
    assert [r for r in placement.requests_since(mark) if not r.startswith("GET")] == []
    # The guests ran throughout.
    assert all(g.state().running for g in s.agent.driver.guests.values())
    s.agent.stop()


def candidates(url: str, root: str, query: str) -> list[dict]:
    return get(url, f"/allocation_candidates?{query}&in_tree={root}")[
        "allocation_requests"]


def test_numa_devices_fits_a_flavor_bigger_than_a_cell_and_keeps_devices_on_one_cell(
        tmp_path, placement):
    host = dict(HOST, gpus=[
        {"address": GPU, "numa_node": 1,
         "mdev_types": {"nvidia-35": {"available_instances": 4}}},
        {"address": "0000:5e:00.0", "numa_node": 0,
         "mdev_types": {"nvidia-35": {"available_instances": 4}}}])
    name = f"big-{uuid.uuid4().hex[:8]}"
    one_to_one = {"cpu_allocation_ratio": "1.0", "cpu_dedicated_set": None,
                  "cpu_shared_set": "0-15"}
    path = conf_in_mode(tmp_path, placement.url, name, TreeMode.NUMA_DEVICES, host,
                        **one_to_one)
    agent = compose(load_config(["--config-file", str(path)]))
    agent.update_provider_tree()
    root = agent.policy.root_uuid
    tree = placement_tree(placement.url, root)
    names = {node["uuid"]: n for n, node in tree.items()}
    big = "resources=VCPU:12,MEMORY_MB:4096"
    assert len(candidates(placement.url, root, big)) == 1

    # A vGPU and a VF of one cell: only the GPU that shares cell 0 with the
    # NIC, not the one on cell 1 (which a query without same_subtree finds).
    devices = f"{big}&resources_GPU=VGPU:1&resources_NET={VF}:1&group_policy=none"
    gpus = {names[rp] for c in candidates(placement.url, root, devices)
            for rp, a in c["allocations"].items() if "VGPU" in a["resources"]}
    assert gpus == {f"{name}_pci_0000_5e_00_0", f"{name}_pci_0000_af_00_0"}
    same_cell = candidates(placement.url, root,
                           f"{devices}&required_NUMA=HW_NUMA_ROOT"
                           "&same_subtree=_GPU,_NET,_NUMA")
    assert same_cell
    for c in same_cell:
        held = {names[rp]: a["resources"] for rp, a in c["allocations"].items()}
        assert held[name] == {"VCPU": 12, "MEMORY_MB": 4096}
        assert f"{name}_pci_0000_5e_00_0" in held, held

    # The same host in nested mode (no guests: it goes live at once) has no
    # room for the big flavor in any one cell.
    agent.policy = tree_policy_from_conf(load_config(["--config-file", str(
        conf_in_mode(tmp_path, placement.url, name, TreeMode.NESTED, host,
                     **one_to_one))]), root)
    agent.update_provider_tree()
    assert candidates(placement.url, root, big) == []
    assert candidates(placement.url, root, "resources=VCPU:8,MEMORY_MB:4096")
    agent.stop()
