"""SR-IOV VFs back after a host reboot: what to write, what to verify, what
to record (pure: the host's answers in, writes, lines and the tree's
changes out; compute_agent/health/vf_restore_run.py asks the driver and the store).

A reboot leaves every PF without VFs (``sriov_numvfs`` 0), and guests
whose VFs are gone cannot start. Before the agent reports inventory or
serves a claim it sets each managed PF's VF count again: the one
``[pci] vf_counts`` gives, else the one recorded when the PF was last
seen with all its VFs (``SriovRecord``, in the store). It then verifies
each recorded VF by address and vendor/device ids (never by IOMMU group:
group numbers may change across reboots), and each VF it could not
restore is one line and stays in the tree, its unit reserved, with
``CUSTOM_HW_DEVICE_UNHEALTHY_NOT_RESTORED`` (as device health keeps a bad
VF's unit reserved) until it is back.

The kernel's ABI (Documentation/ABI/testing/sysfs-bus-pci) decides the
writes: a non-zero count while VFs exist is refused with EBUSY, so another
count takes 0 first, which destroys the VFs. That is done only for a PF the
operator listed in ``[pci] vf_counts``, and never while a VF of it is in
use (a running guest holds it, or an mdev sits on it: mdevctl's definitions
are started by udev before the agent, and are not fought). A PF whose VFs
exist with a count someone else set is left as it is.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from compute_agent.drivers.base import HostInventory, PciDevice, PciKind, SriovFunctions
from compute_agent.health.rules import DeviceFault, DeviceVerdict


@dataclass(frozen=True)
class RecordedVf:
    address: str
    vendor_id: str
    product_id: str


@dataclass(frozen=True)
class RecordedPf:
    """A PF as last seen with all its VFs, which its VF count restores."""

    address: str
    vendor_id: str
    product_id: str
    num_vfs: int
    vfs: tuple[RecordedVf, ...] = ()

    def to_json(self) -> dict:
        return {"vendor_id": self.vendor_id, "product_id": self.product_id,
                "num_vfs": self.num_vfs,
                "vfs": [[v.address, v.vendor_id, v.product_id] for v in self.vfs]}


# PF address -> what was recorded of it.
SriovRecord = dict[str, RecordedPf]


def record_to_json(record: SriovRecord) -> str:
    return json.dumps({a: pf.to_json() for a, pf in sorted(record.items())}, sort_keys=True)


def record_from_json(text: str | None) -> SriovRecord:
    """Raises ValueError naming the PF and the field that is not ours."""
    if text is None:
        return {}
    out: SriovRecord = {}
    for address, pf in json.loads(text).items():
        try:
            out[address] = RecordedPf(
                address, str(pf["vendor_id"]), str(pf["product_id"]), int(pf["num_vfs"]),
                tuple(RecordedVf(str(a), str(v), str(p)) for a, v, p in pf["vfs"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"VF record of PF {address}: {type(e).__name__}: {e}") from None
    return out


def recorded(pf: PciDevice, vfs: tuple[PciDevice, ...]) -> RecordedPf:
    return RecordedPf(pf.address, pf.vendor_id, pf.product_id, pf.num_vfs,
                      tuple(RecordedVf(v.address, v.vendor_id, v.product_id) for v in vfs))


# --- the writes -------------------------------------------------------------------


@dataclass(frozen=True)
class PfPlan:
    """What to write to one PF's ``sriov_numvfs``, in order; ``problem``
    says why the count it should have is not written."""

    address: str
    wanted: int
    writes: tuple[int, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class VfCount:
    """The VF count one PF is to have: the operator's ([pci] vf_counts,
    ``configured``), or the one recorded before the reboot."""

    address: str
    wanted: int
    configured: bool


def plan_pf(count: VfCount, record: RecordedPf | None, found: SriovFunctions | None,
            in_use: bool, rebooted: bool) -> PfPlan:
    """The writes that give the PF its count, or none and why. Only after
    a reboot (``rebooted``) is anything written."""
    address, wanted = count.address, count.wanted
    if found is None:
        return PfPlan(address, wanted, problem="PF not found")
    pf = found.pf
    ids = (pf.vendor_id, pf.product_id)
    if record is not None and ids != (record.vendor_id, record.product_id):
        return PfPlan(address, wanted, problem=(
            f"the device there is {pf.vendor_id}:{pf.product_id}, the PF recorded was "
            f"{record.vendor_id}:{record.product_id}; not touched"))
    if pf.kind is not PciKind.PF:
        return PfPlan(address, wanted, problem="not an SR-IOV PF (no sriov_totalvfs)")
    if wanted > pf.total_vfs:
        return PfPlan(address, wanted, problem=(
            f"{wanted} VFs wanted, sriov_totalvfs is {pf.total_vfs}"))
    current = pf.num_vfs
    if not rebooted or current == wanted:
        return PfPlan(address, wanted)
    if current == 0:
        return PfPlan(address, wanted, (wanted,))
    if count.configured and not in_use:
        return PfPlan(address, wanted, (0, wanted) if wanted else (0,))
    why = "a VF of it is in use" if in_use else "set by someone else"
    return PfPlan(address, wanted, problem=f"has {current} VFs ({why}); left as it is")


def vfs_in_use(found: SriovFunctions, held_addresses: frozenset[str],
               mdev_parents: frozenset[str]) -> bool:
    """A VF of the PF is held by a running guest or hosts an mdev."""
    return any(v.address in held_addresses or v.address in mdev_parents for v in found.vfs)


# --- the verification ---------------------------------------------------------------


@dataclass(frozen=True)
class NotRestored:
    """A VF that is not back as it was recorded, and why."""

    address: str
    vendor_id: str
    product_id: str
    pf_address: str
    reason: str

    def line(self) -> str:
        return (f"VF {self.address} ({self.vendor_id}:{self.product_id}) of PF "
                f"{self.pf_address} not restored after the reboot: {self.reason}; "
                "its unit stays reserved")


@dataclass
class PfOutcome:
    plan: PfPlan
    not_restored: list[NotRestored] = field(default_factory=list)
    # A line for a PF whose VFs are not known by address (no record).
    problem: str | None = None


def verify_pf(plan: PfPlan, record: RecordedPf | None, found: SriovFunctions | None
              ) -> PfOutcome:
    """Each recorded VF within the wanted count, by address and ids, in
    ``found`` (read after the writes); without a record, the count."""
    why = plan.problem or "missing after the VF count was set"
    out = PfOutcome(plan)
    present = {v.address: v for v in (found.vfs if found else ())}
    for vf in (record.vfs[:plan.wanted] if record else ()):
        got = present.get(vf.address)
        if got is None:
            out.not_restored.append(NotRestored(vf.address, vf.vendor_id, vf.product_id,
                                                plan.address, why))
        elif (got.vendor_id, got.product_id) != (vf.vendor_id, vf.product_id):
            out.not_restored.append(NotRestored(
                vf.address, vf.vendor_id, vf.product_id, plan.address,
                f"the device there is {got.vendor_id}:{got.product_id}"))
    if record is None and len(present) != plan.wanted:
        out.problem = (f"PF {plan.address}: {len(present)} VFs, {plan.wanted} wanted "
                       f"([pci] vf_counts): {why}")
    return out


# --- what the tree shows of them ------------------------------------------------------


def with_missing_vfs(inv: HostInventory, missing: list[NotRestored]) -> HostInventory:
    """The inventory with each VF not restored that it lacks, as it was
    recorded, so that its unit stays in its PF's provider (reserved, by
    ``not_restored_verdicts``) while the guest holding it waits for it."""
    if not missing:
        return inv
    have = {d.address: d for d in inv.pci_devices}
    extra = tuple(PciDevice(m.address, m.vendor_id, m.product_id, PciKind.VF,
                            have[m.pf_address].numa_node if m.pf_address in have else None,
                            parent_address=m.pf_address)
                  for m in missing if m.address not in have)
    return replace(inv, pci_devices=inv.pci_devices + extra)


def not_restored_verdicts(missing: list[NotRestored]) -> dict[str, DeviceVerdict]:
    return {m.address: DeviceVerdict(m.address, frozenset({DeviceFault.NOT_RESTORED}),
                                     (f"not restored after the reboot: {m.reason}",))
            for m in missing}


def still_missing(missing: list[NotRestored], inv: HostInventory) -> list[NotRestored]:
    """Those that the host does not show back, with their ids."""
    have = {(d.address, d.vendor_id, d.product_id) for d in inv.pci_devices}
    return [m for m in missing if (m.address, m.vendor_id, m.product_id) not in have]


# --- the record ---------------------------------------------------------------------


def updated_record(record: SriovRecord, inv: HostInventory, managed: frozenset[str],
                   missing: list[NotRestored]) -> SriovRecord:
    """The record after a cycle read ``inv``: each ``managed`` PF seen with
    all its VFs (as many as sriov_numvfs says) and none of them missing is
    recorded as it is; others keep what was recorded, so a reboot whose
    restore failed never lowers what the next one restores."""
    out = dict(record)
    pending = {m.pf_address for m in missing}
    devices = {d.address: d for d in inv.pci_devices}
    for address in sorted(managed - pending):
        pf = devices.get(address)
        if pf is None or pf.kind is not PciKind.PF or pf.num_vfs == 0:
            continue
        vfs = tuple(sorted((d for d in inv.pci_devices if d.parent_address == address),
                           key=lambda d: d.address))
        if len(vfs) == pf.num_vfs:
            out[address] = recorded(pf, vfs)
    return out
