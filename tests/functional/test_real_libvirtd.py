"""compute_driver = libvirt against a REAL libvirtd (QEMU/KVM) with this
machine's QEMU and its real /sys, synced into the real Placement. Each test
runs a libvirtd of its own (tests/functional/private_services.py), so no
other agent's guests are in it.

Nothing is allowlisted, so no device of this machine may be reported as
assignable; and no test here defines or starts a guest, so no host device
is ever handed to one. The test that restarts libvirtd restarts a private
one of its own, never the machine's.
"""
from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import libvirt
import pytest
from lxml import etree

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.drivers.libvirt import capabilities
from compute_agent.drivers.libvirt.connection import Connection
from compute_agent.drivers.libvirt.host_cpu import HostCpuFeatures
from compute_agent.tree.cpu_traits import cpu_feature_traits
from tests.functional.helpers import placement_tree, totals, write_conf


def real_agent(tmp_path: Path, placement_url: str, uri: str) -> Agent:
    path = write_conf(
        tmp_path, placement_url, f"real-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": "/sys"},
        libvirt={"connection_uri": uri,
                 "instances_path": str(tmp_path / "instances")})
    agent = compose(load_config(["--config-file", str(path)]))
    agent.driver.init_host()
    return agent


@pytest.fixture
def agent(tmp_path, placement, libvirtd, private_libvirtd):
    # The machine's own QEMU and /sys, through a libvirtd of the test's own,
    # so no other agent's guests are in it.
    agent = real_agent(tmp_path, placement.url, private_libvirtd.uri)
    yield agent
    agent.driver.cleanup()


def capabilities_cells(caps_xml: str) -> list[tuple[int, int, int]]:
    """(id, CPU count, memory MiB) of each NUMA cell libvirt reports."""
    root = etree.fromstring(caps_xml.encode())
    out = []
    for cell in root.iterfind("host/topology/cells/cell"):
        mem = cell.find("memory")
        assert mem.get("unit", "KiB") == "KiB"
        out.append((int(cell.get("id")), len(cell.findall("cpus/cpu")),
                    int(mem.text) // 1024))
    return out


def test_the_real_host_appears_with_its_cpus_and_memory(agent, placement, libvirtd):
    caps_xml, info = libvirtd
    outcome = agent.run_cycle()
    assert outcome.ok, outcome.reason

    h = agent.policy.host
    tree = placement_tree(placement.url, agent.policy.root_uuid)
    cells = capabilities_cells(caps_xml)
    assert cells, "libvirt reports no NUMA cell on this machine"
    # The root and one provider a cell, nothing else: no device is
    # allowlisted, so none is reported.
    assert {n: node["parent"] for n, node in tree.items()} == {
        h: None, **{f"{h}_numa_{cell_id}": h for cell_id, _, _ in cells}}
    assert set(totals(tree[h])) == {"DISK_GB"}
    assert not any("COMPUTE_MANAGED_PCI_DEVICE" in node["traits"]
                   for node in tree.values())

    vcpus = sum(totals(tree[f"{h}_numa_{c}"])["VCPU"] for c, _, _ in cells)
    assert vcpus == os.cpu_count() == info[2]
    for cell_id, ncpus, memory_mb in cells:
        node = tree[f"{h}_numa_{cell_id}"]
        assert node["traits"] == {"HW_NUMA_ROOT"}
        assert totals(node) == {"VCPU": ncpus, "MEMORY_MB": memory_mb}
    first = tree[f"{h}_numa_{cells[0][0]}"]["inventories"]["MEMORY_MB"]
    assert first["reserved"] == 512
    # getInfo() counts the same memory (MiB) as the cells, give or take
    # less than what the host keeps for itself.
    memory = sum(m for _, _, m in cells)
    assert abs(memory - info[1]) < first["reserved"], (memory, info[1])


def test_the_real_sys_is_read_and_nothing_is_assignable(agent, placement):
    inv = agent.driver.get_host_inventory()
    # The machine's real PCI devices were read from libvirt and /sys ...
    assert inv.pci_devices, "libvirt lists no PCI device on this machine"
    assert {d.address for d in inv.pci_devices} <= set(
        os.listdir("/sys/bus/pci/devices"))
    assert inv.cpus == frozenset(range(os.cpu_count()))
    # ... without a warning about any of them ...
    assert not [w for w in inv.warnings
                if any(d.address in w for d in inv.pci_devices)], inv.warnings
    # ... and the cycle built from them reports no device inventory.
    outcome = agent.run_cycle()
    assert outcome.ok, outcome.reason
    tree = placement_tree(placement.url, agent.policy.root_uuid)
    assert len(tree) == 1 + len(inv.numa_cells)
    assert {rc for node in tree.values() for rc in totals(node)} <= {
        "VCPU", "PCPU", "MEMORY_MB", "DISK_GB"}


def test_a_libvirtd_restart_skips_one_cycle_and_reconnects(
        tmp_path, placement, private_libvirtd, caplog, capfd):
    agent = real_agent(tmp_path, placement.url, private_libvirtd.uri)
    try:
        assert agent.run_cycle().ok
        private_libvirtd.stop()
        caplog.clear()
        capfd.readouterr()
        with caplog.at_level(logging.WARNING):
            outcome = agent.run_cycle()
        # Nothing printed around the log either (libvirt's own default
        # error printing would add "libvirt: XML-RPC error" lines).
        assert "libvirt" not in capfd.readouterr().err
        assert not outcome.ok
        assert outcome.reason.startswith(f"libvirt at {private_libvirtd.uri} did not answer")
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert private_libvirtd.uri in warnings[0]

        private_libvirtd.start()
        outcome = agent.run_cycle()
        assert outcome.ok, outcome.reason
    finally:
        agent.driver.cleanup()


CPU_MAP = Path("/usr/share/libvirt/cpu_map")


def cpu_map_model_features(model: str) -> frozenset[str]:
    """The features libvirt's CPU map gives ``model``, with those of a model
    it is based on."""
    for include in etree.parse(str(CPU_MAP / "index.xml")).iterfind(".//include"):
        doc = etree.parse(str(CPU_MAP / include.get("filename")))
        for m in doc.iterfind(f"model[@name='{model}']"):
            base = m.find("model")
            inherited = (cpu_map_model_features(base.get("name"))
                         if base is not None else frozenset())
            return inherited | {f.get("name") for f in m.iterfind("feature")}
    raise AssertionError(f"model {model} is not in libvirt's CPU map")


def test_the_host_cpu_models_own_features_are_reported(libvirtd):
    """Against this machine's libvirtd, read-only: the expanded features
    hold both the listed ones and every feature of the named model."""
    caps = capabilities.parse_capabilities(libvirtd[0])
    assert caps.cpu_definition is not None, "the host CPU names no model"
    model = etree.fromstring(caps.cpu_definition).findtext("model")
    connection = Connection("qemu:///system", open_fn=libvirt.openReadOnly)
    try:
        found = HostCpuFeatures(connection).features(caps)
    finally:
        connection.close()
    assert found >= caps.cpu_features
    own = cpu_map_model_features(model)
    assert own - caps.cpu_features, f"{model}'s features are all listed already"
    assert found >= own, own - found
    assert cpu_feature_traits(found) > cpu_feature_traits(caps.cpu_features)
