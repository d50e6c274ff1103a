"""The agent process: the periodic update_provider_tree loop, which pings
systemd's watchdog while it is healthy. Native threads only (no eventlet)."""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oslo_config import cfg

from compute_agent.claims.model import Migration
from compute_agent.cleaning.rules import apply_uses
from compute_agent.cleaning.run import Cleaner
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.reconcile import Report, reconcile
from compute_agent.compute.tracker import Tracker
from compute_agent.compute.vgpu_types import restore_vgpu_types_after_reboot, still_not_restored
from compute_agent.daemon import cycle_record
from compute_agent.daemon.errors import AnotherAgentServesHost, RecordUnreadable
from compute_agent.daemon.one_agent_check import PlacementCheck
from compute_agent.daemon.probes import Phase, ProbeFacts, liveness, readiness
from compute_agent.daemon.systemd import Watchdog
from compute_agent.dependencies import Dependencies, Dependency, Health, describe
from compute_agent.drivers.base import DeviceKind, ForeignGuest, HostInventory
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import DriverUnavailable, InvalidHostData
from compute_agent.exception import (
    AgentError,
    ConfigError,
    DependencyUnavailable,
    PlacementError,
    PlacementUnavailable,
)
from compute_agent.heal.hold import UnhealedHold
from compute_agent.heal.realign import DeviceIndex
from compute_agent.heal.run import align_store, run_heal
from compute_agent.health.rules import hold_vgpu_vfs_not_restored
from compute_agent.health.vf_restore_run import VfRestore
from compute_agent.health.watch import HealthWatch
from compute_agent.metrics import CycleResult, Metrics, ProviderCapacity, provider_capacity
from compute_agent.moves.evacuation import evacuation_migration_uuid
from compute_agent.placement.allocations import AllocationView, tree_allocations
from compute_agent.placement.client import DEFAULT_TIMEOUT_SECONDS, PlacementClient, adapter_from_conf
from compute_agent.placement.consumers import Consumers
from compute_agent.placement.sync import SyncResult, TreeSync
from compute_agent.rpc import broker
from compute_agent.store import check as store_check
from compute_agent.store import node_identity
from compute_agent.store.adoption import plan_adoption
from compute_agent.store.errors import AdoptionRefused, StoreError, StoreRefused
from compute_agent.store.store import (
    STORE_FILE,
    Store,
    create_filled,
    inspect_store,
    new_assignment_id,
    placement_view,
    put_placement_view_sql,
)
from compute_agent.tree.host_tree import BuiltTree, TreePolicy, build_tree
from compute_agent.tree.policy import tree_policy_from_conf
from compute_agent.tree.provider_tree import Provider, ProviderTree

LOG = logging.getLogger(__name__)


def load_driver(conf: cfg.ConfigOpts) -> ComputeDriver:
    if conf.compute_driver == "fake":
        from compute_agent.drivers.fake import FakeDriver
        return FakeDriver.from_conf(conf)
    from compute_agent.drivers.libvirt.driver import LibvirtDriver
    return LibvirtDriver(conf)


@dataclass
class CycleOutcome:
    ok: bool
    reason: str = ""
    result: SyncResult | None = None
    kind: CycleResult = CycleResult.OK


def unavailable_result(dependency: Dependency) -> CycleResult:
    """How the metrics count a cycle a dependency stopped."""
    return {Dependency.LIBVIRT: CycleResult.HYPERVISOR_UNAVAILABLE,
            Dependency.KEYSTONE: CycleResult.KEYSTONE_UNAVAILABLE}.get(
                dependency, CycleResult.PLACEMENT_UNAVAILABLE)


# The update loop asks the broker once a cycle (compute_agent/rpc/broker.py): a broker
# that accepts no connection (a black hole) delays the cycle this long.
BROKER_PROBE_TIMEOUT_SECONDS = 5
UPDATE_THREAD = "update-provider-tree"


def saved_view(store: Store) -> ProviderTree:
    """The view of Placement an earlier run saved; an empty one when it
    does not form a tree (Placement is then read afresh)."""
    try:
        return ProviderTree.parents_first(store.read(placement_view))
    except ValueError as e:
        LOG.warning("Saved view of Placement unusable, reading it afresh: %s", e)
        return ProviderTree()


@dataclass
class HostReading:
    """What the hypervisor and Placement answered at start-up; None where
    they did not."""

    facts: store_check.HostFacts
    foreign: dict[str, ForeignGuest] | None = None
    allocations: dict[str, dict[str, dict[str, int]]] | None = None


def host_facts(driver: ComputeDriver, client: PlacementClient, root_uuid: str,
               compute_id_existed: bool) -> HostReading:
    """Ask the hypervisor for our guests and others', and, for a root that
    existed before, Placement for the allocations on its tree. What does
    not answer stays unknown (None)."""
    why: list[str] = []
    guests: frozenset[str] | None = None
    foreign: dict[str, ForeignGuest] | None = None
    try:
        guests = frozenset(driver.list_guests())
        foreign = driver.list_foreign_guests()
    except DriverUnavailable as e:
        why.append(f"the hypervisor did not answer ({e})")
    except InvalidHostData as e:
        why.append(f"a guest's definition cannot be read ({e})")
    allocations = None
    if compute_id_existed:
        try:
            allocations = tree_allocations(client, root_uuid)
        except (PlacementUnavailable, PlacementError) as e:
            why.append(f"Placement's allocations are unknown ({e})")
    facts = store_check.HostFacts(
        root_uuid, compute_id_existed, guests,
        None if allocations is None else {c: set(on) for c, on in allocations.items()},
        "; ".join(why), None if foreign is None else frozenset(foreign))
    return HostReading(facts, foreign, allocations)


def adopt(path: Path, root_uuid: str, reading: HostReading, driver: ComputeDriver,
          client: PlacementClient, policy: TreePolicy) -> None:
    """Import the foreign guests' devices as their instances' assignments
    (compute_agent/store/adoption.py) and create the store holding them, or raise
    StoreRefused listing every problem, writing nothing."""
    try:
        built = build_tree(driver.get_host_inventory(), policy)
        names = {p["name"]: p["uuid"] for p in client.get_tree(root_uuid)}
        plan = plan_adoption(reading.foreign, reading.allocations,
                             built.pools_by_uuid(names), driver.boot_id(),
                             new_assignment_id)
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
    create_filled(path, root_uuid, store.instances, store.assignments)
    for uuid, spec in sorted(store.instances.items()):
        held = [a for a in store.assignments if a.instance_uuid == uuid]
        LOG.info("Adopted instance %s (%s): %s", uuid, spec["name"], ", ".join(
            f"{a.resource_class} {a.amount}"
            + ("" if a.kind.counted else f" {a.kind.value} {a.device_id}")
            for a in held) or "nothing on this host")
    LOG.info("Adopted this host: %d instances, %d assignments, in store %s",
             len(store.instances), len(store.assignments), path)


def judge_store(path: Path, root_uuid: str, compute_id_existed: bool,
                driver: ComputeDriver, client: PlacementClient
                ) -> tuple[store_check.StoreFacts, HostReading, store_check.Judgement]:
    """The start decision about the store (store_check), from facts read
    without writing anything: the store's file, checked whole, and its
    commit sequence's record; the hypervisor and Placement only when the
    store is missing or empty."""
    facts = inspect_store(path)
    reading = (host_facts(driver, client, root_uuid, compute_id_existed)
               if store_check.needs_host_facts(facts)
               else HostReading(store_check.HostFacts(root_uuid, compute_id_existed,
                                                      None, None)))
    return facts, reading, store_check.judge(facts, reading.facts)


def open_store(path: Path, root_uuid: str, compute_id_existed: bool,
               driver: ComputeDriver, client: PlacementClient,
               holder: bool = True, policy: TreePolicy | None = None) -> Store:
    """The store, once judged this host's (judge_store): opened, created
    for a new host, or created holding the guests of the host it adopts
    (``policy`` needed then). Raises StoreRefused with the line(s) that say
    why not, having written nothing. ``holder``: the caller holds the state
    directory's lock (compute_agent/store/lock.py); any other caller gets the store
    read-only, and never a new one. A ``root_uuid`` new at this start
    (no compute_id) is written once the store is judged, before the store."""
    facts, reading, judgement = judge_store(path, root_uuid, compute_id_existed,
                                            driver, client)
    if judgement.verdict is store_check.StoreVerdict.REFUSE:
        raise StoreRefused(judgement.reason)
    if judgement.verdict in (store_check.StoreVerdict.CREATE, store_check.StoreVerdict.ADOPT):
        if not holder:
            raise StoreRefused(f"store {path} is {facts.file.value}: "
                               "the agent has not run on this host yet")
    if holder and not compute_id_existed:
        node_identity.record(str(path.parent), root_uuid)
    if judgement.verdict is store_check.StoreVerdict.CREATE:
        LOG.info("New host: creating store %s", path)
    if judgement.verdict is store_check.StoreVerdict.ADOPT:
        LOG.info("Adopting this host: %d guests defined by another manager, no "
                 "store yet", len(reading.foreign))
        adopt(path, root_uuid, reading, driver, client, policy)
    if not holder:
        return Store(path, read_only=True)
    return Store(path, root_uuid)


def _last_success_recorded(path: Path | None) -> float | None:
    """When the last successful cycle of an earlier run ended, so that a
    restart does not forget it; None when unknown."""
    try:
        record = cycle_record.read(path) if path is not None else None
    except RecordUnreadable as e:
        LOG.warning("%s: starting a new record", e)
        return None
    return None if record is None else record.last_success_at


@dataclass(frozen=True)
class AgentSettings:
    """What the operator's config sets for the running agent, read in one
    place (``from_conf``); the defaults are the options' defaults."""

    update_interval: float = 60
    update_jitter: float = 0
    # Reconcile every this many cycles.
    reconcile_interval: int = 10
    orphan_grace_period: float = 0
    live_migration_announced_timeout: float = 600
    heal_on_startup: bool = False
    # host:port the metrics are served on; None: not served.
    metrics_listen: str | None = None
    # Seconds a turn of the update loop may run before /healthz says stuck.
    healthz_turn_limit: float = 120
    health_poll_interval: float = 1.0
    health_correctable_per_minute: int = 100
    # <state_path>/last_cycle.json, for status (compute_agent/daemon/cycle_record.py);
    # None: not recorded (an agent opened beside a running one).
    record_path: Path | None = None

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts, holder: bool) -> AgentSettings:
        return cls(
            update_interval=conf.update_interval, update_jitter=conf.update_jitter,
            reconcile_interval=conf.reconcile_interval,
            orphan_grace_period=conf.orphan_grace_period,
            live_migration_announced_timeout=conf.live_migration_announced_timeout,
            heal_on_startup=conf.heal.on_startup, metrics_listen=conf.metrics.listen,
            healthz_turn_limit=conf.metrics.healthz_turn_limit,
            health_poll_interval=conf.devices.health_poll_interval,
            health_correctable_per_minute=conf.devices.health_correctable_errors_per_minute,
            record_path=cycle_record.path_in(conf.state_path) if holder else None)


def placement_sync(client: PlacementClient, root_uuid: str, owned: Callable[[Provider], bool],
                   allocation_refresh_interval: float) -> tuple[TreeSync, AllocationView]:
    """The cycle's sync and the one view of allocations it shares with the
    loop: the heal rule's hold reads its usages there, and the loop the
    consumers it reconciles."""
    allocations = AllocationView(client, allocation_refresh_interval)
    return TreeSync(client, root_uuid, UnhealedHold(allocations).hold, owned), allocations


class Agent:
    def __init__(self, driver: ComputeDriver, policy: TreePolicy, sync: TreeSync,
                 allocations: AllocationView, manager: ComputeManager | None = None,
                 settings: AgentSettings = AgentSettings(), metrics: Metrics | None = None,
                 broker_watch: broker.BrokerWatch | None = None):
        self.driver = driver
        self.policy = policy
        self.sync = sync
        self.manager = manager
        # vGPU VFs whose type was not written back after a reboot -> why.
        self.vgpu_types_not_restored: dict[str, str] = {}
        self.settings = settings
        # The wall-clock time now, for the grace periods reconcile measures
        # (the store's change times are wall-clock).
        self.wall_clock: Callable[[], float] = time.time
        # The share of update_jitter a wait takes: random.uniform(0, jitter).
        self.draw_jitter: Callable[[float, float], float] = random.uniform
        # Served on metrics_listen (host:port) from start() to stop().
        self.metrics = metrics or Metrics()
        if manager is not None:
            self.metrics.watch_assignments(manager.tracker.held_by_class)
        self.allocations = allocations
        self.consumers = Consumers(sync.client, allocations)
        # The view of Placement the last reconciliation used: while it is
        # still the cache, no cycle has read the tree since.
        self._reconciled_view: ProviderTree | None = None
        self._drop_allocations = threading.Event()
        self._cycles = 0
        # Placement's view after the last cycle that reached it, for RPC
        # readers: replaced whole, never changed in place.
        self.last_tree = ProviderTree()
        self.metrics.watch_capacity(self.capacity)
        # Placement's view as last saved: a restart trusts each provider in
        # it until its generation moves.
        saved = saved_view(manager.tracker.store) if manager else ProviderTree()
        sync.restore(saved.copy())
        self._saved_view = saved.depth_first()
        self._view_saved = True
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._drop_cache = threading.Event()
        self._thread: threading.Thread | None = None
        driver.register_change_listener(self._wake.set)
        # One-time-use devices' cleaning (compute_agent/cleaning/); a cleaning's end
        # wakes the loop, which reports the device back or its reason.
        self.cleaner = Cleaner(manager.tracker, self._wake.set) if manager else None
        # None for an agent without a store (nothing to restore from).
        self.vf_restore = (VfRestore(driver, manager.tracker.store, policy.vf_counts)
                           if manager is not None else None)
        self.health = HealthWatch(driver, settings.health_poll_interval,
                                  settings.health_correctable_per_minute, self._wake.set,
                                  report=self.metrics.set_device_health)
        # What each cycle asks, in order: the hypervisor, then Keystone
        # (when the auth plugin uses it) for a token, then Placement.
        self.dependencies = Dependencies()
        self.cycle_path = ((Dependency.LIBVIRT,)
                           + ((Dependency.KEYSTONE,) if sync.client.keystone_url else ())
                           + (Dependency.PLACEMENT,))
        self._last_success_at = _last_success_recorded(settings.record_path)
        self._record_failing = False
        # Asked by the loop before each cycle; None: no broker to watch.
        self.broker_watch = broker_watch
        # Whether another agent serves this host, when the start could not
        # ask Placement: asked by the first cycle that reaches it.
        self.placement_check: PlacementCheck | None = None
        # What the probes read (probe_facts). The daemon (compute_agent/cmd/daemon.py)
        # moves the phase on once RPC is served, and tells the threads that
        # died.
        self.phase = Phase.STARTING
        self.dead_threads: Callable[[], tuple[str, ...]] = tuple
        self._cycle_succeeded = False
        self._last_problem = ""
        # time.monotonic() when the loop's turn in progress began; None
        # while it waits.
        self._turn_started: float | None = None
        self._store_problem = ""
        if manager is not None:
            manager.tracker.store.on_moved(self._store_moved)

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts, holder: bool = True) -> Agent:
        """Raises ConfigError for a bad value, StoreRefused when the store
        is not to be served from (store_check). Asks the hypervisor and
        Placement only when the store is missing or empty. ``holder``: the
        caller holds the state directory's lock (compute_agent/store/lock.py), and may
        write there; otherwise it only reads."""
        conf.set_default("timeout", DEFAULT_TIMEOUT_SECONDS, group="placement")
        compute_id = node_identity.load(conf.state_path)
        if compute_id is None and not holder:
            raise StoreRefused(
                f"{conf.state_path}/{node_identity.FILENAME} does not exist: "
                "the agent has not run on this host yet")
        metrics = Metrics()
        client = PlacementClient(adapter_from_conf(conf), metrics)
        driver = load_driver(conf)
        # Written only once the store is judged (open_store): nothing is
        # written before the start's decision.
        root_uuid = compute_id or node_identity.new_uuid()
        policy = tree_policy_from_conf(conf, root_uuid)
        host = conf.host
        sync, allocations = placement_sync(
            client, root_uuid, lambda p: p.name == host or p.name.startswith(host + "_"),
            conf.allocation_refresh_interval)
        store = open_store(Path(conf.state_path) / STORE_FILE, root_uuid,
                           compute_id is not None, driver, client, holder, policy)
        manager = ComputeManager(Tracker(store, driver.boot_id(), metrics), driver,
                                 conf.devices.remove_released_mdevs,
                                 policy.device_specs)
        return cls(driver, policy, sync, allocations, manager,
                   AgentSettings.from_conf(conf, holder), metrics,
                   broker.BrokerWatch(conf, BROKER_PROBE_TIMEOUT_SECONDS))

    def build_model(self, inventory: HostInventory) -> BuiltTree:
        """The tree to report for ``inventory``: the policy's, with the
        devices found unhealthy taken out of scheduling. Every reader that
        compares with Placement (a cycle, heal, manage tree) builds it
        here, so none takes the agent's own health marks for drift, nor
        its VFs not back after a reboot (compute_agent/health/vf_restore_run.py), nor
        its VFs whose vGPU type is not back, nor its used one-time-use
        devices (compute_agent/cleaning/rules.py)."""
        known_bad = {}
        if self.vf_restore is not None:
            inventory, known_bad = self.vf_restore.apply(inventory)
        built = self.health.apply(build_tree(inventory, self.policy), inventory, known_bad)
        if self.manager is None:
            return built
        tracker = self.manager.tracker
        if self.vgpu_types_not_restored:
            typed = frozenset(p.address for p in inventory.mdev_parents if p.vendor_vfio
                              and any(t.available_instances == 0 for t in p.types))
            self.vgpu_types_not_restored = still_not_restored(
                self.vgpu_types_not_restored, typed,
                lambda vf: tracker.holds(DeviceKind.VGPU_VF, vf))
            built = hold_vgpu_vfs_not_restored(built, inventory, self.vgpu_types_not_restored)
        return apply_uses(built, tracker.device_uses())

    def update_provider_tree(self) -> SyncResult:
        """One cycle: discover, build the desired tree, sync it."""
        if self._drop_cache.is_set():
            self._drop_cache.clear()
            self.sync.invalidate()
            LOG.info("Placement cache dropped")
        inventory = self.driver.get_host_inventory()
        built = self.build_model(inventory)
        for warning in built.warnings:
            LOG.warning("%s", warning)
        if self.cleaner is not None:
            self.cleaner.set_specs(built.one_time_use)
        if self.vf_restore is not None:
            self.vf_restore.observe(inventory, built)
        if self.manager is not None:
            self._read_guests()
        try:
            result = self.sync.sync(built.tree)
            self.last_tree = self.sync.cache.copy()
            self._save_view(self.last_tree.depth_first())
        finally:
            # Claims work from the host's devices even when Placement does
            # not answer, with the provider UUIDs it last showed us.
            if self.manager is not None:
                self.manager.tracker.set_pools(built.pools_by_uuid(
                    {p.name: p.uuid for p in self._saved_view}))
                self._mark_held_used()
        LOG.debug("update_provider_tree: %d providers, %d writes",
                  len(built.tree), result.writes)
        return result

    def _mark_held_used(self) -> None:
        """One-time-use devices held with no record of their use (their
        spec marked them since, or their guest was adopted) are recorded
        used, so their release is followed by their cleaning. A store that
        cannot be written costs this cycle's try, not the cycle."""
        try:
            for address in self.manager.tracker.mark_held_used():
                LOG.info("Device %s is one-time-use and held: cleaned once given back",
                         address)
        except StoreError as e:
            LOG.warning("Held one-time-use devices not recorded used; the next cycle "
                        "tries again: %s", e)

    def _read_guests(self) -> None:
        """Once a cycle, every guest's definition read afresh (claims read
        only what changed since). A definition that cannot be read is one
        line; claims, which read the guests again, are refused meanwhile."""
        try:
            self.manager.tracker.set_guests(self.driver.guest_holdings(reread=True))
        except InvalidHostData as e:
            LOG.warning("Guests not read: %s", e)

    def _save_view(self, view: list[Provider]) -> None:
        """Keep Placement's view in the store for the next start. It is a
        cache: a store that cannot be written costs the saved copy, not
        the cycle, and the next cycle tries again."""
        if self.manager is not None and (view != self._saved_view
                                         or not self._view_saved):
            try:
                self.manager.tracker.store.write(put_placement_view_sql(view))
                self._view_saved = True
            except StoreError as e:
                self._view_saved = False
                LOG.warning("Placement's view not saved; the next cycle tries "
                            "again: %s", e)
        self._saved_view = view

    def _generations(self) -> dict[str, int]:
        """Our providers' generations: from the latest cycle's read of the
        tree, or, when no cycle has read it since the last reconciliation
        (they failed), from a read of our own (one request): generations
        no newer than those a reconciliation already used would hide a
        change."""
        view = self.sync.cache
        if view is self._reconciled_view:
            return {row["uuid"]: row["generation"]
                    for row in self.sync.client.get_tree(self.sync.root_uuid)}
        self._reconciled_view = view
        return {p.uuid: p.generation for p in view}

    def reconcile(self, at_start: bool, fix: bool = True) -> Report:
        """Compare store, guests and Placement; Placement's part is left out
        when it does not answer. Placement's allocations are read only on
        the providers where they may have changed (AllocationView)."""
        if self._drop_allocations.is_set():
            self._drop_allocations.clear()
            self.allocations.clear()
        self.allocations.touch(self.manager.tracker.take_touched_providers())
        level, why = logging.WARNING, "Placement's tree is not read yet"
        try:
            allocations = self.allocations.consumers(self._generations(),
                                                     self.sync.root_uuid)
        except DependencyUnavailable as e:
            allocations, why = None, str(e)
            # The cycle before said it went away, once.
            if self.dependencies.snapshot()[e.dependency].health is Health.DOWN:
                level = logging.DEBUG
        except PlacementError as e:
            allocations, why = None, str(e)
        if allocations is None:
            # Outside the except clauses: oslo.log would append the exception.
            LOG.log(level, "Reconciling without Placement's allocations: %s", why)
        elsewhere = (self._allocations_elsewhere(allocations)
                     if at_start and allocations is not None else None)
        holds = {u: m for u in self.manager.tracker.snapshot()[0]
                 if allocations is not None
                 and (m := evacuation_migration_uuid(u, self.sync.root_uuid)) in allocations}
        report = reconcile(self.manager, allocations, at_start, fix,
                           grace=self.settings.orphan_grace_period, elsewhere=elsewhere,
                           drop_evacuation_hold=self._drop_evacuation_hold,
                           evacuation_holds=holds,
                           announced_timeout=self.settings.live_migration_announced_timeout,
                           end_announced_move=self._end_announced_move,
                           clock=self.wall_clock)
        self.metrics.findings(report.findings)
        return report

    def capacity(self) -> list[ProviderCapacity]:
        """Each provider's inventories and usage, from what the loop last
        read of Placement (the tree each cycle, the allocations when a
        reconciliation or heal read them): no request of its own."""
        return provider_capacity(self.last_tree, self.allocations.read_usages())

    def _our_providers(self) -> set[str]:
        return {p.uuid for p in self.sync.cache}

    def _allocations_elsewhere(self, allocations: dict[str, set[str]]
                               ) -> dict[str, set[str]] | None:
        """For each instance of ours with no allocation on our providers, the
        providers (not ours) that hold its allocations: one read per such
        instance, none in the steady state. None when Placement fails."""
        instances, _, _ = self.manager.tracker.snapshot()
        try:
            return self.consumers.providers_elsewhere(set(instances) - set(allocations),
                                                      self._our_providers())
        except (PlacementUnavailable, PlacementError) as e:
            LOG.warning("Evacuated instances not looked for: %s", e)
            return None

    def _drop_evacuation_hold(self, instance_uuid: str) -> None:
        """The evacuation's migration consumer held this host's share of the
        instance (allocation swap) until its guest here was gone: dropped,
        when all it holds is on our providers."""
        migration = evacuation_migration_uuid(instance_uuid, self.sync.root_uuid)
        if self.consumers.drop_if_ours(migration, self._our_providers()):
            LOG.info("Evacuation %s of instance %s: its hold on this host's "
                     "providers dropped", migration, instance_uuid)

    def _end_announced_move(self, move: Migration) -> None:
        """A live migration announced here that its conductor left: the
        migration's allocations, when all on our providers, go back to the
        instance (undoing the conductor's swap), then the move is rolled
        back here. Allocations elsewhere are not ours to move: refused."""
        self.consumers.give_back(move.uuid, move.instance_uuid, self._our_providers())
        self.manager.rollback_live_migration_at_source(move.uuid, move.instance_uuid)
        LOG.info("Live migration %s of instance %s never started; its conductor "
                 "is taken for gone: allocations returned, move ended", move.uuid,
                 move.instance_uuid)

    def probe_facts(self) -> ProbeFacts:
        """The daemon's state, as /healthz and /readyz judge it
        (compute_agent/daemon/probes.py): read from memory, Placement never asked."""
        started = self._turn_started
        return ProbeFacts(
            phase=self.phase,
            loop_running=self._thread is not None and self._thread.is_alive(),
            turn_seconds=None if started is None else time.monotonic() - started,
            turn_limit=self.settings.healthz_turn_limit,
            dead_threads=self.dead_threads(), cycle_succeeded=self._cycle_succeeded,
            last_problem=self._last_problem, store_problem=self._store_problem)

    def _store_moved(self, line: str) -> None:
        self._store_problem = line

    def run_cycle(self) -> CycleOutcome:
        """A cycle, timed and counted by result (metrics) and recorded
        (record_path). A dependency that goes away or comes back is one
        line each way (compute_agent/dependencies.py); every other failure is one
        line, and the next cycle tries again. It raises only
        AnotherAgentServesHost: then no cycle is to come."""
        started = time.monotonic()
        outcome = self._cycle()
        self.metrics.cycle_done(time.monotonic() - started, outcome.kind)
        if outcome.ok:
            self._last_success_at = time.time()
            self._cycle_succeeded = True
        self._last_problem = outcome.reason
        self._record(outcome)
        return outcome

    def _cycle(self) -> CycleOutcome:
        # Lines are logged after the except clauses: oslo.log would append
        # the exception being handled to them.
        unavailable: tuple[Dependency, str, str] | None = None
        try:
            self._check_placement_once()
            outcome = CycleOutcome(True, result=self.update_provider_tree())
        except AnotherAgentServesHost:
            raise  # the daemon's end (compute_agent/daemon/supervisor.py)
        except DriverUnavailable as e:
            unavailable = (Dependency.LIBVIRT, e.where, e.problem)
        except DependencyUnavailable as e:
            unavailable = (e.dependency, e.url, e.problem)
        except ConfigError as e:
            outcome = CycleOutcome(False, f"configuration error, cycle skipped: {e}",
                                   kind=CycleResult.CONFIG_ERROR)
        except (PlacementError, AgentError) as e:
            outcome = CycleOutcome(False, f"cycle failed: {e}", kind=CycleResult.FAILED)
        except Exception as e:  # the loop must outlive any bug in a cycle
            LOG.exception("update_provider_tree failed")
            return CycleOutcome(False, f"unexpected error: {type(e).__name__}: {e}",
                                kind=CycleResult.UNEXPECTED_ERROR)
        if unavailable is not None:
            self.dependencies.observe_path(self.cycle_path, *unavailable)
            return CycleOutcome(False, describe(*unavailable),
                                kind=unavailable_result(unavailable[0]))
        if outcome.ok:
            client = self.sync.client
            self.dependencies.observe_path(self.cycle_path, urls={
                Dependency.KEYSTONE: client.keystone_url or "",
                Dependency.PLACEMENT: client.url})
        else:
            LOG.warning("%s", outcome.reason)
        return outcome

    def _check_placement_once(self) -> None:
        """The start could not ask Placement whether another agent serves
        this host: ask now (one request). AnotherAgentServesHost ends the
        daemon; when Placement does not answer, the next cycle asks."""
        if self.placement_check is not None:
            self.placement_check.run(self.sync.client, self.sync.root_uuid)
            self.placement_check = None

    def _record(self, outcome: CycleOutcome) -> None:
        if self.settings.record_path is None:
            return
        record = cycle_record.CycleRecord(
            os.getpid(), time.time(), self._last_success_at,
            "" if outcome.ok else outcome.reason, self.dependencies.snapshot())
        try:
            cycle_record.write(self.settings.record_path, record)
        except OSError as e:
            if not self._record_failing:
                LOG.warning("Cannot record the cycle in %s: %s", self.settings.record_path,
                            e.strerror)
            self._record_failing = True
        else:
            self._record_failing = False

    def observe_broker(self) -> None:
        """The broker asked, its state moved (one line each way); the
        cycle's record then carries it."""
        if self.broker_watch is not None:
            broker.observe(self.dependencies, self.broker_watch.probe())

    def wake(self) -> None:
        """Start the next cycle now (something it reports has changed)."""
        self._wake.set()

    def drop_cache(self) -> None:
        self._drop_cache.set()
        self._drop_allocations.set()
        self._wake.set()

    def _loop(self, watchdog: Watchdog | None) -> None:
        while True:
            self._wait_for_next_cycle(self.settings.update_interval
                                      + self.draw_jitter(0, self.settings.update_jitter),
                                      watchdog)
            if self.stopping.is_set():
                return
            self._turn_started = time.monotonic()
            # Cleared before the cycle: a change seen during it wakes the
            # next one at once.
            self._wake.clear()
            if self.manager is not None:
                self._check_store_file()
            self.observe_broker()
            self.run_cycle()
            self._cycles += 1
            if self.manager is not None:
                self._resume_rebuilds_safely()
            if self.manager is not None and self._cycles % self.settings.reconcile_interval == 0:
                self._reconcile_safely(at_start=False)
            self._turn_started = None

    def _check_store_file(self) -> None:
        """Every cycle, as before each commit: a store removed or replaced
        under the agent is found even while nothing is written, and the
        daemon told (Store.on_moved) stops."""
        try:
            self.manager.tracker.store.check_file()
        except StoreError:
            pass  # told to the store's listeners, once

    def _wait_for_next_cycle(self, seconds: float, watchdog: Watchdog | None) -> None:
        """Sleep until the next cycle is due or something wakes the loop.
        A loop that waits is healthy: it pings the watchdog as it goes, so
        only a cycle that does not end stops the pings."""
        if watchdog is None:
            self._wake.wait(seconds)
            return
        due = time.monotonic() + seconds
        while True:
            watchdog.ping()
            left = due - time.monotonic()
            if left <= 0 or self._wake.wait(min(left, watchdog.interval)):
                return

    def _resume_rebuilds_safely(self) -> None:
        """Every cycle: the evacuations accepted here that no thread builds
        (a spawn failed, say) are built; in memory until there is one."""
        try:
            self.manager.resume_rebuilds()
        except Exception:  # the loop must outlive any bug in a resume
            LOG.exception("Resuming evacuations failed")

    def _reconcile_safely(self, at_start: bool) -> None:
        unavailable = None
        try:
            self.reconcile(at_start)
        except DriverUnavailable as e:
            unavailable = e
        except Exception:  # reconciling must not take the agent down
            LOG.exception("Reconciliation failed")
        if unavailable is not None:
            # Without the guests there is nothing to compare: the next pass
            # does it. libvirt's going away is said once, by whichever of
            # the cycle and this pass met it first (it may go between them).
            self.dependencies.failed(Dependency.LIBVIRT, unavailable.where,
                                     unavailable.problem)
            LOG.debug("Reconciliation skipped: %s", unavailable)

    def _heal_safely(self) -> None:
        """[heal] on_startup: one heal before RPC is served; a refusal or a
        failure leaves the host reserved until healed, and running."""
        try:
            run_heal(self)
        except AgentError as e:
            LOG.warning("Heal at start-up not done: %s", e)
        except Exception:  # start-up must outlive any bug in heal
            LOG.exception("Heal at start-up failed")

    def _align_store_safely(self) -> None:
        """The store's rows follow the allocations a heal moved, should that
        heal have been killed before it wrote them (compute_agent/heal/realign.py)."""
        try:
            align_store(self, DeviceIndex(self.manager.tracker.pools()))
        except (PlacementUnavailable, PlacementError) as e:
            LOG.warning("Store not aligned with Placement at start-up: %s", e)
        except Exception:  # start-up must outlive any bug here
            LOG.exception("Aligning the store with Placement failed")

    def restore_after_reboot(self) -> None:
        """Before the first cycle: the devices a host reboot took that the
        agent manages, back (compute_agent/health/vf_restore_run.py). A failure is
        logged; the cycles keep what is not back reserved."""
        if self.vf_restore is None:
            return
        try:
            self.vf_restore.restore(self.driver.boot_id())
        except (DriverUnavailable, StoreError, OSError) as e:
            LOG.warning("VF counts not restored at start-up: %s", e)
        except Exception:  # start-up must outlive any bug here
            LOG.exception("Restoring VF counts at start-up failed")

    def _restore_vgpu_types_safely(self) -> None:
        """Before the first cycle and before any claim, once the VFs are
        back: the vGPU VFs' types a reboot cleared written back from the
        store."""
        if self.manager is None:
            return
        try:
            self.vgpu_types_not_restored = restore_vgpu_types_after_reboot(
                self.manager, self.driver.boot_id())
        except Exception:  # start-up must outlive any bug here
            LOG.exception("Restoring the vGPU VFs' types failed")

    def start(self, watchdog: Watchdog | None = None) -> None:
        """Serve metrics (when [metrics] listen is set: a ConfigError when
        it cannot be bound), connect, wait up to update_jitter, run a
        first cycle, align the store with Placement and reconcile what a
        previous run left, then keep the loop going in its thread, pinging
        ``watchdog`` while it is healthy."""
        if self.settings.metrics_listen:
            self.metrics.serve(self.settings.metrics_listen, {
                "/healthz": lambda: liveness(self.probe_facts()),
                "/readyz": lambda: readiness(self.probe_facts())})
        self.driver.init_host()
        self.restore_after_reboot()
        self._restore_vgpu_types_safely()
        # Spread as the loop's later cycles are: a fleet started at once
        # (after an upgrade, a power cut) would otherwise send every first
        # cycle, each with its reads of the allocations, in the same second.
        self.stopping.wait(self.draw_jitter(0, self.settings.update_jitter))
        if self.settings.heal_on_startup:
            self._heal_safely()
        self.observe_broker()
        self.run_cycle()
        self._cycles = 1
        if self.manager is not None:
            self._align_store_safely()
            self._reconcile_safely(at_start=True)
        self._thread = threading.Thread(target=self._loop, args=(watchdog,),
                                        name=UPDATE_THREAD, daemon=True)
        self._thread.start()
        self.health.start()
        if self.cleaner is not None:
            self.cleaner.start()

    def stop(self, timeout: float = 60) -> None:
        """Let a cycle in flight finish (its Placement calls time out on
        their own), then release the driver."""
        self.phase = Phase.STOPPING
        self.stopping.set()
        self._wake.set()
        self.health.stop()
        if self.cleaner is not None:
            self.cleaner.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.broker_watch is not None:
            self.broker_watch.close()
        self.metrics.stop()
        self.driver.cleanup()
        if self.manager is not None:
            self._store_problem = "closed"
            try:
                self.manager.tracker.store.close()
            except StoreError as e:
                # Everything acknowledged is on disk already; only the mark
                # of a clean stop is missing.
                LOG.warning("Store not marked closed; the next start treats it "
                            "as after a crash: %s", e)
