"""SR-IOV VFs back after a host reboot: the run of compute_agent/health/vf_restore.py's
rules against the driver and the store. ``restore`` runs once, at start-up,
before the first cycle (so before inventory is reported and claims are
served); each cycle then shows the VFs not restored as reserved units
(``apply``) and keeps the record up to date (``observe``)."""
from __future__ import annotations

import logging
import time
from dataclasses import replace

from compute_agent.drivers.base import DeviceKind, HostInventory, HostResourceKind
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import DriverUnavailable, InvalidHostData, SriovError
from compute_agent.health.rules import DeviceVerdict
from compute_agent.health.vf_restore import (
    NotRestored,
    PfOutcome,
    PfPlan,
    SriovRecord,
    VfCount,
    not_restored_verdicts,
    plan_pf,
    record_from_json,
    record_to_json,
    still_missing,
    updated_record,
    verify_pf,
    vfs_in_use,
    with_missing_vfs,
)
from compute_agent.store.errors import StoreError
from compute_agent.store.queries import meta_value, put_meta_sql
from compute_agent.store.schema import SRIOV_RECORD, VFS_RESTORED_BOOT
from compute_agent.store.store import Store
from compute_agent.tree.host_tree import BuiltTree

LOG = logging.getLogger(__name__)


class VfRestore:
    def __init__(self, driver: ComputeDriver, store: Store,
                 vf_counts: tuple[tuple[str, int], ...]) -> None:
        self._driver = driver
        self._store = store
        self._configured = dict(vf_counts)
        try:
            self.record: SriovRecord = record_from_json(store.read(meta_value(SRIOV_RECORD)))
        except ValueError as e:
            # Restored from nothing this time; the next cycles record anew.
            LOG.warning("Store: %s; the VF counts recorded are not used", e)
            self.record = {}
        # The VFs a reboot took that are not back, until they are.
        self.missing: list[NotRestored] = []

    def restore(self, boot_id: str) -> list[PfOutcome]:
        """After a reboot (the boot ID is not the one last restored), set
        each managed PF's VF count; at every start, verify each recorded VF.
        One line per VF not restored; the boot is recorded as restored."""
        began = time.monotonic()
        rebooted = self._store.read(meta_value(VFS_RESTORED_BOOT)) != boot_id
        wanted = {a: pf.num_vfs for a, pf in self.record.items()} | self._configured
        held, mdev_parents = self._in_use() if rebooted and wanted else (None, None)
        outcomes = [self._restore_pf(VfCount(address, count, address in self._configured),
                                     rebooted, held, mdev_parents)
                    for address, count in sorted(wanted.items())]
        self.missing = [m for o in outcomes for m in o.not_restored]
        for o in outcomes:
            for m in o.not_restored:
                LOG.warning("%s", m.line())
            if o.problem:
                LOG.warning("%s", o.problem)
            elif o.plan.problem and not o.not_restored:
                LOG.info("PF %s: %s", o.plan.address, o.plan.problem)
        written = [o for o in outcomes if o.plan.writes and not o.plan.problem]
        if written:
            LOG.info("VF counts restored after the reboot in %.2f s: %s",
                     time.monotonic() - began,
                     ", ".join(f"{o.plan.address} {o.plan.wanted}" for o in written))
        if rebooted and not self._store.read_only:
            self._store.write(put_meta_sql(VFS_RESTORED_BOOT, boot_id))
        return outcomes

    def _in_use(self) -> tuple[frozenset[str] | None, frozenset[str] | None]:
        """The PCI addresses running guests hold and the mdevs' parents;
        None when the hypervisor cannot tell (then every VF counts as in
        use: unknown is not free)."""
        try:
            holdings = self._driver.guest_holdings(reread=True)
            mdevs = self._driver.get_host_inventory().mdevs
        except (DriverUnavailable, InvalidHostData) as e:
            LOG.warning("VFs in use not known (%s): no VF count is changed", e)
            return None, None
        held = frozenset(r.id for g in holdings.values() if g.running for r in g.resources
                         if r.kind is HostResourceKind.PCI_ADDRESS)
        return held, frozenset(m.parent_address for m in mdevs)

    def _restore_pf(self, count: VfCount, rebooted: bool, held: frozenset[str] | None,
                    mdev_parents: frozenset[str] | None) -> PfOutcome:
        address = count.address
        record = self.record.get(address)
        try:
            found = self._driver.sriov_functions(address)
        except InvalidHostData as e:
            return verify_pf(PfPlan(address, count.wanted, problem=str(e)), record, None)
        in_use = (held is None or mdev_parents is None
                  or (found is not None and vfs_in_use(found, held, mdev_parents)))
        plan = plan_pf(count, record, found, in_use, rebooted)
        for written in plan.writes:
            try:
                self._driver.set_num_vfs(address, written)
            except SriovError as e:
                plan = replace(plan, problem=str(e))
                break
        if plan.writes:
            try:
                found = self._driver.sriov_functions(address)
            except InvalidHostData as e:
                plan, found = replace(plan, problem=str(e)), None
        return verify_pf(plan, record, found)

    def apply(self, inv: HostInventory) -> tuple[HostInventory, dict[str, DeviceVerdict]]:
        """The inventory a cycle builds its tree from, with the VFs not
        restored in it, and their verdicts; a VF found back is dropped from
        the list, with a line."""
        if not self.missing:
            return inv, {}
        left = still_missing(self.missing, inv)
        for m in self.missing:
            if m not in left:
                LOG.info("VF %s of PF %s is back: its unit returns to scheduling",
                         m.address, m.pf_address)
        self.missing = left
        return with_missing_vfs(inv, left), not_restored_verdicts(left)

    def observe(self, inv: HostInventory, built: BuiltTree) -> None:
        """Record each managed PF seen with all its VFs (the PFs whose VFs
        the tree offers, and those [pci] vf_counts names); written only
        when it changed, by the agent that holds the store."""
        if self._store.read_only:
            return
        devices = {d.address: d for d in inv.pci_devices}
        managed = frozenset(self._configured) | frozenset(
            parent for p in built.pools if p.kind is DeviceKind.VF for s in p.slots
            if s.device_id in devices and (parent := devices[s.device_id].parent_address))
        record = updated_record(self.record, inv, managed, self.missing)
        if record == self.record:
            return
        try:
            self._store.write(put_meta_sql(SRIOV_RECORD, record_to_json(record)))
        except StoreError as e:
            LOG.warning("VF counts not recorded; the next cycle tries again: %s", e)
            return
        self.record = record
