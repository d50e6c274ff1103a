"""Adoption of a host nova-compute ran, against the real Placement, with the
production libvirt driver on the libvirt test driver.

The host is registered as nova's report client registers it (a root named
after the hypervisor hostname whose UUID is compute_id, VCPU/PCPU/MEMORY_MB/
DISK_GB on it, VGPU on the pGPU's child ``{host}_pci_0000_06_00_0``, the
VFs as ``CUSTOM_PCI_<V>_<P>`` on the PF's ``{host}_{ADDRESS.upper()}``), its
instances hold allocations as nova's scheduler made them, and its guests
run with nova's domain XML (in the test driver's host file: they are there
when the agent connects, as nova's guests are). Then the agent starts.
"""
from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from compute_agent.claims.model import AssignmentState
from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.drivers.libvirt.driver import LibvirtDriver
from compute_agent.heal.rules import capacity
from compute_agent.heal.run import run_heal
from compute_agent.tree.host_tree import build_tree
from compute_agent.tree.policy import tree_policy_from_conf
from tests.functional.helpers import (
    HEADERS,
    assert_never_more_than_physical,
    get,
    offered,
    placement_tree,
    put_allocations,
)
from tests.functional.libvirt_host import GPU, MDEV, PF, Host
from tests.functional.nova_host import nova_domain_xml

VF_SPEC = '{"vendor_id": "8086", "product_id": "10ed"}'
POLICY = {"pci": {"device_spec": [VF_SPEC]},
          "devices": {"enabled_mdev_types": "nvidia-35"}}
VF_CLASS = "CUSTOM_PCI_8086_10ED"  # nova's name for the VFs' class, and ours
OPERATOR_TRAIT = "CUSTOM_GOLD_GPU"
# CPU feature traits are the agent's to report, from the host's CPU (the
# test driver's has none), so nova's are left out here.
NOVA_ROOT_TRAITS = {"COMPUTE_NODE", "OWNER_NOVA", "COMPUTE_STATUS_DISABLED",
                    "COMPUTE_NET_VIF_MODEL_VIRTIO"}


def send(url: str, method: str, path: str, body: dict | None = None) -> dict | None:
    resp = requests.request(method, url + path, headers=HEADERS, json=body, timeout=10)
    assert resp.status_code in (200, 201, 204), (method, path, resp.text)
    return resp.json() if resp.content else None


def nova_provider(url: str, name: str, parent: str | None, inventories: dict,
                  traits: set[str], provider_uuid: str | None = None) -> str:
    """What nova's SchedulerReportClient sends for one provider of the
    tree (_create_resource_provider, set_inventory_for_provider,
    set_traits_for_provider): POST, the custom classes and traits, then PUT
    inventories, then PUT traits,
    each carrying the generation the previous answer gave."""
    body = {"uuid": provider_uuid or str(uuid.uuid4()), "name": name}
    if parent:
        body["parent_provider_uuid"] = parent
    rp = send(url, "POST", "/resource_providers", body)
    # _ensure_resource_classes and _ensure_traits first: one PUT each.
    for rc in inventories:
        if rc.startswith("CUSTOM_"):
            send(url, "PUT", f"/resource_classes/{rc}")
    for trait in traits:
        if trait.startswith("CUSTOM_"):
            send(url, "PUT", f"/traits/{trait}")
    generation = send(url, "PUT", f"/resource_providers/{rp['uuid']}/inventories",
                      {"resource_provider_generation": rp["generation"],
                       "inventories": inventories})["resource_provider_generation"]
    send(url, "PUT", f"/resource_providers/{rp['uuid']}/traits",
         {"resource_provider_generation": generation, "traits": sorted(traits)})
    return rp["uuid"]


def inventory(total: int, reserved: int = 0, ratio: float = 1.0) -> dict:
    """nova's record: max_unit the total, steps of one."""
    return {"total": total, "reserved": reserved, "min_unit": 1, "max_unit": total,
            "step_size": 1, "allocation_ratio": ratio}


class NovaHost:
    """The test host as nova 34 left it: its tree in Placement, its guests'
    allocations and domains; ``physical`` is what the host has, from the
    agent's own model of it."""

    def __init__(self, tmp_path: Path, placement_url: str):
        self.h = Host(tmp_path, placement_url)
        self.h.build_default()
        self.url = placement_url
        self.root = str(uuid.uuid4())
        state = tmp_path / "state"
        state.mkdir(parents=True)
        (state / "compute_id").write_text(self.root + "\n")  # nova's file
        self.conf = self.h.write_conf(**POLICY, compute={"cpu_dedicated_set": "6-7",
                                                         "cpu_shared_set": "0-5"})
        self.vf = self.h.sys.vf_address(PF, 0)
        self.guests = {"vgpu": str(uuid.uuid4()), "vf": str(uuid.uuid4()),
                       "pinned": str(uuid.uuid4())}

    def register(self, disk_gb: int, vgpus: int) -> None:
        name = self.h.name
        nova_provider(self.url, name, None, {
            "VCPU": inventory(6, ratio=4.0), "PCPU": inventory(2),
            "MEMORY_MB": inventory(16384, reserved=512), "DISK_GB": inventory(disk_gb)},
            NOVA_ROOT_TRAITS, self.root)
        # nova/virt/libvirt/driver.py names a pGPU's provider after its
        # libvirt node device: pci_0000_06_00_0.
        pgpu = "pci_" + GPU.replace(":", "_").replace(".", "_")
        self.gpu = nova_provider(self.url, f"{name}_{pgpu}", self.root,
                                 {"VGPU": inventory(vgpus)}, {OPERATOR_TRAIT})
        self.pf = nova_provider(self.url, f"{name}_{PF.upper()}", self.root,
                                {VF_CLASS: inventory(2)}, {"COMPUTE_MANAGED_PCI_DEVICE"})
        root = {"vgpu": {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10},
                "vf": {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 5},
                "pinned": {"PCPU": 2, "MEMORY_MB": 2048}}
        devices = {"vgpu": {self.gpu: {"VGPU": 1}}, "vf": {self.pf: {VF_CLASS: 1}},
                   "pinned": {}}
        for role, instance in self.guests.items():
            allocations = {self.root: {"resources": root[role]}}
            allocations.update({rp: {"resources": r} for rp, r in devices[role].items()})
            put_allocations(self.url, instance, allocations)

    def run_guests(self) -> None:
        """nova's guests, in the host file the test driver starts from."""
        domains = [
            nova_domain_xml(self.guests["vgpu"], 1, "vgpu-vm", 2, 2048, mdevs=(MDEV,),
                            pinned=(0, 1)),  # a NUMA guest: pinned to shared CPUs
            nova_domain_xml(self.guests["vf"], 2, "vf-vm", 1, 1024, pci=(self.vf,)),
            nova_domain_xml(self.guests["pinned"], 3, "pinned-vm", 2, 2048,
                            pinned=(6, 7))]
        text = self.h.host_xml.read_text()
        self.h.host_xml.write_text(text.replace("</node>", "".join(domains) + "</node>"))

    def agent(self) -> Agent:
        self.h.agent = compose(load_config(["--config-file", str(self.conf)]))
        self.h.agent.driver.init_host()
        return self.h.agent

    def allocations(self) -> dict:
        """Each instance's allocations: provider -> resources."""
        return {i: {rp: body["resources"] for rp, body
                    in get(self.url, f"/allocations/{i}")["allocations"].items()}
                for i in self.guests.values()}


def physical(model) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in model.tree:
        for rc, record in p.inventories.items():
            out[rc] = out.get(rc, 0) + capacity(record)
    return out


def nova_registered_and_running(nova: NovaHost) -> dict[str, int]:
    """Register nova's tree and run its guests; returns what the host has,
    as the agent models it (nova registers the same hardware, its disk as
    the agent reads it, with its own tree)."""
    conf = load_config(["--config-file", str(nova.conf)])
    driver = LibvirtDriver(conf)
    driver.init_host()
    model = build_tree(driver.get_host_inventory(), tree_policy_from_conf(conf, nova.root))
    driver.cleanup()
    have = physical(model)
    nova.register(model.tree.get(nova.root).inventories["DISK_GB"]["total"],
                  have["VGPU"])
    nova.run_guests()
    return have


@pytest.fixture
def nova(tmp_path, placement):
    host = NovaHost(tmp_path, placement.url)
    yield host
    if host.h.agent is not None:
        host.h.agent.stop()


def test_a_nova_host_is_adopted_without_double_booking_then_healed(nova, placement):
    have = nova_registered_and_running(nova)
    url, root = placement.url, nova.root
    before = placement_tree(url, root)
    allocations_before = nova.allocations()
    assert_never_more_than_physical(url, root, have)

    agent = nova.agent()
    instances, rows, _ = agent.manager.tracker.snapshot()
    assert set(instances) == set(nova.guests.values())
    held = {(a.instance_uuid, a.kind.value, a.device_id) for a in rows}
    assert (nova.guests["vgpu"], "mdev", MDEV) in held
    assert (nova.guests["vf"], "vf", nova.vf) in held
    assert {(nova.guests["pinned"], "pcpu", c) for c in ("6", "7")} <= held
    # Pinned to shared CPUs is not holding them.
    assert not any(a.kind.value == "pcpu" and a.instance_uuid == nova.guests["vgpu"]
                   for a in rows)
    assert {a.state for a in rows} == {AssignmentState.CLAIMED}
    assert agent.reconcile(at_start=True, fix=False).consistent

    for step in range(3):
        nova.h.cycle()
        after = placement_tree(url, root)
        # No provider duplicated, none renamed, no UUID changed.
        for name, node in before.items():
            assert after[name]["uuid"] == node["uuid"], name
        assert len({n["uuid"] for n in after.values()}) == len(after)
        assert after[nova.h.name]["traits"] >= NOVA_ROOT_TRAITS
        assert OPERATOR_TRAIT in after[nova.h.p("pci_0000_06_00_0")]["traits"]
        assert nova.allocations() == allocations_before
        assert_never_more_than_physical(url, root, have)

    # A build asking for a vGPU and a VF gets neither of nova's.
    build = str(uuid.uuid4())
    wanted = {nova.gpu: {"resources": {"VGPU": 1}},
              nova.pf: {"resources": {VF_CLASS: 1}}}
    put_allocations(url, build, wanted)
    agent.manager.build_instance(build, {"name": "new", "vcpus": 1, "memory_mb": 64},
                                 wanted)
    _, rows, _ = agent.manager.tracker.snapshot()
    mine = {a.kind.value: a.device_id for a in rows if a.instance_uuid == build}
    assert mine["mdev"] != MDEV and mine["vf"] != nova.vf, mine
    assert_never_more_than_physical(url, root, have)

    result = run_heal(agent)
    assert result.applied
    tree = placement_tree(url, root)
    names = {n["uuid"]: name for name, n in tree.items()}
    h = nova.h

    def where(role: str) -> dict[str, dict[str, int]]:
        doc = get(url, f"/allocations/{nova.guests[role]}")["allocations"]
        return {names[rp]: body["resources"] for rp, body in doc.items()}

    # Each instance's CPUs and memory in the cell of its devices or its pins.
    assert where("vgpu") == {h.name: {"DISK_GB": 10}, h.p("numa_0"): {
        "VCPU": 2, "MEMORY_MB": 2048}, h.p("pci_0000_06_00_0"): {"VGPU": 1}}
    assert where("vf") == {h.name: {"DISK_GB": 5}, h.p("numa_1"): {
        "VCPU": 1, "MEMORY_MB": 1024}, h.p(PF.upper()): {VF_CLASS: 1}}
    assert where("pinned") == {h.p("numa_1"): {"PCPU": 2, "MEMORY_MB": 2048}}
    assert offered(url, root) == have
    assert_never_more_than_physical(url, root, have)

    mark = placement.mark()
    again = run_heal(agent)
    assert not again.applied and again.plan.empty
    assert [r for r in placement.requests_since(mark) if not r.startswith("GET")] == []


def test_an_unmappable_host_is_refused_line_by_line_and_nothing_is_written(nova, placement):
    nova_registered_and_running(nova)
    # A resize nova left half done: its migration record holds the VF's
    # class, and the VF guest runs on a VF its allocation does not name.
    migration = str(uuid.uuid4())
    put_allocations(placement.url, migration,
                    {nova.pf: {"resources": {VF_CLASS: 1}}})
    requests.delete(f"{placement.url}/allocations/{nova.guests['vf']}", headers=HEADERS,
                    timeout=10).raise_for_status()
    put_allocations(placement.url, nova.guests["vf"],
                    {nova.root: {"resources": {"VCPU": 1, "MEMORY_MB": 1024}}})
    before = {i: get(placement.url, f"/allocations/{i}")
              for i in [migration, *nova.guests.values()]}

    done = subprocess.run([sys.executable, "-m", "compute_agent.cmd.agent", "--config-file",
                           str(nova.conf), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    problems = [line for line in done.stderr.splitlines() if "error:" in line]
    assert problems[0].endswith("cannot be adopted; nothing was written:"), problems
    assert problems[1:] == [
        f"agent: error: consumer {migration}: holds allocations on this "
        "host's providers but no guest is defined for it (a move in flight?)",
        f"agent: error: guest {nova.guests['vf']}: pci/vf {nova.vf} matches 0 "
        "of its allocations' devices, not one"], problems
    state = nova.h.dir / "state"
    # No store, not even a half-written one beside it.
    assert [p.name for p in state.iterdir() if p.name.startswith("state.db")] == []
    assert {i: get(placement.url, f"/allocations/{i}") for i in before} == before
