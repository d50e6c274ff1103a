"""VFs back after a reboot, pure: the writes to sriov_numvfs the kernel's ABI
allows, the verification by address and ids, the record, and the units
the tree keeps reserved."""
from __future__ import annotations

import json

import pytest

from compute_agent.drivers.base import PciDevice, PciKind, SriovFunctions
from compute_agent.drivers.fake import host_from_dict
from compute_agent.drivers.fake_sysfs import vf_address
from compute_agent.health.rules import DeviceFault, apply_health
from compute_agent.health.vf_restore import (
    NotRestored,
    PfPlan,
    RecordedPf,
    RecordedVf,
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
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import TreePolicy, build_tree

PF = "0000:81:00.0"
ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"


def pf(num_vfs: int, total: int = 8, ids=("8086", "10fb")) -> PciDevice:
    return PciDevice(PF, *ids, PciKind.PF, 0, total_vfs=total, num_vfs=num_vfs)


def vfs(count: int, product: str = "10ed") -> tuple[PciDevice, ...]:
    return tuple(PciDevice(vf_address(PF, i), "8086", product, PciKind.VF, 0,
                           parent_address=PF) for i in range(count))


def found(num_vfs: int, **kw) -> SriovFunctions:
    return SriovFunctions(pf(num_vfs, **kw), vfs(num_vfs))


RECORD = RecordedPf(PF, "8086", "10fb", 8,
                    tuple(RecordedVf(v.address, "8086", "10ed") for v in vfs(8)))


def plan(wanted=8, configured=False, record=RECORD, now=None, in_use=False, rebooted=True):
    return plan_pf(VfCount(PF, wanted, configured), record,
                   found(0) if now is None else now, in_use, rebooted)


# --- the writes -------------------------------------------------------------------

def test_a_pf_left_without_vfs_gets_its_count_in_one_write():
    assert plan().writes == (8,)


def test_nothing_is_written_without_a_reboot_nor_to_a_pf_that_has_its_count():
    assert plan(rebooted=False).writes == () and plan(rebooted=False).problem is None
    assert plan(now=found(8)).writes == ()


@pytest.mark.parametrize("configured,in_use,writes,problem", [
    # Another count while VFs exist: the kernel refuses it (EBUSY), so 0
    # first, which destroys the VFs: only for a PF the operator listed, and
    # none of its VFs in use.
    (True, False, (0, 6), None),
    (True, True, (), "has 2 VFs (a VF of it is in use); left as it is"),
    (False, False, (), "has 2 VFs (set by someone else); left as it is"),
])
def test_another_count_set_at_boot(configured, in_use, writes, problem):
    p = plan(wanted=6, configured=configured, now=found(2), in_use=in_use)
    assert (p.writes, p.problem) == (writes, problem)


def test_a_configured_zero_disables_the_vfs_once_nothing_uses_them():
    assert plan(wanted=0, configured=True, record=None, now=found(4)).writes == (0,)


@pytest.mark.parametrize("now,problem", [
    (None, "PF not found"),
    (found(0, ids=("15b3", "1017")), "the device there is 15b3:1017, the PF recorded was "
                                     "8086:10fb; not touched"),
    (found(0, total=4), "8 VFs wanted, sriov_totalvfs is 4"),
    (SriovFunctions(PciDevice(PF, "8086", "10fb", PciKind.PCI, 0)),
     "not an SR-IOV PF (no sriov_totalvfs)"),
])
def test_a_pf_that_cannot_take_its_count_is_not_written(now, problem):
    p = plan_pf(VfCount(PF, 8, True), RECORD, now, False, True)
    assert (p.writes, p.problem) == ((), problem)


def test_a_vf_in_use_is_one_a_running_guest_holds_or_an_mdev_sits_on():
    now = found(2)
    assert not vfs_in_use(now, frozenset(), frozenset())
    assert vfs_in_use(now, frozenset({vf_address(PF, 1)}), frozenset())
    assert vfs_in_use(now, frozenset(), frozenset({vf_address(PF, 0)}))


# --- the verification ----------------------------------------------------------------

def test_each_recorded_vf_is_verified_by_address_and_ids():
    now = SriovFunctions(pf(8), vfs(7) + (replace_product(vfs(8)[7], "1520"),))
    out = verify_pf(PfPlan(PF, 8, (8,)), RECORD, now)
    assert [(m.address, m.reason) for m in out.not_restored] == [
        (vf_address(PF, 7), "the device there is 8086:1520")]


def replace_product(vf: PciDevice, product: str) -> PciDevice:
    return PciDevice(vf.address, vf.vendor_id, product, vf.kind, vf.numa_node,
                     parent_address=vf.parent_address)


def test_a_pf_not_written_leaves_every_recorded_vf_not_restored_with_the_reason():
    p = plan(now=found(0, total=4))
    out = verify_pf(p, RECORD, found(0, total=4))
    assert len(out.not_restored) == 8
    assert out.not_restored[0].line() == (
        f"VF {vf_address(PF, 0)} (8086:10ed) of PF {PF} not restored after the reboot: "
        "8 VFs wanted, sriov_totalvfs is 4; its unit stays reserved")


def test_only_the_vfs_within_the_wanted_count_are_expected():
    out = verify_pf(PfPlan(PF, 4, (4,)), RECORD, found(4))
    assert out.not_restored == [] and out.problem is None


def test_without_a_record_the_count_is_verified():
    out = verify_pf(PfPlan(PF, 6, (6,)), None, found(4))
    assert out.problem == (f"PF {PF}: 4 VFs, 6 wanted ([pci] vf_counts): missing after the "
                           "VF count was set")


# --- the record ---------------------------------------------------------------------

def test_the_record_reads_back_what_it_wrote_and_names_a_bad_pf():
    assert record_from_json(record_to_json({PF: RECORD})) == {PF: RECORD}
    assert record_from_json(None) == {}
    with pytest.raises(ValueError, match=f"VF record of PF {PF}: KeyError"):
        record_from_json(json.dumps({PF: {"vendor_id": "8086"}}))


def host(num_vfs: int) -> dict:
    return {"numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}],
            "pci_devices": [{"address": PF, "vendor_id": "8086", "product_id": "10fb",
                             "numa_node": 0,
                             "vfs": {"count": num_vfs, "product_id": "10ed", "total": 8}}]}


def test_a_managed_pf_is_recorded_when_seen_with_all_its_vfs():
    assert updated_record({}, host_from_dict(host(8)), frozenset({PF}), []) == {PF: RECORD}
    # Not managed, or without VFs: nothing recorded.
    assert updated_record({}, host_from_dict(host(8)), frozenset(), []) == {}
    assert updated_record({}, host_from_dict(host(0)), frozenset({PF}), []) == {}


def test_a_pf_whose_restore_failed_keeps_its_record():
    missing = [NotRestored(vf_address(PF, 7), "8086", "10ed", PF, "gone")]
    assert updated_record({PF: RECORD}, host_from_dict(host(4)), frozenset({PF}),
                          missing) == {PF: RECORD}


# --- the tree ---------------------------------------------------------------------

def test_a_vf_not_restored_keeps_its_unit_reserved_with_its_reason():
    inv = host_from_dict(host(6))
    missing = [NotRestored(vf_address(PF, i), "8086", "10ed", PF, "gone") for i in (6, 7)]
    policy = TreePolicy("h", ROOT, device_specs=parse_specs(
        ['{"vendor_id": "8086", "product_id": "10ed"}']))
    whole = with_missing_vfs(inv, missing)
    built = apply_health(build_tree(whole, policy), whole, not_restored_verdicts(missing))
    provider = built.tree.by_name(f"h_{PF.upper()}")
    inventory = provider.inventories["CUSTOM_PCI_8086_10ED"]
    assert (inventory["total"], inventory["reserved"]) == (8, 2)
    assert DeviceFault.NOT_RESTORED.trait in provider.traits
    pool = next(p for p in built.pools if p.resource_class == "CUSTOM_PCI_8086_10ED")
    assert pool.unhealthy == frozenset(m.address for m in missing)
    # Back with its ids: no longer missing.
    assert still_missing(missing, host_from_dict(host(8))) == []
    assert still_missing(missing, inv) == missing
