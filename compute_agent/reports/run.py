"""The facts the operator reports judge (``compute-agent-manage status``:
compute_agent/reports/status.py; ``tree`` and ``upgrade-check``: compute_agent/reports/tree.py),
read from the host beside a running agent: every read here is read-only and
takes no lock. Each dependency is asked with one cheap real request."""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from oslo_config import cfg

from compute_agent.daemon import cycle_record
from compute_agent.daemon.composition import compose, load_driver
from compute_agent.daemon.errors import RecordUnreadable
from compute_agent.daemon.service import Agent
from compute_agent.dependencies import Dependency, Probe, Unknown
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.exception import AgentError, KeystoneUnavailable, PlacementUnavailable
from compute_agent.heal import rules as heal_rules
from compute_agent.placement.client import PlacementClient, adapter_from_conf
from compute_agent.reports.status import StoreHealth
from compute_agent.reports.tree import TreeReport
from compute_agent.reports.tree import compare as compare_trees
from compute_agent.rpc import broker as broker_probe
from compute_agent.store.check import StoreFile
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import inspect_store
from compute_agent.store.schema import schema_version
from compute_agent.tree.provider_tree import adopt_uuids

# A probe waits this long for an answer: status is run by hand and by
# monitoring, which should not hang on a dead service.
PROBE_TIMEOUT_SECONDS = 10
# Integrity problems listed at most (the first names the damage).
INTEGRITY_ROWS = 20


def hypervisor(conf: cfg.ConfigOpts) -> Probe | None:
    """libvirt asked for its version; None with the fake driver."""
    if conf.compute_driver != "libvirt":
        return None
    uri = conf.libvirt.connection_uri
    driver = load_driver(conf)
    try:
        driver.init_host()
    except DriverUnavailable as e:
        return Probe(Dependency.LIBVIRT, e.where or uri, e.problem)
    except Exception as e:  # noqa: BLE001 - any failure is this probe's finding
        return Probe(Dependency.LIBVIRT, uri, f"failed ({type(e).__name__}: {e})")
    finally:
        driver.cleanup()
    return Probe(Dependency.LIBVIRT, uri)


def placement(conf: cfg.ConfigOpts, root_uuid: str | None
              ) -> tuple[Probe | None, Probe | Unknown]:
    """(Keystone, Placement): Keystone is asked for a token and Placement's
    endpoint (when the auth plugin uses it), then Placement for the
    host's tree (one authenticated GET) or, on a host that has no root
    provider yet, its versions."""
    conf.set_default("timeout", PROBE_TIMEOUT_SECONDS, group="placement")
    client = PlacementClient(adapter_from_conf(conf))
    keystone_probe = None
    try:
        client.endpoint()
    except KeystoneUnavailable as e:
        return (Probe(Dependency.KEYSTONE, e.url, e.problem),
                Unknown("not asked: Keystone gave no token or endpoint"))
    if client.keystone_url:
        keystone_probe = Probe(Dependency.KEYSTONE, client.keystone_url)
    try:
        version = client.negotiate()
        if root_uuid is not None:
            client.get_tree(root_uuid)
    except PlacementUnavailable as e:
        return keystone_probe, Probe(e.dependency, e.url, e.problem)
    except AgentError as e:  # refused (4xx), or too old
        return keystone_probe, Probe(Dependency.PLACEMENT, client.url, f"refused: {e}")
    return keystone_probe, Probe(Dependency.PLACEMENT, client.url,
                                 detail=f"microversion {version}")


def broker(conf: cfg.ConfigOpts) -> Probe | Unknown:
    """The probe the running agent makes every cycle (compute_agent/rpc/broker.py)."""
    return broker_probe.probe(conf, PROBE_TIMEOUT_SECONDS)


def store(path: Path) -> StoreHealth:
    """The store opened read-only, beside the agent that writes it: its
    schema version and SQLite's full integrity check."""
    try:
        found = inspect_store(path)
    except StoreError as e:
        return StoreHealth(str(path), str(e).removeprefix(f"store {path}: "))
    if found.file in (StoreFile.ABSENT, StoreFile.EMPTY):
        return StoreHealth(str(path), f"{found.file.value}: the agent has not run here")
    if found.file is not StoreFile.VALID:
        return StoreHealth(str(path), f"{found.file.value}: {found.detail}")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            version = schema_version(conn)
            rows = tuple(r[0] for r in conn.execute(
                f"PRAGMA integrity_check({INTEGRITY_ROWS})"))
        finally:
            conn.close()
    except sqlite3.Error as e:
        return StoreHealth(str(path), f"corrupt: {type(e).__name__}: {e}")
    return StoreHealth(str(path), None, version, rows)


def last_cycle(state_path: str) -> cycle_record.CycleRecord | Unknown | None:
    try:
        return cycle_record.read(cycle_record.path_in(state_path))
    except RecordUnreadable as e:
        return Unknown(str(e))


def tree_report(agent: Agent) -> TreeReport:
    """Placement's tree (one GET, and the providers whose generation moved
    since the agent saved its view), the model built from what the driver
    finds now, and the allocations of each provider the model takes a
    class off."""
    sync = agent.sync
    sync.refresh()
    placement = sync.cache
    try:
        inventory = agent.driver.get_host_inventory()
    except DriverUnavailable as e:
        raise AgentError(f"the hypervisor did not answer: {e}") from None
    model = adopt_uuids(agent.build_model(inventory).tree, placement)
    allocations = {uuid: sync.client.get_provider_allocations(uuid)
                   for uuid in heal_rules.moving(placement, model, sync.owned)}
    instances, _, _ = agent.manager.tracker.snapshot()
    return compare_trees(placement, model, allocations, sync.owned,
                         {u: spec.get("name") for u, spec in instances.items()})


T = TypeVar("T")


def read_beside_agent(conf: cfg.ConfigOpts, read: Callable[[Agent], T]) -> T:
    """``read(agent)`` on an agent opened read-only, beside a running one
    (no lock, nothing created, nothing written to Placement), its driver
    and store closed after. Raises what opening or reading raises."""
    agent = compose(conf, holder=False)
    try:
        agent.driver.init_host()
        return read(agent)
    finally:
        agent.driver.cleanup()
        agent.manager.tracker.store.close()
