"""The agent process: the periodic update_provider_tree loop, which pings
systemd's watchdog while it is healthy. Native threads only (no eventlet)."""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from oslo_config import cfg

from compute_agent.cleaning.rules import apply_uses
from compute_agent.cleaning.run import Cleaner
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.reconcile import Report
from compute_agent.compute.vgpu_types import still_not_restored
from compute_agent.daemon import cycle_record, start_up
from compute_agent.daemon.errors import AnotherAgentServesHost
from compute_agent.daemon.one_agent_run import PlacementCheck
from compute_agent.daemon.probes import Phase, ProbeFacts, liveness, readiness
from compute_agent.daemon.reconciliation import Reconciliation, TimeBounds
from compute_agent.daemon.systemd import Watchdog
from compute_agent.dependencies import Dependencies, Dependency, describe
from compute_agent.drivers.base import DeviceKind, HostInventory
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import DriverUnavailable, InvalidHostData
from compute_agent.exception import (
    AgentError,
    ConfigError,
    DependencyUnavailable,
    PlacementError,
)
from compute_agent.health.rules import hold_vgpu_vfs_not_restored
from compute_agent.health.run import HealthSettings, HealthWatch
from compute_agent.health.vf_restore_run import VfRestore
from compute_agent.metrics import CycleResult, Metrics, ProviderCapacity, provider_capacity
from compute_agent.placement.allocations import AllocationView
from compute_agent.placement.sync import SyncResult, TreeSync
from compute_agent.rpc import broker
from compute_agent.rpc.host_server import ServerWatch
from compute_agent.store.errors import StoreError
from compute_agent.store.queries import (
    allocation_view,
    placement_view,
    put_allocation_view_sql,
    put_placement_view_sql,
)
from compute_agent.store.store import Store
from compute_agent.tree.host_tree import BuiltTree, TreePolicy, build_tree
from compute_agent.tree.provider_tree import Provider, ProviderTree

LOG = logging.getLogger(__name__)


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


UPDATE_THREAD = "update-provider-tree"


def saved_view(store: Store) -> ProviderTree:
    """The view of Placement an earlier run saved; an empty one when it
    does not form a tree (Placement is then read afresh)."""
    try:
        return ProviderTree.parents_first(store.read(placement_view))
    except ValueError as e:
        LOG.warning("Saved view of Placement unusable, reading it afresh: %s", e)
        return ProviderTree()


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
    health: HealthSettings = field(default_factory=HealthSettings)
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
            health=HealthSettings(
                conf.devices.health_poll_interval,
                conf.devices.health_correctable_errors_per_minute),
            record_path=cycle_record.path_in(conf.state_path) if holder else None)


class Agent:
    """The update loop, from start() to stop(): a cycle every update_interval
    (or when woken), a reconciliation every reconcile_interval cycles. Its
    collaborators come built (compute_agent/daemon/composition.py)."""

    def __init__(self, driver: ComputeDriver, policy: TreePolicy, sync: TreeSync,
                 allocations: AllocationView, manager: ComputeManager, *,
                 reconciliation: Reconciliation, cleaner: Cleaner, vf_restore: VfRestore,
                 health: HealthWatch, dependencies: Dependencies, wake: threading.Event,
                 metrics: Metrics, settings: AgentSettings = AgentSettings(),
                 broker_watch: ServerWatch | None = None,
                 placement_check: PlacementCheck | None = None,
                 dead_threads: Callable[[], tuple[str, ...]] = tuple):
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
        self.metrics = metrics
        self.metrics.watch_assignments(manager.tracker.held_by_class)
        self.allocations = allocations
        self.reconciliation = reconciliation
        self._cycles = 0
        # Placement's view after the last cycle that reached it, for RPC
        # readers: replaced whole, never changed in place.
        self.last_tree = ProviderTree()
        self.metrics.watch_capacity(self.capacity)
        # Placement's view as last saved: a restart trusts each provider in
        # it until its generation moves.
        saved = saved_view(manager.tracker.store)
        sync.restore(saved.copy())
        self._saved_view = saved.depth_first()
        self._view_saved = True
        # Placement's allocations as last read: a restart reads again only
        # where they may have changed (compute_agent/placement/allocations.py). A
        # reader beside the agent (audit) reads them afresh.
        store = manager.tracker.store
        if not store.read_only:
            allocations.restore(store.read(allocation_view))
        self._saved_allocations = allocations.saved()
        self.stopping = threading.Event()
        self._wake = wake
        self._drop_cache = threading.Event()
        self._thread: threading.Thread | None = None
        # One-time-use devices' cleaning (compute_agent/cleaning/).
        self.cleaner = cleaner
        self.vf_restore = vf_restore
        self.health = health
        # What each cycle asks, in order: the hypervisor, then Keystone
        # (when the auth plugin uses it) for a token, then Placement.
        self.dependencies = dependencies
        self.cycle_path = ((Dependency.LIBVIRT,)
                           + ((Dependency.KEYSTONE,) if sync.client.keystone_url else ())
                           + (Dependency.PLACEMENT,))
        self.recorder = cycle_record.Recorder(settings.record_path)
        # Looked at by the loop before each cycle, once the daemon's RPC
        # server serves; None: no broker to watch.
        self.broker_watch = broker_watch
        # Whether another agent serves this host, when the start could not
        # ask Placement: asked by the first cycle that reaches it.
        self.placement_check = placement_check
        # What the probes read (probe_facts). The daemon (compute_agent/cmd/daemon.py)
        # moves the phase on once RPC is served (move_to), and tells the
        # threads that died.
        self.phase = Phase.STARTING
        self.dead_threads = dead_threads
        self._cycle_succeeded = False
        self._last_problem = ""
        # time.monotonic() when the loop's turn in progress began; None
        # while it waits.
        self._turn_started: float | None = None
        self._store_problem = ""
        manager.tracker.store.on_moved(self._store_moved)

    def build_model(self, inventory: HostInventory) -> BuiltTree:
        """The tree to report for ``inventory``: the policy's, with the
        devices found unhealthy taken out of scheduling. Every reader that
        compares with Placement (a cycle, heal, manage tree) builds it
        here, so none takes the agent's own health marks for drift, nor
        its VFs not back after a reboot (compute_agent/health/vf_restore_run.py), nor
        its VFs whose vGPU type is not back, nor its used one-time-use
        devices (compute_agent/cleaning/rules.py)."""
        inventory, known_bad = self.vf_restore.apply(inventory)
        built = self.health.apply(build_tree(inventory, self.policy), inventory, known_bad)
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
        self.cleaner.set_specs(built.one_time_use)
        self.vf_restore.observe(inventory, built)
        self._read_guests()
        # Claims see what this cycle takes out (a device's health, its
        # use) before Placement reserves it: a claim on its way when the
        # scheduler stops offering a device must not get it either.
        self._set_pools(built)
        try:
            result = self.sync.sync(built.tree)
            self.last_tree = self.sync.cache.copy()
            self._save_view(self.last_tree.depth_first())
        finally:
            # Claims work from the host's devices even when Placement does
            # not answer, with the provider UUIDs it last showed us.
            self._set_pools(built)
            self._mark_held_used()
        LOG.debug("update_provider_tree: %d providers, %d writes",
                  len(built.tree), result.writes)
        return result

    def _set_pools(self, built: BuiltTree) -> None:
        """The tracker's pools from ``built``, under the provider UUIDs
        Placement last showed us (a new provider's: the model's own)."""
        self.manager.tracker.set_pools(built.pools_by_uuid(
            {p.name: p.uuid for p in self._saved_view}))

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
        if view != self._saved_view or not self._view_saved:
            try:
                self.manager.tracker.store.write(put_placement_view_sql(view))
                self._view_saved = True
            except StoreError as e:
                self._view_saved = False
                LOG.warning("Placement's view not saved; the next cycle tries "
                            "again: %s", e)
        self._saved_view = view

    def _save_allocations(self) -> None:
        """Keep the allocations as last read in the store for the next
        start: a cache, as the view of Placement is (_save_view)."""
        reads = self.allocations.saved()
        store = self.manager.tracker.store
        if reads == self._saved_allocations or store.read_only:
            return
        try:
            store.write(put_allocation_view_sql(reads))
            self._saved_allocations = reads
        except StoreError as e:
            LOG.warning("Placement's allocations not saved; the next reconciliation "
                        "tries again: %s", e)

    def reconcile(self, at_start: bool, fix: bool = True) -> Report:
        """Compare store, guests and Placement (compute_agent/daemon/reconciliation.py),
        then save the allocations read."""
        report = self.reconciliation.run(self.manager, at_start, fix, TimeBounds(
            self.settings.orphan_grace_period,
            self.settings.live_migration_announced_timeout, self.wall_clock))
        self._save_allocations()
        return report

    def capacity(self) -> list[ProviderCapacity]:
        """Each provider's inventories and usage, from what the loop last
        read of Placement (the tree each cycle, the allocations when a
        reconciliation or heal read them): no request of its own."""
        return provider_capacity(self.last_tree, self.allocations.read_usages())

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
            self._cycle_succeeded = True
        self._last_problem = outcome.reason
        self.recorder.cycle_ended(outcome.ok, outcome.reason, self.dependencies.snapshot())
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
        this host: ask now, with the tree read that this cycle then uses.
        AnotherAgentServesHost ends the daemon; when Placement does not
        answer, the next cycle asks."""
        if self.placement_check is not None:
            tree = self.placement_check.run(self.sync.client, self.sync.root_uuid)
            if tree is not None:
                self.sync.prime(tree)
            self.placement_check = None

    def observe_broker(self) -> None:
        """The broker asked, its state moved (one line each way); the
        cycle's record then carries it."""
        if self.broker_watch is not None:
            broker.observe(self.dependencies, self.broker_watch.probe())

    def move_to(self, phase: Phase) -> None:
        """The daemon reached ``phase`` (RPC served, its stop begun)."""
        self.phase = phase

    def wake(self) -> None:
        """Start the next cycle now (something it reports has changed)."""
        self._wake.set()

    def drop_cache(self) -> None:
        self._drop_cache.set()
        self.reconciliation.drop_allocations()
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
            self._check_store_file()
            self.observe_broker()
            self.run_cycle()
            self._cycles += 1
            self._resume_rebuilds_safely()
            if self._cycles % self.settings.reconcile_interval == 0:
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
        start_up.restore_after_reboot(self.vf_restore, self.driver)
        self.vgpu_types_not_restored = start_up.restore_vgpu_types(self.manager, self.driver)
        # Spread as the loop's later cycles are: a fleet started at once
        # (after an upgrade, a power cut) would otherwise send every first
        # cycle, each with its reads of the allocations, in the same second.
        self.stopping.wait(self.draw_jitter(0, self.settings.update_jitter))
        if self.settings.heal_on_startup:
            start_up.heal_safely(self)
        self.observe_broker()
        self.run_cycle()
        self._cycles = 1
        start_up.align_store_safely(self)
        self._reconcile_safely(at_start=True)
        self._thread = threading.Thread(target=self._loop, args=(watchdog,),
                                        name=UPDATE_THREAD, daemon=True)
        self._thread.start()
        self.health.start()
        self.cleaner.start()

    def stop(self, timeout: float = 60) -> None:
        """Let a cycle in flight finish (its Placement calls time out on
        their own), then release the driver."""
        self.phase = Phase.STOPPING
        self.stopping.set()
        self._wake.set()
        self.health.stop()
        self.cleaner.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.broker_watch is not None:
            self.broker_watch.close()
        self.metrics.stop()
        self.driver.cleanup()
        self._store_problem = "closed"
        try:
            self.manager.tracker.store.close()
        except StoreError as e:
            # Everything acknowledged is on disk already; only the mark
            # of a clean stop is missing.
            LOG.warning("Store not marked closed; the next start treats it "
                        "as after a crash: %s", e)
