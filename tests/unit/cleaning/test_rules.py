"""What used one-time-use devices do to the tree (compute_agent/cleaning/rules.py)."""
import json

from compute_agent.claims.model import DeviceUse, UseState
from compute_agent.cleaning.rules import apply_uses
from compute_agent.drivers.fake import host_from_dict
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import TreePolicy, build_tree
from compute_agent.tree.ownership import CLEANING_FAILED_TRAIT, inventories_to_write

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
PF = "0000:3b:00.0"
VF0, VF1, VF2 = "0000:3b:10.0", "0000:3b:10.1", "0000:3b:10.2"
WHOLE = "0000:5e:00.0"
PLAIN = "0000:60:00.0"


def built():
    inv = host_from_dict({
        "disk_gb": 10,
        "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}],
        "pci_devices": [
            {"address": PF, "vendor_id": "8086", "product_id": "1572", "numa_node": 0,
             "vfs": {"count": 4, "product_id": "154c"}},
            {"address": WHOLE, "vendor_id": "10de", "product_id": "1db4", "numa_node": 0},
            {"address": PLAIN, "vendor_id": "1af4", "product_id": "1041", "numa_node": 0},
        ]})
    specs = parse_specs([
        json.dumps({"vendor_id": "8086", "product_id": "154c", "one_time_use": "yes"}),
        json.dumps({"address": WHOLE, "one_time_use": "yes"}),
        json.dumps({"address": PLAIN})])
    return build_tree(inv, TreePolicy("cmp", ROOT, device_specs=specs))


def reserved(tree, address: str) -> dict[str, int]:
    provider = tree.by_name(f"cmp_{address.upper()}")
    return {rc: rec["reserved"] for rc, rec in provider.inventories.items()}


def test_nothing_used_changes_nothing():
    b = built()
    assert apply_uses(b, []) is b


def test_a_whole_device_is_reserved_from_its_claim_on_as_nova_does():
    b = built()
    for held in (True, False):
        after = apply_uses(b, [(DeviceUse(WHOLE), held)])
        assert reserved(after.tree, WHOLE) == {"CUSTOM_PCI_10DE_1DB4": 1}
        assert reserved(after.tree, PLAIN) == {"CUSTOM_PCI_1AF4_1041": 0}
    assert reserved(b.tree, WHOLE) == {"CUSTOM_PCI_10DE_1DB4": 0}  # left as it was


def test_a_used_vf_takes_one_unit_once_no_one_holds_it():
    b = built()
    after = apply_uses(b, [(DeviceUse(VF0), True), (DeviceUse(VF1), False),
                           (DeviceUse(VF2), False)])
    # VF0's allocation counts it while held; VF1 and VF2 are out.
    assert reserved(after.tree, PF) == {"CUSTOM_PCI_8086_154C": 2}
    assert CLEANING_FAILED_TRAIT not in after.tree.by_name(f"cmp_{PF.upper()}").traits


def test_a_failed_cleaning_marks_the_provider():
    after = apply_uses(built(), [
        (DeviceUse(VF1, UseState.CLEANING_FAILED, "exit status 1"), False)])
    provider = after.tree.by_name(f"cmp_{PF.upper()}")
    assert CLEANING_FAILED_TRAIT in provider.traits
    assert provider.inventories["CUSTOM_PCI_8086_154C"]["reserved"] == 1


def test_a_device_no_longer_one_time_use_is_not_held_out():
    """A use recorded before the spec dropped one_time_use holds nothing."""
    b = built()
    after = apply_uses(b, [(DeviceUse(PLAIN), False)])
    assert reserved(after.tree, PLAIN) == {"CUSTOM_PCI_1AF4_1041": 0}


def test_the_agents_reserved_goes_back_once_the_vfs_are_clean():
    """Placement shows 2 of 4 reserved, HW_PCI_ONE_TIME_USE on the
    provider: that reserved is the agent's, and goes back to 0 when the
    devices are clean (an operator's partial reserve would be kept)."""
    desired = {"CUSTOM_PCI_8086_154C": {"total": 4, "reserved": 0}}
    current = {"CUSTOM_PCI_8086_154C": {"total": 4, "reserved": 2}}
    assert inventories_to_write(current, desired, frozenset(
        {"HW_PCI_ONE_TIME_USE"}))["CUSTOM_PCI_8086_154C"]["reserved"] == 0
    assert inventories_to_write(current, desired, frozenset())[
        "CUSTOM_PCI_8086_154C"]["reserved"] == 2
