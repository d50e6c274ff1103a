"""The fleet's hosts: realistic shapes for the fake driver, and each
agent's config file."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from compute_agent.tree.host_tree import TreeMode

# nova's class for the VFs the [pci] device_spec below allowlists.
VF_SPEC = '{"vendor_id": "8086", "product_id": "154c", "physical_network": "physnet1"}'
# The class the agent gives those VFs: nova's default for a spec without one.
VF_CLASS = "CUSTOM_PCI_8086_154C"
VGPU_TYPE = "nvidia-222"
PMEM_LABEL = "64GB"
# A NIC's VF counts cycle through these, so the fleet holds trees of
# several sizes.
VF_COUNTS = (8, 16, 32, 64)


def host_shape(index: int) -> dict:
    """A fake-driver host: two NUMA cells, an SR-IOV NIC with 8 to 64 VFs,
    a GPU offering a vGPU type, two pmem namespaces (etc/demo/host.yaml's
    shape)."""
    return {
        "disk_gb": 2000,
        "numa_cells": [{"id": 0, "cpus": "0-31", "memory_mb": 262144},
                       {"id": 1, "cpus": "32-63", "memory_mb": 262144}],
        "pci_devices": [{"address": "0000:3b:00.0", "vendor_id": "8086",
                         "product_id": "1572", "numa_node": 0,
                         "vfs": {"count": VF_COUNTS[index % len(VF_COUNTS)],
                                 "product_id": "154c"}}],
        "gpus": [{"address": "0000:af:00.0", "numa_node": 0, "vendor_id": "10de",
                  "product_id": "1eb8",
                  "mdev_types": {VGPU_TYPE: {"name": "GRID T4-1B",
                                             "available_instances": 16}}}],
        "pmem_namespaces": [
            {"name": "ns0", "size_bytes": 68719476736, "numa_node": 0, "dev": "dax0.0"},
            {"name": "ns1", "size_bytes": 68719476736, "numa_node": 1, "dev": "dax1.0"}],
    }


@dataclass(frozen=True)
class Timing:
    """The agents' intervals: a fleet run compresses production's (60 s
    cycles, reconciling every 10, allocations refreshed every 300 s) so
    that several periods of each fall inside a run of minutes."""

    update_interval: int = 20
    update_jitter: int = 5
    reconcile_interval: int = 3
    allocation_refresh_interval: int = 60
    # The heartbeat's deadline: an evacuation waits it out (the source must
    # be seen down); production's default.
    service_down_time: int = 20


def rabbit_section(options: Mapping[str, str]) -> str:
    """``options`` as a config file's [oslo_messaging_rabbit] section; none
    without options."""
    if not options:
        return ""
    return "[oslo_messaging_rabbit]\n" + "".join(f"{k} = {v}\n" for k, v in options.items())


def write_agent_conf(directory: Path, host: str, index: int, placement_url: str,
                     transport_url: str, timing: Timing,
                     tree_mode: TreeMode = TreeMode.NESTED,
                     rabbit: Mapping[str, str] | None = None) -> Path:
    """The config of the fleet's agent ``index``, named ``host``, with its
    state and fake host under ``directory``; ``rabbit``: its
    [oslo_messaging_rabbit] options."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "host.yaml").write_text(yaml.safe_dump(host_shape(index)))
    conf = directory / "agent.conf"
    conf.write_text(f"""[DEFAULT]
host = {host}
state_path = {directory / 'state'}
compute_driver = fake
transport_url = {transport_url}
update_interval = {timing.update_interval}
update_jitter = {timing.update_jitter}
reconcile_interval = {timing.reconcile_interval}
allocation_refresh_interval = {timing.allocation_refresh_interval}
service_down_time = {timing.service_down_time}

[compute]
provider_tree_mode = {tree_mode.value}

[fake]
host_file = {directory / 'host.yaml'}
state_file = {directory / 'hypervisor.json'}

[pci]
device_spec = {VF_SPEC}

[devices]
enabled_mdev_types = {VGPU_TYPE}

[pmem]
namespaces = {PMEM_LABEL}:ns0|ns1

[placement]
auth_type = placement_noauth2
endpoint = {placement_url}
""" + rabbit_section(rabbit or {}))
    return conf
