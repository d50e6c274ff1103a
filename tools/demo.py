"""The quick-start demo: the agent's main job on an embedded default.

It builds the demo host (etc/demo/host.yaml) as a fake sysfs tree plus a
libvirt test-driver host, starts a real Placement on SQLite under .demo/,
runs one update_provider_tree cycle with the real console script, and
prints the provider tree as Placement then shows it.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from agent.testing.local_placement import LocalPlacement
from drivers.fake_sysfs import SysfsBuilder

TOP = Path(__file__).resolve().parents[1]
WORK = TOP / ".demo"
BIN = Path(sys.executable).parent


def build_host(description: dict, root: Path) -> str:
    """Write the sysfs tree and the test-driver host, afresh from the
    description; returns the URI."""
    shutil.rmtree(root, ignore_errors=True)
    builder = SysfsBuilder(root / "sys")
    for cell in description["numa_cells"]:
        builder.add_numa_node(cell["id"], cell["cpus"], cell["memory_mb"])
    for dev in description.get("pci_devices", []):
        vfs = dev["vfs"]
        builder.add_pf(dev["address"], dev["vendor_id"], dev["product_id"],
                       vfs["product_id"], dev["numa_node"], vfs["count"], vfs["count"])
    for gpu in description.get("gpus", []):
        builder.add_mdev_parent(
            gpu["address"], gpu["numa_node"],
            {t: (v.get("name"), v["available_instances"])
             for t, v in gpu["mdev_types"].items()},
            gpu["vendor_id"], gpu["product_id"])
    for i, ns in enumerate(description.get("pmem_namespaces", [])):
        builder.add_pmem_namespace(i, 0, ns["size_bytes"], ns["numa_node"],
                                   alt_name=ns["name"])
    return builder.write_test_driver_host_xml(root / "host.xml")


def write_conf(uri: str, placement_url: str) -> Path:
    conf = WORK / "compute-agent.conf"
    conf.write_text(f"""\
[DEFAULT]
host = demo-host
state_path = {WORK / 'state'}
compute_driver = libvirt
sysfs_root = {WORK / 'host' / 'sys'}

[libvirt]
connection_uri = {uri}
instances_path = {WORK}

[pci]
# Only the NIC's VFs are assignable; nothing else on the host is. They
# count as nova's class for them, CUSTOM_PCI_8086_154C, and the PF's
# provider carries the trait CUSTOM_PHYSNET_PHYSNET1.
device_spec = {{"vendor_id": "8086", "product_id": "154c", "physical_network": "physnet1"}}

[devices]
enabled_mdev_types = nvidia-222

[pmem]
namespaces = 64GB:ns0|ns1

[placement]
auth_type = placement_noauth2
endpoint = {placement_url}
""")
    return conf


def main() -> int:
    description = yaml.safe_load((TOP / "etc/demo/host.yaml").read_text())
    uri = build_host(description, WORK / "host")
    placement = LocalPlacement(WORK / "placement").start()
    try:
        conf = write_conf(uri, placement.url)
        print(f"Placement: {placement.url} (SQLite under {WORK / 'placement'})")
        print(f"Config:    {conf}\n")
        mark = placement.mark()
        subprocess.run([str(BIN / "compute-agent"), "--config-file", str(conf), "--once"],
                       check=True)
        print(f"One update_provider_tree cycle: "
              f"{len(placement.requests_since(mark))} requests to Placement.\n")
        print("The provider tree as Placement shows it:\n")
        subprocess.run([str(BIN / "compute-agent-manage"), "--config-file", str(conf),
                        "tree"], check=True)
    finally:
        placement.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
