"""The update loop's reconciliation (compute_agent/compute/reconcile.py), with
what it reads of Placement: the consumers on our providers, read only
where they may have changed (AllocationView), and, one consumer at a time
(compute_agent/placement/consumers.py), an evacuated instance's allocations
elsewhere, an evacuation's hold to drop, an announced move's allocations
to give back."""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from compute_agent.claims.model import Migration
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.reconcile import ReconcileInputs, Report, reconcile
from compute_agent.dependencies import Dependencies, Health
from compute_agent.exception import DependencyUnavailable, PlacementError, PlacementUnavailable
from compute_agent.metrics import Metrics
from compute_agent.moves.evacuation import evacuation_migration_uuid
from compute_agent.placement.allocations import AllocationView
from compute_agent.placement.consumers import Consumers
from compute_agent.placement.sync import TreeSync
from compute_agent.tree.provider_tree import ProviderTree

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimeBounds:
    """A reconciliation's time bounds, as the agent's settings say when it
    runs: how long devices whose guest has gone stay held
    (orphan_grace_period), after how long a live migration announced here
    and never started is taken for its conductor's loss, and the
    wall-clock time now, which the store's change times are in."""

    grace: float
    announced_timeout: float
    clock: Callable[[], float]


class Reconciliation:
    """The loop's reconciliation of the manager it is given (the agent's,
    which a test may replace as a restart would)."""

    def __init__(self, sync: TreeSync, allocations: AllocationView,
                 consumers: Consumers, dependencies: Dependencies, metrics: Metrics):
        self.sync = sync
        self.allocations = allocations
        self.consumers = consumers
        self.dependencies = dependencies
        self.metrics = metrics
        # The view of Placement the last reconciliation used: while it is
        # still the cache, no cycle has read the tree since.
        self._reconciled_view: ProviderTree | None = None
        self._drop_allocations = threading.Event()

    def drop_allocations(self) -> None:
        """The next reconciliation reads every provider's allocations (SIGHUP)."""
        self._drop_allocations.set()

    def _generations(self) -> dict[str, int | None]:
        """Our providers' generations: from the latest cycle's read of the
        tree, or, when no cycle has read it since the last reconciliation
        (they failed), from a read of our own (one request): generations
        no newer than those a reconciliation already used would hide a
        change. None before any cycle of this process has read it: the
        view an earlier run saved matches the allocations it saved, and
        would be taken for Placement's answer while Placement is away."""
        view = self.sync.cache
        if not self.sync.read_this_run:
            return {}
        if view is self._reconciled_view:
            return {row["uuid"]: row["generation"]
                    for row in self.sync.client.get_tree(self.sync.root_uuid)}
        self._reconciled_view = view
        return {p.uuid: p.generation for p in view}

    def run(self, manager: ComputeManager, at_start: bool, fix: bool, bounds: TimeBounds
            ) -> Report:
        """Compare store, guests and Placement; Placement's part is left out
        when it does not answer. Placement's allocations are read only on
        the providers where they may have changed (AllocationView)."""
        if self._drop_allocations.is_set():
            self._drop_allocations.clear()
            self.allocations.clear()
        self.allocations.touch(manager.tracker.take_touched_providers())
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
        elsewhere = (self._allocations_elsewhere(manager, allocations)
                     if at_start and allocations is not None else None)
        holds = {u: m for u in manager.tracker.snapshot()[0]
                 if allocations is not None
                 and (m := evacuation_migration_uuid(u, self.sync.root_uuid)) in allocations}
        report = reconcile(manager, ReconcileInputs(
            allocations, at_start, fix, grace=bounds.grace, elsewhere=elsewhere,
            drop_evacuation_hold=self._drop_evacuation_hold, evacuation_holds=holds,
            announced_timeout=bounds.announced_timeout,
            end_announced_move=functools.partial(self._end_announced_move, manager),
            clock=bounds.clock))
        self.metrics.findings(report.findings)
        return report

    def _our_providers(self) -> set[str]:
        return {p.uuid for p in self.sync.cache}

    def _allocations_elsewhere(self, manager: ComputeManager, allocations: dict[str, set[str]]
                               ) -> dict[str, set[str]] | None:
        """For each instance of ours with no allocation on our providers, the
        providers (not ours) that hold its allocations: one read per such
        instance, none in the steady state. None when Placement fails."""
        instances, _, _ = manager.tracker.snapshot()
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

    def _end_announced_move(self, manager: ComputeManager, move: Migration) -> None:
        """A live migration announced here that its conductor left: the
        migration's allocations, when all on our providers, go back to the
        instance (undoing the conductor's swap), then the move is rolled
        back here. Allocations elsewhere are not ours to move: refused."""
        self.consumers.give_back(move.uuid, move.instance_uuid, self._our_providers())
        manager.rollback_live_migration_at_source(move.uuid, move.instance_uuid)
        LOG.info("Live migration %s of instance %s never started; its conductor "
                 "is taken for gone: allocations returned, move ended", move.uuid,
                 move.instance_uuid)
