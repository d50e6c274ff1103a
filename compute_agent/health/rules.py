"""Device health: which watched devices are bad, and what that does to the
provider tree (pure: signals in, verdicts and a tree out; the reading is
the driver's, the polling compute_agent/health/run.py's).

What makes a device bad, each a ``DeviceFault``:

- ``GONE``: its sysfs directory is gone (hot-removed, or dropped off the
  bus).
- ``CONFIG_SPACE``: its vendor id reads 0xffff, from the ``vendor`` file or
  from the first bytes of ``config``, or ``config`` cannot be read: the
  device no longer answers.
- ``AER_FATAL``, ``AER_NONFATAL``: the TOTAL_ERR_FATAL or TOTAL_ERR_NONFATAL
  count rose above what it was when the watch first saw the device. Any
  rise: an uncorrectable error means data was lost or the link was reset.
  It stays bad until the counts start again from lower (the device was
  removed and found again, which is when the kernel restarts them) or the
  agent restarts (the counts it then finds are its new baseline: the
  errors they hold happened before, and the kernel's recovery has run).
- ``AER_CORRECTABLE``: TOTAL_ERR_COR rose by ``correctable_per_minute`` or
  more within the last minute. Corrected errors are normal now and then; a
  steady stream is a failing link. It recovers by itself once a minute
  holds fewer.
- ``VF_COUNT``: a PF's ``sriov_numvfs`` (the VFs enabled) differs from the
  VFs that still exist behind its ``virtfnN`` links.
- ``LINK_DOWN``: one of its network interfaces has no carrier while it is
  administratively up. An interface an operator took down is not judged.
- ``NOT_RESTORED``: a VF that a host reboot took away and the agent could
  not create again (compute_agent/health/vf_restore.py); not judged from signals.

A device the driver says nothing of, and a file a device does not have
(no AER capability, not a PF, no netdev) leave that rule unjudged.

What a bad device takes out of scheduling (``apply_health``): a whole
device, a GPU with mdevs, or a PF whose VFs are offered loses its whole
inventory (reserved = total); a bad VF takes only its own unit from its
PF's provider. The provider gets ``CUSTOM_HW_DEVICE_UNHEALTHY`` and one
trait per reason, and claims no longer choose the bad devices. Nothing
held is touched: a guest keeps its device and its allocation.
"""
from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from compute_agent.claims.choice import Pool
from compute_agent.drivers.base import DeviceKind, HostInventory, NetLink, PciHealthSignals
from compute_agent.tree.host_tree import BuiltTree
from compute_agent.tree.ownership import UNHEALTHY_TRAIT
from compute_agent.tree.provider_tree import Provider, ProviderTree

DEAD_VENDOR = "ffff"
CORRECTABLE_WINDOW_S = 60.0
# Interface states (RFC 2863) that, with no carrier read, mean no link.
_NO_LINK_STATES = frozenset({"down", "lowerlayerdown"})


class DeviceFault(str, enum.Enum):
    """What makes a device bad (see above); each is a trait on its provider."""

    GONE = "gone"
    CONFIG_SPACE = "config_space"
    AER_FATAL = "aer_fatal"
    AER_NONFATAL = "aer_nonfatal"
    AER_CORRECTABLE = "aer_correctable"
    VF_COUNT = "vf_count"
    LINK_DOWN = "link_down"
    # A VF a host reboot took that the agent could not bring back
    # (compute_agent/health/vf_restore.py).
    NOT_RESTORED = "not_restored"
    # A vGPU VF whose type the agent could not write back after a host
    # reboot (compute_agent/compute/vgpu_types.py): its guest cannot start on it.
    VGPU_TYPE_NOT_RESTORED = "vgpu_type_not_restored"

    @property
    def trait(self) -> str:
        return f"{UNHEALTHY_TRAIT}_{self.name}"


FAULT_BY_TRAIT = {f.trait: f for f in DeviceFault}


@dataclass(frozen=True)
class DeviceVerdict:
    """A bad device: why (``faults``) and what was seen (``details``, one
    phrase per fault, for the log and ``status``)."""

    address: str
    faults: frozenset[DeviceFault]
    details: tuple[str, ...]


@dataclass
class _Seen:
    """What the judge remembers of one device between readings."""

    fatal_base: int | None = None
    nonfatal_base: int | None = None
    # (time, TOTAL_ERR_COR) within the last window, oldest first.
    correctable: deque[tuple[float, int]] = field(default_factory=deque)


def uncorrectable_rise(base: int | None, count: int | None
                       ) -> tuple[bool, int | None]:
    """(risen, the new baseline) of an uncorrectable-error count: the first
    count seen is the baseline; a lower one means the kernel started
    counting again (the device was found again), a new baseline; a higher
    one has risen, and the baseline stays, so the device stays bad."""
    if count is None:
        return False, base
    if base is None or count < base:
        return False, count
    return count > base, base


def correctable_rise(samples: deque[tuple[float, int]], count: int | None, now: float) -> int:
    """How far TOTAL_ERR_COR rose within the window ending ``now``;
    ``samples`` is updated."""
    if count is None:
        samples.clear()
        return 0
    if samples and count < samples[-1][1]:
        samples.clear()  # counting started again
    samples.append((now, count))
    while samples[0][0] < now - CORRECTABLE_WINDOW_S:
        samples.popleft()
    return count - samples[0][1]


def link_down(link: NetLink) -> bool:
    """No physical link on an interface that is administratively up."""
    if link.admin_up is False:
        return False
    if link.carrier is not None:
        return not link.carrier
    return link.admin_up is True and link.operstate in _NO_LINK_STATES


class HealthJudge:
    """Verdicts from successive readings of the watched devices; the AER
    rules need what was seen before, which this keeps."""

    def __init__(self, correctable_per_minute: int) -> None:
        self.correctable_per_minute = correctable_per_minute
        self._seen: dict[str, _Seen] = {}

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what was seen of devices no longer watched."""
        keep = set(keep)
        for address in set(self._seen) - keep:
            del self._seen[address]

    def judge(self, signals: PciHealthSignals, now: float
              ) -> DeviceVerdict | None:
        """The device's verdict, None when nothing is wrong with it."""
        if not signals.present:
            self._seen.pop(signals.address, None)  # counts restart if it returns
            return DeviceVerdict(signals.address, frozenset({DeviceFault.GONE}),
                                 ("gone from sysfs",))
        seen = self._seen.setdefault(signals.address, _Seen())
        found: dict[DeviceFault, str] = {}
        config = config_space_problem(signals)
        if config:
            found[DeviceFault.CONFIG_SPACE] = config
        risen, seen.fatal_base = uncorrectable_rise(seen.fatal_base,
                                                    signals.aer_fatal)
        if risen:
            found[DeviceFault.AER_FATAL] = (f"TOTAL_ERR_FATAL {seen.fatal_base} -> "
                                            f"{signals.aer_fatal}")
        risen, seen.nonfatal_base = uncorrectable_rise(seen.nonfatal_base,
                                                       signals.aer_nonfatal)
        if risen:
            found[DeviceFault.AER_NONFATAL] = (f"TOTAL_ERR_NONFATAL {seen.nonfatal_base}"
                                               f" -> {signals.aer_nonfatal}")
        rise = correctable_rise(seen.correctable, signals.aer_correctable, now)
        if rise >= self.correctable_per_minute:
            found[DeviceFault.AER_CORRECTABLE] = (f"TOTAL_ERR_COR +{rise} within "
                                                  f"{CORRECTABLE_WINDOW_S:.0f} s")
        if (signals.sriov_numvfs is not None and signals.vfs_present is not None
                and signals.sriov_numvfs != signals.vfs_present):
            found[DeviceFault.VF_COUNT] = (f"sriov_numvfs {signals.sriov_numvfs}, "
                                           f"{signals.vfs_present} VFs present")
        down = [link.name for link in signals.links if link_down(link)]
        if down:
            found[DeviceFault.LINK_DOWN] = f"no carrier on {', '.join(down)}"
        if not found:
            return None
        return DeviceVerdict(signals.address, frozenset(found),
                             tuple(found[f] for f in DeviceFault if f in found))


def config_space_problem(signals: PciHealthSignals) -> str | None:
    """Why the device's config space says it no longer answers, if so."""
    if signals.vendor_id == DEAD_VENDOR:
        return f"vendor 0x{DEAD_VENDOR}"
    if signals.config_vendor_id == DEAD_VENDOR:
        return f"config space reads 0x{DEAD_VENDOR}"
    unreadable = [u for u in signals.unreadable if u.startswith(("config", "vendor"))]
    return "; ".join(unreadable) or None


# --- what a verdict does to the tree ------------------------------------------


@dataclass(frozen=True)
class PoolDevices:
    """The devices behind one pool, by what a fault of theirs takes: all
    of the pool (``whole``), or one unit (``units``)."""

    whole: frozenset[str] = frozenset()
    units: frozenset[str] = frozenset()


def pool_devices(pool: Pool, pf_of: Mapping[str, str]) -> PoolDevices:
    """``pf_of``: VF address -> its PF's. A VF pool is its PF's VFs: the PF
    failing takes them all. An MDEV pool is its parent GPU (or the GPU's
    VF, in NVIDIA's layout, with its PF)."""
    slots = frozenset(s.device_id for s in pool.slots)
    if pool.kind is DeviceKind.PCI:
        return PoolDevices(whole=slots)
    if pool.kind is DeviceKind.VF:
        return PoolDevices(whole=frozenset(pf_of[v] for v in slots if v in pf_of),
                           units=slots)
    if pool.kind is DeviceKind.VGPU_VF:
        return PoolDevices(whole=slots | frozenset(pf_of[v] for v in slots if v in pf_of))
    if pool.kind is DeviceKind.MDEV and pool.mdev_parent:
        parent = pool.mdev_parent
        return PoolDevices(whole=frozenset({parent} | ({pf_of[parent]}
                                                        if parent in pf_of else set())))
    return PoolDevices()


def vf_parents(inv: HostInventory) -> dict[str, str]:
    return {d.address: d.parent_address for d in inv.pci_devices
            if d.parent_address}


def watched_devices(built: BuiltTree, inv: HostInventory) -> frozenset[str]:
    """Every device whose health decides something in this tree."""
    pf_of = vf_parents(inv)
    out: set[str] = set()
    for pool in built.pools:
        devices = pool_devices(pool, pf_of)
        out |= devices.whole | devices.units
    return frozenset(out)


def hold_vgpu_vfs_not_restored(built: BuiltTree, inv: HostInventory,
                               not_restored: Mapping[str, str]) -> BuiltTree:
    """``built`` with each vGPU VF whose type was not written back after a
    reboot (VF -> why) reserved and marked with the reason, as a bad
    device is."""
    return apply_health(built, inv, {
        vf: DeviceVerdict(vf, frozenset({DeviceFault.VGPU_TYPE_NOT_RESTORED}), (why,))
        for vf, why in not_restored.items()})


def apply_health(built: BuiltTree, inv: HostInventory,
                 verdicts: Mapping[str, DeviceVerdict]) -> BuiltTree:
    """``built`` with each bad device's units reserved and its provider
    marked; ``built`` itself is left as it was."""
    if not verdicts:
        return built
    pf_of = vf_parents(inv)
    changed: dict[str, Provider] = {}
    pools: list[Pool] = []
    for pool in built.pools:
        devices = pool_devices(pool, pf_of)
        bad_whole = sorted(devices.whole & set(verdicts))
        bad_units = sorted(devices.units & set(verdicts))
        if not bad_whole and not bad_units:
            pools.append(pool)
            continue
        provider = changed.get(pool.provider_name) or built.tree.named(pool.provider_name)
        record = provider.inventories[pool.resource_class]
        if bad_whole:
            held = record["total"]
            unhealthy = devices.whole | devices.units | {
                s.device_id for s in pool.slots}
        else:
            held = min(record["total"], len(bad_units))
            unhealthy = frozenset(bad_units)
        faults = frozenset().union(*(verdicts[a].faults
                                     for a in bad_whole + bad_units))
        changed[provider.name] = replace(
            provider,
            inventories={**provider.inventories, pool.resource_class: {
                **record, "reserved": max(record.get("reserved", 0), held)}},
            traits=provider.traits | {UNHEALTHY_TRAIT} | {f.trait for f in faults})
        pools.append(replace(pool, unhealthy=frozenset(unhealthy)))
    tree = ProviderTree(changed.get(p.name, p) for p in built.tree)
    return replace(built, tree=tree, pools=pools)


# --- what status and metrics show -----------------------------------------------


@dataclass(frozen=True)
class UnhealthyProvider:
    """A provider Placement shows out of service for a device's health."""

    name: str
    faults: frozenset[DeviceFault]
    # resource class -> (reserved, total)
    held: tuple[tuple[str, int, int], ...]

    def describe(self) -> str:
        units = ", ".join(f"{rc} {reserved} of {total} reserved"
                          for rc, reserved, total in self.held)
        reasons = ", ".join(f.value for f in DeviceFault if f in self.faults)
        return f"{self.name}: unhealthy ({reasons}); {units}"

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.name,
                "faults": [f.value for f in DeviceFault if f in self.faults],
                "reserved": {rc: {"reserved": reserved, "total": total}
                             for rc, reserved, total in self.held}}


def unhealthy_providers(providers: Iterable[Provider]) -> list[UnhealthyProvider]:
    """The providers marked unhealthy, from a view of Placement (names,
    traits and inventories): what ``status`` reports, the same for any
    reader of Placement, whether or not the agent runs."""
    out = []
    for p in providers:
        if UNHEALTHY_TRAIT not in p.traits:
            continue
        out.append(UnhealthyProvider(
            p.name, frozenset(FAULT_BY_TRAIT[t] for t in p.traits if t in FAULT_BY_TRAIT),
            tuple((rc, rec.get("reserved", 0), rec["total"])
                  for rc, rec in sorted(p.inventories.items()))))
    return sorted(out, key=lambda u: u.name)


@dataclass(frozen=True)
class HealthSnapshot:
    """The watch's current view, read-only: for metrics (a gauge of bad
    devices by fault) and for anything in the agent's process."""

    watched: frozenset[str]
    unhealthy: tuple[DeviceVerdict, ...]
    polls: int

    def count_by_fault(self) -> dict[DeviceFault, int]:
        return {f: sum(1 for v in self.unhealthy if f in v.faults) for f in DeviceFault}
