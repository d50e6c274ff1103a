"""The agent built from the config: every collaborator of the update loop
(compute_agent/daemon/service.py's Agent) made here, in one place, and
handed to it at construction. The store is judged first, from facts read
without writing anything (compute_agent/store/check.py), and opened,
created or adopted only then."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from oslo_config import cfg

from compute_agent.cleaning.run import Cleaner
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.daemon.one_agent_run import PlacementCheck, StartCheck
from compute_agent.daemon.reconciliation import Reconciliation
from compute_agent.daemon.service import Agent, AgentSettings
from compute_agent.dependencies import Dependencies
from compute_agent.drivers.base import ForeignGuest
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import DriverUnavailable, InvalidHostData
from compute_agent.exception import PlacementError, PlacementUnavailable
from compute_agent.heal.hold import UnhealedHold
from compute_agent.health.run import HealthWatch
from compute_agent.health.vf_restore_run import VfRestore
from compute_agent.metrics import Metrics
from compute_agent.placement.allocations import AllocationView, tree_allocations
from compute_agent.placement.client import DEFAULT_TIMEOUT_SECONDS, PlacementClient, adapter_from_conf
from compute_agent.placement.consumers import Consumers
from compute_agent.placement.sync import TreeSync
from compute_agent.rpc.host_server import ServerWatch
from compute_agent.store import check, node_identity
from compute_agent.store.adoption import plan_adoption
from compute_agent.store.assignment_id import new_assignment_id
from compute_agent.store.errors import AdoptionRefused, StoreRefused
from compute_agent.store.inspection import inspect_store
from compute_agent.store.rebuild import RowSource
from compute_agent.store.store import STORE_FILE, Store, create_filled
from compute_agent.tree.host_tree import TreePolicy, build_tree
from compute_agent.tree.policy import tree_policy_from_conf
from compute_agent.tree.provider_tree import Provider

LOG = logging.getLogger(__name__)


def load_driver(conf: cfg.ConfigOpts) -> ComputeDriver:
    if conf.compute_driver == "fake":
        from compute_agent.drivers.fake import FakeDriver
        return FakeDriver.from_conf(conf)
    from compute_agent.drivers.libvirt.driver import LibvirtDriver
    return LibvirtDriver(conf)


# The update loop's login to a broker its RPC server lost
# (compute_agent/rpc/host_server.py ServerWatch): a broker that accepts no
# connection (a black hole) delays the cycle this long.
BROKER_PROBE_TIMEOUT_SECONDS = 5


@dataclass(frozen=True)
class HostAtStart:
    """What the start judges the store with, and answers for the host:
    the store's file, the host's root provider (``compute_id_existed``:
    its uuid was recorded before this start), the hypervisor and
    Placement."""

    path: Path
    root_uuid: str
    compute_id_existed: bool
    driver: ComputeDriver
    client: PlacementClient
    # The host name the store records as its own (compute_agent/daemon/renamed_host.py):
    # [DEFAULT] host, once the start found the state directory is its;
    # None when that was not checked, or Placement is still to be asked.
    name: str | None = None


@dataclass
class HostReading:
    """What the hypervisor and Placement answered at start-up; None where
    they did not."""

    facts: check.HostFacts
    foreign: Mapping[str, ForeignGuest] | None = None
    allocations: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None


def host_facts(host: HostAtStart) -> HostReading:
    """Ask the hypervisor for our guests and others', and, for a root that
    existed before, Placement for the allocations on its tree. What does
    not answer stays unknown (None)."""
    why: list[str] = []
    guests: frozenset[str] | None = None
    foreign: dict[str, ForeignGuest] | None = None
    try:
        guests = frozenset(host.driver.list_guests())
        foreign = host.driver.list_foreign_guests()
    except DriverUnavailable as e:
        why.append(f"the hypervisor did not answer ({e})")
    except InvalidHostData as e:
        why.append(f"a guest's definition cannot be read ({e})")
    allocations = None
    if host.compute_id_existed:
        try:
            allocations = tree_allocations(host.client, host.root_uuid)
        except (PlacementUnavailable, PlacementError) as e:
            why.append(f"Placement's allocations are unknown ({e})")
    facts = check.HostFacts(
        host.root_uuid, host.compute_id_existed, guests,
        None if allocations is None else {c: set(on) for c, on in allocations.items()},
        "; ".join(why), None if foreign is None else frozenset(foreign))
    return HostReading(facts, foreign, allocations)


def adopt(host: HostAtStart, foreign: Mapping[str, ForeignGuest],
          allocations: Mapping[str, Mapping[str, Mapping[str, int]]], policy: TreePolicy
          ) -> None:
    """Import the foreign guests' devices as their instances' assignments
    (compute_agent/store/adoption.py) and create the store holding them, or raise
    StoreRefused listing every problem, writing nothing."""
    path = host.path
    try:
        built = build_tree(host.driver.get_host_inventory(), policy)
        names = {p["name"]: p["uuid"] for p in host.client.get_tree(host.root_uuid)}
        plan = plan_adoption(foreign, allocations,
                             RowSource(built.pools_by_uuid(names), host.driver.boot_id(),
                                      new_assignment_id))
    except DriverUnavailable as e:
        raise StoreRefused(f"store {path} is missing and the host cannot "
                           f"be adopted: the hypervisor did not answer "
                           f"({e})") from None
    except (PlacementUnavailable, PlacementError) as e:
        raise StoreRefused(f"store {path} is missing and the host cannot "
                           f"be adopted: {e}") from None
    except AdoptionRefused as e:
        raise StoreRefused("\n".join(
            [f"store {path} is missing and the host's guests cannot be adopted; "
             "nothing was written:"] + e.problems)) from None
    for line in plan.skipped:
        LOG.warning("Adoption: %s", line)
    store = plan.store
    create_filled(path, host.root_uuid, store.instances, store.assignments)
    for uuid, spec in sorted(store.instances.items()):
        held = [a for a in store.assignments if a.instance_uuid == uuid]
        LOG.info("Adopted instance %s (%s): %s", uuid, spec["name"], ", ".join(
            f"{a.resource_class} {a.amount}"
            + ("" if a.kind.counted else f" {a.kind.value} {a.device_id}")
            for a in held) or "nothing on this host")
    LOG.info("Adopted this host: %d instances, %d assignments, in store %s",
             len(store.instances), len(store.assignments), path)


def judge_store(host: HostAtStart
                ) -> tuple[check.StoreFacts, HostReading, check.Judgement]:
    """The start decision about the store (check), from facts read
    without writing anything: the store's file, checked whole, and its
    commit sequence's record; the hypervisor and Placement only when the
    store is missing or empty."""
    facts = inspect_store(host.path)
    reading = (host_facts(host) if check.needs_host_facts(facts)
               else HostReading(check.HostFacts(host.root_uuid, host.compute_id_existed,
                                                None, None)))
    return facts, reading, check.judge(facts, reading.facts)


def open_store(host: HostAtStart, holder: bool = True, policy: TreePolicy | None = None
               ) -> Store:
    """The store, once judged this host's (judge_store): opened, created
    for a new host, or created holding the guests of the host it adopts
    (``policy`` needed then). Raises StoreRefused with the line(s) that say
    why not, having written nothing. ``holder``: the caller holds the state
    directory's lock (compute_agent/store/lock.py); any other caller gets the store
    read-only, and never a new one. A root uuid new at this start
    (no compute_id) is written once the store is judged, before the store."""
    path, root_uuid = host.path, host.root_uuid
    facts, reading, judgement = judge_store(host)
    if judgement.verdict is check.StoreVerdict.REFUSE:
        raise StoreRefused(judgement.reason)
    if judgement.verdict in (check.StoreVerdict.CREATE, check.StoreVerdict.ADOPT):
        if not holder:
            raise StoreRefused(f"store {path} is {facts.file.value}: "
                               "the agent has not run on this host yet")
    if holder and not host.compute_id_existed:
        node_identity.record(str(path.parent), root_uuid)
    if judgement.verdict is check.StoreVerdict.CREATE:
        LOG.info("New host: creating store %s", path)
    if judgement.verdict is check.StoreVerdict.ADOPT:
        if reading.foreign is None or reading.allocations is None or policy is None:
            # check.host_to_adopt judges so only with both known.
            raise StoreRefused(f"store {path} is missing, and the host's guests, Placement's "
                               "allocations or the tree policy are unknown: not adopted")
        LOG.info("Adopting this host: %d guests defined by another manager, no "
                 "store yet", len(reading.foreign))
        adopt(host, reading.foreign, reading.allocations, policy)
    if not holder:
        return Store(path, read_only=True)
    return Store(path, root_uuid, host=host.name)


def placement_sync(client: PlacementClient, root_uuid: str, owned: Callable[[Provider], bool],
                   allocation_refresh_interval: float) -> tuple[TreeSync, AllocationView]:
    """The cycle's sync and the one view of allocations it shares with the
    loop: the heal rule's hold reads its usages there, and the loop the
    consumers it reconciles."""
    allocations = AllocationView(client, allocation_refresh_interval)
    return TreeSync(client, root_uuid, UnhealedHold(allocations).hold, owned), allocations




def assemble(driver: ComputeDriver, policy: TreePolicy, sync: TreeSync,
             allocations: AllocationView, manager: ComputeManager, metrics: Metrics,
             settings: AgentSettings,
             broker_watch: ServerWatch | None = None,
             placement_check: PlacementCheck | None = None,
             dead_threads: Callable[[], tuple[str, ...]] = tuple) -> Agent:
    """The agent around its host's driver, policy, Placement sync and
    manager: the collaborators that follow from them made, each wired to
    wake the loop when something the next cycle reports changes (the
    driver, a cleaning's end, a device's health)."""
    wake = threading.Event()
    driver.register_change_listener(wake.set)
    dependencies = Dependencies()
    return Agent(
        driver, policy, sync, allocations, manager,
        reconciliation=Reconciliation(sync, allocations,
                                      Consumers(sync.client, allocations), dependencies,
                                      metrics),
        cleaner=Cleaner(manager.tracker, wake.set),
        vf_restore=VfRestore(driver, manager.tracker.store, policy.vf_counts),
        health=HealthWatch(driver, settings.health, wake.set,
                           report=metrics.set_device_health),
        dependencies=dependencies, wake=wake, metrics=metrics, settings=settings,
        broker_watch=broker_watch, placement_check=placement_check,
        dead_threads=dead_threads)


def compose(conf: cfg.ConfigOpts, holder: bool = True,
            start: StartCheck | None = None,
            dead_threads: Callable[[], tuple[str, ...]] = tuple,
            host_name: str | None = None) -> Agent:
    """The agent the config describes. Raises ConfigError for a bad value,
    StoreRefused when the store is not to be served from (check).
    Asks the hypervisor and Placement only when the store is missing or
    empty. ``holder``: the caller holds the state directory's lock
    (compute_agent/store/lock.py), and may write there; otherwise it only
    reads. ``start``: what the start's one-agent check leaves
    (compute_agent/daemon/one_agent_run.py): its client, which the agent
    uses, the tree it read, which the first cycle uses, and Placement's
    half of the check when it could not be asked; ``dead_threads``: the
    daemon's threads that died, for the probes; ``host_name``: the host
    name the start found the state directory belongs to, which the store
    records (None: not checked, nothing recorded)."""
    conf.set_default("timeout", DEFAULT_TIMEOUT_SECONDS, group="placement")
    compute_id = node_identity.load(conf.state_path)
    if compute_id is None and not holder:
        raise StoreRefused(
            f"{conf.state_path}/{node_identity.FILENAME} does not exist: "
            "the agent has not run on this host yet")
    client = (start.client if start is not None
              else PlacementClient(adapter_from_conf(conf), Metrics()))
    metrics = client.metrics
    driver = load_driver(conf)
    # Written only once the store is judged (open_store): nothing is
    # written before the start's decision.
    root_uuid = compute_id or node_identity.new_uuid()
    policy = tree_policy_from_conf(conf, root_uuid)
    host = conf.host
    sync, allocations = placement_sync(
        client, root_uuid, lambda p: p.name == host or p.name.startswith(host + "_"),
        conf.allocation_refresh_interval)
    if start is not None and start.tree is not None:
        sync.prime(start.tree)
    store = open_store(HostAtStart(Path(conf.state_path) / STORE_FILE, root_uuid,
                                   compute_id is not None, driver, client, host_name),
                       holder, policy)
    manager = ComputeManager(Tracker(store, driver.boot_id(), metrics), driver,
                             conf.devices.remove_released_mdevs,
                             policy.device_specs)
    return assemble(driver, policy, sync, allocations, manager, metrics,
                    AgentSettings.from_conf(conf, holder),
                    ServerWatch(conf, BROKER_PROBE_TIMEOUT_SECONDS),
                    None if start is None else start.pending, dead_threads)
