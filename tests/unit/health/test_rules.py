"""Device health, pure: the rules that make a device bad or well again, what
a verdict does to the built tree and its pools, and what status reads back
from Placement."""
from __future__ import annotations

import json

import pytest

from compute_agent.drivers.base import NetLink, PciHealthSignals
from compute_agent.drivers.fake import host_from_dict
from compute_agent.health.rules import (
    CORRECTABLE_WINDOW_S,
    DeviceFault,
    DeviceVerdict,
    HealthJudge,
    apply_health,
    link_down,
    unhealthy_providers,
    watched_devices,
)
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import MdevTypePolicy, TreePolicy, build_tree
from compute_agent.tree.ownership import UNHEALTHY_TRAIT

DEV = "0000:3b:00.0"
ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
PF = "0000:81:00.0"
VF0, VF1 = "0000:81:10.0", "0000:81:10.1"
NIC = "0000:3b:00.0"
GPU = "0000:84:00.0"


def well(**fields) -> PciHealthSignals:
    return PciHealthSignals(DEV, True, "8086", "8086", **fields)


def verdicts(judge: HealthJudge, *readings: PciHealthSignals, step: float = 1.0):
    """The verdict after each reading, ``step`` seconds apart."""
    return [judge.judge(r, i * step) for i, r in enumerate(readings)]


def faults(verdict: DeviceVerdict | None) -> set[DeviceFault]:
    return set(verdict.faults) if verdict else set()


# --- the rules -------------------------------------------------------------------


def test_a_well_device_has_no_verdict():
    assert HealthJudge(100).judge(well(aer_fatal=0, sriov_numvfs=2, vfs_present=2,
                                       links=(NetLink("eth0", "up", True, True),)),
                                  0) is None


def test_a_device_gone_from_sysfs():
    verdict = HealthJudge(100).judge(PciHealthSignals(DEV, False), 0)
    assert faults(verdict) == {DeviceFault.GONE}


@pytest.mark.parametrize("signals,detail", [
    (PciHealthSignals(DEV, True, "ffff", "8086"), "vendor 0xffff"),
    (PciHealthSignals(DEV, True, "8086", "ffff"), "config space reads 0xffff"),
    (PciHealthSignals(DEV, True, "8086", None, unreadable=("config: Input/output error",)),
     "config: Input/output error"),
])
def test_config_space_that_no_longer_answers(signals, detail):
    verdict = HealthJudge(100).judge(signals, 0)
    assert faults(verdict) == {DeviceFault.CONFIG_SPACE}
    assert verdict.details == (detail,)


def test_an_unreadable_aer_file_is_not_a_dead_config_space():
    signals = well(unreadable=("aer_dev_fatal: no TOTAL_ERR_FATAL line",))
    assert HealthJudge(100).judge(signals, 0) is None


@pytest.mark.parametrize("counter,fault", [("aer_fatal", DeviceFault.AER_FATAL),
                                           ("aer_nonfatal", DeviceFault.AER_NONFATAL)])
def test_any_uncorrectable_rise_is_bad_until_the_counts_start_again(counter, fault):
    judge = HealthJudge(100)
    seen = verdicts(judge, well(**{counter: 3}), well(**{counter: 3}),
                    well(**{counter: 4}), well(**{counter: 9}), well(**{counter: 4}),
                    well(**{counter: 0}), well(**{counter: 0}), well(**{counter: 1}))
    assert [faults(v) for v in seen] == [
        set(), set(),            # what was counted before the watch: the baseline
        {fault}, {fault}, {fault},  # risen, and staying so while it stays above
        set(), set(),            # lower: the kernel counts afresh, a new baseline
        {fault}]


def test_the_first_count_seen_is_the_baseline_even_when_high():
    assert HealthJudge(100).judge(well(aer_nonfatal=50, aer_fatal=2), 0) is None


def test_correctable_errors_are_bad_at_the_rate_and_recover_when_it_falls():
    judge = HealthJudge(correctable_per_minute=10)
    assert judge.judge(well(aer_correctable=100), 0) is None
    assert judge.judge(well(aer_correctable=109), 20) is None
    assert faults(judge.judge(well(aer_correctable=110), 30)) == {DeviceFault.AER_CORRECTABLE}
    # No new error: once the window no longer holds the burst, well again.
    assert faults(judge.judge(well(aer_correctable=110), 59)) == {DeviceFault.AER_CORRECTABLE}
    assert judge.judge(well(aer_correctable=110), 30 + CORRECTABLE_WINDOW_S + 1) is None


def test_a_slow_trickle_of_correctable_errors_is_well():
    judge = HealthJudge(correctable_per_minute=10)
    seen = [judge.judge(well(aer_correctable=i), i * 10.0) for i in range(30)]
    assert seen == [None] * 30


def test_a_vf_count_that_drifted_from_sriov_numvfs():
    verdict = HealthJudge(100).judge(well(sriov_numvfs=4, vfs_present=3), 0)
    assert faults(verdict) == {DeviceFault.VF_COUNT}
    assert verdict.details == ("sriov_numvfs 4, 3 VFs present",)


@pytest.mark.parametrize("link,down", [
    (NetLink("eth0", "up", True, True), False),
    (NetLink("eth0", "down", False, True), True),
    # carrier unreadable, but up by flags and down by operstate
    (NetLink("eth0", "lowerlayerdown", None, True), True),
    # taken down by an operator: not judged
    (NetLink("eth0", "down", None, False), False),
    # nothing says it is up: not judged
    (NetLink("eth0", "down", None, None), False),
    (NetLink("eth0", "unknown", None, True), False),
])
def test_link_down_is_no_carrier_on_an_interface_that_is_up(link, down):
    assert link_down(link) is down


def test_every_fault_at_once_is_reported_in_one_verdict():
    signals = PciHealthSignals(DEV, True, "ffff", "ffff", aer_fatal=0, aer_nonfatal=0,
                               sriov_numvfs=2, vfs_present=1,
                               links=(NetLink("eth0", "down", False, True),))
    judge = HealthJudge(1)
    judge.judge(signals, 0)
    worse = PciHealthSignals(DEV, True, "ffff", "ffff", aer_fatal=1, aer_nonfatal=1,
                             sriov_numvfs=2, vfs_present=1,
                             links=(NetLink("eth0", "down", False, True),))
    assert faults(judge.judge(worse, 1)) == {
        DeviceFault.CONFIG_SPACE, DeviceFault.AER_FATAL, DeviceFault.AER_NONFATAL,
        DeviceFault.VF_COUNT, DeviceFault.LINK_DOWN}


def test_a_device_that_went_and_came_back_starts_a_new_baseline():
    judge = HealthJudge(100)
    judge.judge(well(aer_fatal=5), 0)
    judge.judge(PciHealthSignals(DEV, False), 1)
    assert judge.judge(well(aer_fatal=7), 2) is None


# --- what it does to the tree ------------------------------------------------------


def host():
    return host_from_dict({
        "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}],
        "pci_devices": [
            {"address": PF, "vendor_id": "8086", "product_id": "1572", "numa_node": 0,
             "vfs": {"count": 4, "product_id": "154c"}},
            {"address": NIC, "vendor_id": "15b3", "product_id": "101b", "numa_node": 0}],
        "gpus": [{"address": GPU, "numa_node": 0,
                  "mdev_types": {"nvidia-35": {"available_instances": 4}}}]})


def built(inv=None):
    specs = parse_specs([json.dumps({"vendor_id": "8086", "product_id": "154c"}),
                         json.dumps({"vendor_id": "15b3", "product_id": "101b"})])
    return build_tree(inv or host(), TreePolicy(
        "h", ROOT, device_specs=specs, mdev_types=(MdevTypePolicy("nvidia-35"),)))


def bad(address: str, fault: DeviceFault = DeviceFault.CONFIG_SPACE) -> DeviceVerdict:
    return DeviceVerdict(address, frozenset({fault}), ("x",))


def provider(tree, address: str):
    return next(p for p in tree.tree if p.name.endswith(address.upper())
                or p.name.endswith(address.replace(":", "_").replace(".", "_")))


def pool_of(tree, address: str):
    return next(p for p in tree.pools if p.provider_name == provider(tree, address).name)


def test_the_watched_devices_are_the_allowlisted_their_pfs_and_the_gpus():
    assert watched_devices(built(), host()) == {
        PF, *[f"0000:81:10.{i}" for i in range(4)], NIC, GPU}


def test_no_verdict_leaves_the_tree_as_built():
    b = built()
    assert apply_health(b, host(), {}) is b


def test_a_bad_whole_device_is_wholly_reserved_and_marked_with_its_reason():
    before = built()
    after = apply_health(before, host(), {NIC: bad(NIC, DeviceFault.LINK_DOWN)})
    nic = provider(after, NIC)
    assert nic.inventories["CUSTOM_PCI_15B3_101B"]["reserved"] == 1
    assert {UNHEALTHY_TRAIT, DeviceFault.LINK_DOWN.trait} <= nic.traits
    assert pool_of(after, NIC).unhealthy == {NIC}
    # The others, and what was built, untouched.
    assert provider(after, PF) is provider(before, PF)
    assert provider(before, NIC).inventories["CUSTOM_PCI_15B3_101B"]["reserved"] == 0
    assert UNHEALTHY_TRAIT not in provider(before, NIC).traits


def test_a_bad_vf_takes_only_its_own_unit():
    after = apply_health(built(), host(), {VF1: bad(VF1, DeviceFault.AER_FATAL)})
    pf = provider(after, PF)
    assert pf.inventories["CUSTOM_PCI_8086_154C"] == {**pf.inventories[
        "CUSTOM_PCI_8086_154C"], "total": 4, "reserved": 1}
    assert {UNHEALTHY_TRAIT, DeviceFault.AER_FATAL.trait} <= pf.traits
    assert pool_of(after, PF).unhealthy == {VF1}


def test_a_bad_pf_takes_all_its_vfs_with_every_reason():
    after = apply_health(built(), host(), {PF: bad(PF, DeviceFault.VF_COUNT),
                                           VF0: bad(VF0, DeviceFault.GONE)})
    pf = provider(after, PF)
    assert pf.inventories["CUSTOM_PCI_8086_154C"]["reserved"] == 4
    assert {DeviceFault.VF_COUNT.trait, DeviceFault.GONE.trait} <= pf.traits
    assert pool_of(after, PF).unhealthy >= {f"0000:81:10.{i}" for i in range(4)}


def test_a_bad_gpu_takes_its_vgpus_and_creates_no_mdev():
    after = apply_health(built(), host(), {GPU: bad(GPU)})
    gpu = provider(after, GPU)
    assert gpu.inventories["VGPU"]["reserved"] == gpu.inventories["VGPU"]["total"] == 4
    assert GPU in pool_of(after, GPU).unhealthy


def test_an_operators_higher_reservation_is_not_lowered_by_a_bad_vf():
    b = built()
    pf = provider(b, PF)
    pf.inventories["CUSTOM_PCI_8086_154C"]["reserved"] = 3
    after = apply_health(b, host(), {VF1: bad(VF1)})
    assert provider(after, PF).inventories["CUSTOM_PCI_8086_154C"]["reserved"] == 3


# --- what status reads back -------------------------------------------------------


def test_status_reads_the_unhealthy_providers_and_their_reasons_from_the_tree():
    after = apply_health(built(), host(), {PF: bad(PF, DeviceFault.AER_NONFATAL),
                                           NIC: bad(NIC, DeviceFault.LINK_DOWN)})
    found = unhealthy_providers(after.tree)
    assert [(u.name, set(u.faults)) for u in found] == [
        ("h_0000:3B:00.0", {DeviceFault.LINK_DOWN}),
        ("h_0000:81:00.0", {DeviceFault.AER_NONFATAL})]
    assert found[1].describe() == ("h_0000:81:00.0: unhealthy (aer_nonfatal); "
                                   "CUSTOM_PCI_8086_154C 4 of 4 reserved")
    assert found[1].to_json() == {
        "provider": "h_0000:81:00.0", "faults": ["aer_nonfatal"],
        "reserved": {"CUSTOM_PCI_8086_154C": {"reserved": 4, "total": 4}}}
