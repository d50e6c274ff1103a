"""A test host on the libvirt test driver: one description written twice
through SysfsBuilder, as a fake sysfs tree and as the test driver's host
XML, and an agent with the production LibvirtDriver reading it."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import libvirt
from lxml import etree

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.store import node_identity
from tests.functional.helpers import placement_tree, provider_uuid, provider_view, write_conf

PF = "0000:81:00.0"            # Intel 82599, VFs 8086:10ed, cell 1
GPU = "0000:06:00.0"           # mdev-capable GPU, cell 0
NIC0 = "0000:3b:00.0"          # whole device, cell 0
NO_NUMA = "0000:00:05.0"       # whole device, no NUMA affinity
CHIPSET = "0000:00:1f.0"       # present, never allowlisted
MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"

DEVICE_SPECS = [
    json.dumps({"vendor_id": "8086", "product_id": "10ed",  # the PF's VFs
                "resource_class": "SRIOV_NET_VF"}),
    json.dumps({"vendor_id": "15b3", "product_id": "101b",
                "traits": ["CUSTOM_FAST_NIC"]}),
    json.dumps({"vendor_id": "1af4", "product_id": "1041"}),
]


class Host:
    """One test host: its sysfs builder, host file and agent."""

    def __init__(self, tmp_path: Path, placement_url: str) -> None:
        self.dir = tmp_path
        self.sys = SysfsBuilder(tmp_path / "sys")
        self.host_xml = tmp_path / "host.xml"
        self.name = f"lv-{uuid.uuid4().hex[:8]}"
        self.url = placement_url
        self.agent: Agent | None = None
        # The host's boot ID, which [DEFAULT] boot_id_file points at.
        self.boot_id = tmp_path / "boot_id"
        self.boot_id.write_text(f"{uuid.uuid4()}\n")

    def build_default(self) -> None:
        b = self.sys
        b.add_numa_node(0, "0-3", 8192)
        b.add_numa_node(1, "4-7", 8192)
        b.add_pf(PF, "8086", "10fb", "10ed", numa_node=1, total_vfs=8,
                 num_vfs=2, driver="ixgbe", vf_driver="ixgbevf")
        b.add_mdev_parent(GPU, 0, {"nvidia-35": ("GRID M60-2Q", 4),
                                   "nvidia-36": ("GRID M60-4Q", 2)})
        b.add_mdev(MDEV, GPU, "nvidia-35")
        b.add_pci_device(NIC0, "15b3", "101b", "020000", numa_node=0,
                         driver="mlx5_core")
        b.add_pci_device(NO_NUMA, "1af4", "1041", "020000", numa_node=None)
        b.add_pci_device(CHIPSET, "8086", "a1c1", "060100", numa_node=None)
        b.add_pmem_namespace(0, 0, 64 << 30, 0, alt_name="ns0")
        b.add_pmem_namespace(1, 0, 64 << 30, 1, alt_name="ns1")
        b.add_pmem_namespace(1, 1, 64 << 30, 1, alt_name="ns2")
        b.add_pmem_namespace(1, 2, 16 << 30, 1, alt_name="ns3")

    def write_conf(self, default: dict | None = None, **policy) -> Path:
        """The agent's config for this host; ``policy`` (config sections)
        replaces the default allowlist, mdev types and pmem labels."""
        uri = self.sys.write_test_driver_host_xml(self.host_xml)
        policy = policy or {"pci": {"device_spec": DEVICE_SPECS},
                            "devices": {"enabled_mdev_types": "nvidia-35"},
                            "pmem": {"namespaces": "64G:ns0|ns1|ns2,16G:ns3"}}
        return write_conf(
            self.dir, self.url, self.name, host_dict=None,
            DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(self.sys.root),
                     "boot_id_file": str(self.boot_id), **(default or {})},
            libvirt={"connection_uri": uri,
                     "instances_path": str(self.dir / "instances")},
            **policy)

    def make_agent(self, default: dict | None = None, **policy) -> Agent:
        """An agent on this host, in this process."""
        path = self.write_conf(default, **policy)
        self.agent = compose(load_config(["--config-file", str(path)]))
        self.agent.driver.init_host()
        return self.agent

    def reboot(self) -> None:
        """A simulated host reboot, the agent down: a new boot ID, sysfs
        without VFs and mdevs (SysfsBuilder.reboot), and libvirt's host as
        the kernel left it."""
        self.sys.reboot()
        self.boot_id.write_text(f"{uuid.uuid4()}\n")
        self.sys.write_test_driver_host_xml(self.host_xml)

    def play_the_kernel(self) -> None:
        """The kernel and udev within the agent's writes of sriov_numvfs,
        which nothing in a tree of files does: the VFs appear in sysfs
        (SysfsBuilder.answer_sriov_writes) and in libvirt's device list."""
        driver = self.agent.driver
        write = driver.set_num_vfs

        def set_num_vfs(pf_address: str, count: int) -> None:
            write(pf_address, count)
            self.sys.answer_sriov_writes()
            self.libvirt_sees_the_new_host()

        driver.set_num_vfs = set_num_vfs

    def cycle(self) -> None:
        outcome = self.agent.run_cycle()
        assert outcome.ok, outcome.reason

    def libvirt_sees_the_new_host(self) -> None:
        """Rewrite the host file from the builder and drop the connection,
        as a libvirtd restart would: the next cycle reads the new host."""
        self.sys.write_test_driver_host_xml(self.host_xml)
        self.agent.driver.cleanup()

    def tree(self) -> dict[str, dict]:
        root = (self.dir / "state" / node_identity.FILENAME).read_text().strip()
        return placement_tree(self.url, root)

    def p(self, suffix: str) -> str:
        return f"{self.name}_{suffix}"

    def uuid_of(self, suffix: str) -> str:
        return provider_uuid(self.url, self.p(suffix))

    def provider(self, suffix: str) -> dict:
        """One provider's uuid, inventories and traits (helpers.provider_view)."""
        return provider_view(self.url, self.p(suffix))


def live_pins(uri: str, instance: str) -> list[str]:
    """The host CPUs the running guest's vCPUs are pinned to, read from
    libvirt's live XML over a connection of the test's own."""
    conn = libvirt.open(uri)
    try:
        dom = conn.lookupByUUIDString(instance)
        assert dom.isActive(), f"guest {instance} is not running"
        root = etree.fromstring(dom.XMLDesc(0).encode())
    finally:
        conn.close()
    return [p.get("cpuset") for p in root.iterfind("cputune/vcpupin")]
