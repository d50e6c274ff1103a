"""A "host world" for claims tests: a FakeDriver host, the provider tree and
pools built from it by the agent's own code, and a store, tracker and
compute manager on a database file on disk.

``restart()`` is an agent restart: the store is closed and a fresh Tracker
and ComputeManager are built from the same file, with pools rebuilt from
what the (same, surviving) FakeDriver reports now. A hypervisor reboot is
``world.driver.reboot(new_boot_id)`` followed by ``restart()``.
"""
from __future__ import annotations

import uuid as uuid_lib
from dataclasses import dataclass, field
from pathlib import Path

import os_resource_classes as orc

from compute_agent.claims.model import Assignment, Migration
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.reconcile import ReconcileInputs, Report, reconcile
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.fake import FakeDriver, FakeNetwork
from compute_agent.health.vf_restore_run import VfRestore
from compute_agent.store.queries import all_instances, all_migrations, live_assignments
from compute_agent.store.store import Store
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import (
    MdevTypePolicy,
    TreePolicy,
    build_tree,
    gpu_provider_name,
    numa_provider_name,
    pci_provider_name,
    pmem_provider_name,
    pmem_resource_class,
)

PF = "0000:81:00.0"
GPU = "0000:84:00.0"
MDEV_TYPE = "nvidia-35"
PMEM_LABEL = "SMALL"
PMEM_RC = pmem_resource_class(PMEM_LABEL)  # CUSTOM_PMEM_NAMESPACE_SMALL
EXISTING_MDEV = "8c9f1a3e-0d52-4f36-9d0b-6b2a0a5e9e01"


def host_dict(vfs: int = 4, vgpus: int = 3, existing_mdev: bool = True,
              cells: int = 2) -> dict:
    """Two NUMA cells of 4 CPUs; a PF with ``vfs`` VFs on cell 0; a GPU on
    cell 1 with ``vgpus`` more mdevs of nvidia-35 creatable (plus one that
    exists already); a pmem namespace on each cell."""
    gpu = {"address": GPU, "numa_node": 1 % cells,
           "mdev_types": {MDEV_TYPE: {"available_instances": vgpus}}}
    if existing_mdev:
        gpu["mdevs"] = [{"uuid": EXISTING_MDEV, "type": MDEV_TYPE}]
    return {
        "disk_gb": 100,
        "numa_cells": [{"id": i, "cpus": f"{4 * i}-{4 * i + 3}", "memory_mb": 8192}
                       for i in range(cells)],
        "pci_devices": [{"address": PF, "vendor_id": "8086", "product_id": "1572",
                         "numa_node": 0, "vfs": {"count": vfs, "product_id": "154c"}}],
        "gpus": [gpu],
        "pmem_namespaces": [{"name": f"ns{i}", "size_bytes": 1 << 30, "numa_node": i,
                             "dev": f"dax{i}.0"} for i in range(cells)],
    }


@dataclass
class World:
    """One host: its hypervisor (driver) and its agent (store, tracker,
    manager)."""

    name: str
    path: Path  # the store's file
    driver: FakeDriver
    policy: TreePolicy
    store: Store = None
    tracker: Tracker = None
    manager: ComputeManager = None
    names: dict[str, str] = field(default_factory=dict)  # provider name -> uuid
    pools: dict = field(default_factory=dict)
    boots: int = 1

    # --- agent lifecycle --------------------------------------------------

    def build_pools(self) -> dict:
        built = build_tree(self.driver.get_host_inventory(), self.policy)
        assert not built.warnings, built.warnings
        self.names = {p.name: p.uuid for p in built.tree}
        return built.pools_by_uuid({})

    def start(self) -> World:
        self.store = Store(self.path)
        # As the agent's start: a reboot's VFs back before anything is
        # built, and the PFs' counts recorded as a cycle records them.
        vf_restore = VfRestore(self.driver, self.store, self.policy.vf_counts)
        vf_restore.restore(self.driver.boot_id())
        inventory = self.driver.get_host_inventory()
        vf_restore.observe(inventory, build_tree(inventory, self.policy))
        self.tracker = Tracker(self.store, self.driver.boot_id())
        self.pools = self.build_pools()
        self.tracker.set_pools(self.pools)
        self.manager = ComputeManager(self.tracker, self.driver,
                                      device_specs=self.policy.device_specs)
        return self

    def stop(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def restart(self) -> World:
        """The agent process restarts; the hypervisor keeps running."""
        self.stop()
        return self.start()

    def reboot(self) -> str:
        """The hypervisor reboots (guests stop, created mdevs vanish); the
        agent restarts with it. Returns the new boot id. Reconciling is the
        caller's business."""
        self.boots += 1
        boot_id = f"{self.name}-boot-{self.boots}"
        self.driver.reboot(boot_id)
        self.restart()
        return boot_id

    def reconcile(self, allocations: dict[str, set[str]] | None, at_start: bool,
                  fix: bool = True) -> Report:
        return reconcile(self.manager, ReconcileInputs(allocations, at_start, fix))

    # --- names and allocations ---------------------------------------------

    @property
    def host(self) -> str:
        return self.policy.host

    def uuid(self, provider: str) -> str:
        """A provider's uuid from its short name: root, numa0, numa1, pf,
        gpu, pmem0, pmem1 (or a full provider name)."""
        h = self.host
        full = {"root": h, "pf": pci_provider_name(h, PF), "gpu": gpu_provider_name(h, GPU)}
        for i in range(4):
            full[f"numa{i}"] = numa_provider_name(h, i)
            full[f"pmem{i}"] = pmem_provider_name(h, PMEM_LABEL, i)
        return self.names[full.get(provider, provider)]

    def allocations(self, wanted: dict[str, dict[str, int]]) -> dict:
        """{"pf": {"SRIOV_NET_VF": 1}} -> Placement's shape, by uuid."""
        return {self.uuid(p): {"resources": dict(r)} for p, r in wanted.items() if r}

    def live(self) -> list[Assignment]:
        return self.store.read(live_assignments)

    def instances(self) -> dict[str, dict]:
        return self.store.read(all_instances)

    def migrations(self) -> dict[str, Migration]:
        return self.store.read(all_migrations)

    def existing_mdevs(self) -> set[str]:
        inv = self.driver.get_host_inventory()
        return {m.uuid for m in inv.mdevs}


def make_world(directory: Path, name: str = "hosta", host: dict | None = None,
               dedicated: str | None = "2-3,6-7",
               driver: FakeDriver | None = None, network: FakeNetwork | None = None,
               live_migratable: bool = False) -> World:
    """A host world with its store at ``directory/state.db``. ``driver``:
    a FakeDriver (or subclass) already made from ``host``; else one at
    ``fake://<name>`` on ``network``, where live migrations reach it.
    ``live_migratable``: the PF's VFs may live-migrate."""
    from compute_agent.common.cpuset import parse_cpu_set
    directory.mkdir(parents=True, exist_ok=True)
    host = host if host is not None else host_dict()
    cells = len(host.get("numa_cells", []))
    namespaces = frozenset(f"ns{i}" for i in range(cells))
    policy = TreePolicy(
        host=name,
        root_uuid=str(uuid_lib.uuid5(uuid_lib.NAMESPACE_DNS, f"{name}.claims.test")),
        dedicated_cpus=parse_cpu_set(dedicated) if dedicated else None,
        shared_cpus=(frozenset(c for c in range(4 * cells))
                     - parse_cpu_set(dedicated)) if dedicated else None,
        device_specs=parse_specs([f'{{"address": "{PF}", "product_id": "154c", '
                                     '"resource_class": "SRIOV_NET_VF", '
                                     f'"live_migratable": "{"yes" if live_migratable else "no"}"}}']),
        mdev_types=(MdevTypePolicy(MDEV_TYPE),),
        pmem_labels=((PMEM_LABEL, namespaces),),
    )
    driver = driver if driver is not None else FakeDriver(
        host, f"{name}-boot-1", network=network, uri=f"fake://{name}")
    world = World(name, directory / "state.db", driver, policy)
    return world.start()


def spec(name: str = "vm", vcpus: int = 1, memory_mb: int = 512) -> dict:
    return {"name": name, "vcpus": vcpus, "memory_mb": memory_mb}


def new_uuid() -> str:
    return str(uuid_lib.uuid4())


RC = orc  # for tests: RC.SRIOV_NET_VF, RC.VGPU, RC.PCPU ...
