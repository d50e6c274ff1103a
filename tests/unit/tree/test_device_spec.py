"""The [pci] device_spec allowlist: parsing, matching and its errors."""
import json

import pytest

from compute_agent.drivers.base import PciDevice, PciKind
from compute_agent.exception import ConfigError
from compute_agent.tree.device_spec import first_match, parse_spec, parse_specs

NIC = PciDevice("0000:3b:00.0", "8086", "1572", PciKind.PF, 0)
VF = PciDevice("0000:3b:10.1", "8086", "154c", PciKind.VF, 0,
               parent_address="0000:3b:00.0")
OTHER_VF = PciDevice("0000:5e:10.0", "8086", "154c", PciKind.VF, 1,
                     parent_address="0000:5e:00.0")
GPU = PciDevice("0000:af:00.0", "10de", "1db4", PciKind.PCI, 1)


def spec(**entry):
    return parse_spec(json.dumps(entry))


# --- matching ----------------------------------------------------------------

def test_vendor_and_product_must_both_match():
    s = spec(vendor_id="8086", product_id="1572")
    assert s.matches(NIC)
    assert not s.matches(VF)
    assert not s.matches(GPU)


def test_ids_compare_without_case_or_0x_prefix():
    assert spec(vendor_id="10DE", product_id="0x1DB4").matches(GPU)


def test_vendor_alone_matches_every_device_of_that_vendor():
    s = spec(vendor_id="8086")
    assert s.matches(NIC) and s.matches(VF) and not s.matches(GPU)


def test_address_string_matches_exactly():
    assert spec(address="0000:af:00.0").matches(GPU)
    assert not spec(address="0000:af:00.1").matches(GPU)


def test_address_string_without_domain_matches_any_domain():
    assert spec(address="af:00.0").matches(GPU)


@pytest.mark.parametrize("address", ["*:af:00.0", "0000:*:00.0", "0000:af:*.0",
                                     "0000:af:00.*", "*:*:*.*"])
def test_address_string_wildcards(address):
    assert spec(address=address).matches(GPU)


def test_address_string_wildcard_still_checks_the_other_parts():
    assert not spec(address="*:ae:00.0").matches(GPU)
    assert not spec(address="0000:af:*.1").matches(GPU)


def test_address_object_with_ranges():
    s = spec(address={"domain": "0", "bus": "a0-b0", "slot": "0-1f",
                      "function": "0"})
    assert s.matches(GPU)
    assert not s.matches(NIC)


def test_address_object_range_bounds_are_inclusive():
    assert spec(address={"bus": "af-b0"}).matches(GPU)
    assert spec(address={"bus": "a0-af"}).matches(GPU)
    assert not spec(address={"bus": "b0-ff"}).matches(GPU)


def test_address_object_missing_parts_match_anything():
    assert spec(address={"bus": "af"}).matches(GPU)


VMD_NVME = PciDevice("10000:e1:00.0", "8086", "0a54", PciKind.PCI, 0)
VMD_VF = PciDevice("10001:3b:10.1", "8086", "154c", PciKind.VF, 0,
                   parent_address="10001:3b:00.0")


@pytest.mark.parametrize("address", [
    "10000:e1:00.0", "10000:E1:00.0", "00010000:e1:00.0", "*:e1:00.0",
    "e1:00.0", {"domain": "10000"}, {"domain": "0-ffffffff", "bus": "e1"},
    {"domain": "fff0-10010"}])
def test_address_in_a_domain_past_ffff_matches(address):
    # Intel VMD puts the devices behind it in domains 10000 and up.
    assert spec(address=address).matches(VMD_NVME)


@pytest.mark.parametrize("address", ["0000:e1:00.0", "10001:e1:00.0",
                                     {"domain": "0-ffff"}])
def test_address_in_a_domain_past_ffff_does_not_match_another_domain(address):
    assert not spec(address=address).matches(VMD_NVME)


def test_vf_in_a_domain_past_ffff_matches_through_its_pf():
    assert spec(address="10001:3b:00.0", product_id="154c").matches(VMD_VF)


def test_vf_matches_through_its_pf_address():
    s = spec(address="0000:3b:00.0", product_id="154c")
    assert s.matches(VF)
    assert not s.matches(OTHER_VF)
    assert not s.matches(NIC)  # the PF's own product id differs


def test_vf_matches_by_its_own_address_too():
    assert spec(address="0000:3b:10.1").matches(VF)


def test_first_match_returns_the_first_matching_spec():
    a = spec(vendor_id="8086", traits=["CUSTOM_A"])
    b = spec(product_id="154c", traits=["CUSTOM_B"])
    assert first_match((a, b), VF) is a
    assert first_match((b, a), VF) is b
    assert first_match((a, b), GPU) is None
    assert first_match((), GPU) is None


def test_parse_specs_keeps_order_and_text():
    texts = ['{"vendor_id": "8086"}', '{"product_id": "1db4"}']
    specs = parse_specs(texts)
    assert [s.text for s in specs] == texts


def test_reporting_fields_do_not_affect_matching():
    s = spec(vendor_id="10de", resource_class="CUSTOM_GPU", traits="CUSTOM_X")
    assert s.matches(GPU)


# --- errors ------------------------------------------------------------------

BAD_ENTRIES = [
    # (entry text, field named, bad value shown)
    ('{"vendor_id": "8086"', None, '{"vendor_id": "8086"'),
    ('["8086"]', "entry", "8086"),
    ('"8086"', "entry", "8086"),
    ('{"vendor_id": "8086", "colour": "red"}', "colour", "red"),
    ('{"vendor_id": "80zz"}', "vendor_id", "80zz"),
    ('{"product_id": "12345"}', "product_id", "12345"),
    ('{"product_id": 4466}', "product_id", "4466"),
    ('{"address": "0000:3b:00"}', "address", "0000:3b:00"),
    ('{"address": 17}', "address", "17"),
    ('{"address": "0000:3b:zz.0"}', "address.slot", "zz"),
    ('{"address": "0000:3b:00.8"}', "address.function", "8"),
    ('{"address": "0000:3b:20.0"}', "address.slot", "20"),
    ('{"address": "100000000:3b:00.0"}', "address.domain", "100000000"),
    ('{"address": {"domain": "0-100000000"}}', "address.domain",
     "0-100000000"),
    ('{"address": {"bus": "100"}}', "address.bus", "100"),
    ('{"address": {"bus": "b0-a0"}}', "address.bus", "b0-a0"),
    ('{"address": {"bus": 59}}', "address.bus", "59"),
    ('{"address": {"bus": "1-2-3"}}', "address.bus", "1-2-3"),
    ('{"address": {"bus": "3b", "lane": "1"}}', "address", "lane"),
    ('{"resource_class": "CUSTOM_GPU"}', "entry", "CUSTOM_GPU"),
    ('{}', "entry", "{}"),
    ('{"vendor_id": "8086", "traits": 7}', "traits", "7"),
    ('{"vendor_id": "8086", "traits": ["A", 1]}', "traits", "1"),
    ('{"vendor_id": "8086", "resource_class": ""}', "resource_class", "''"),
    ('{"vendor_id": "8086", "resource_class": 5}', "resource_class", "5"),
    ('{"vendor_id": "8086", "physical_network": ""}', "physical_network", "''"),
    ('{"vendor_id": "8086", "physical_network": 1}', "physical_network", "1"),
    ('{"vendor_id": "8086", "live_migratable": "maybe"}', "live_migratable", "'maybe'"),
    ('{"vendor_id": "8086", "live_migratable": 1}', "live_migratable", "1"),
    ('{"vendor_id": "8086", "live_migratable": null}', "live_migratable", "None"),
]


@pytest.mark.parametrize("text,field,value", BAD_ENTRIES)
def test_malformed_entry_names_option_field_and_value(text, field, value):
    with pytest.raises(ConfigError) as err:
        parse_spec(text)
    message = str(err.value)
    assert message.startswith("[pci] device_spec")
    # The message echoes the whole entry at its end; the field and the value
    # must be named before that echo.
    stated = message.rsplit("; entry: ", 1)[0]
    if field is not None:
        assert field in stated
    assert value in stated


def test_parse_specs_stops_at_the_bad_entry():
    with pytest.raises(ConfigError, match="zz"):
        parse_specs(['{"vendor_id": "8086"}', '{"vendor_id": "zz"}'])


# --- how matches are reported ------------------------------------------------

def test_no_traits_and_no_class_by_default():
    s = spec(vendor_id="8086")
    assert s.traits == frozenset()
    assert s.resource_class is None


def test_standard_traits_are_kept_and_others_made_custom():
    s = spec(vendor_id="8086", traits=["hw_nic_sriov", "physnet-1", " fast "])
    assert s.traits == {"HW_NIC_SRIOV", "CUSTOM_PHYSNET_1", "CUSTOM_FAST"}


def test_traits_may_be_a_comma_separated_string():
    s = spec(vendor_id="8086", traits="HW_NIC_SRIOV, gold,")
    assert s.traits == {"HW_NIC_SRIOV", "CUSTOM_GOLD"}


def test_custom_traits_are_not_prefixed_twice():
    # nova keeps a name that already is CUSTOM_*; so must we, or a spec
    # written for nova ("traits": "CUSTOM_GOLD") reports CUSTOM_CUSTOM_GOLD.
    assert spec(vendor_id="8086", traits=["CUSTOM_GOLD"]).traits == {"CUSTOM_GOLD"}


def test_a_physical_network_is_read_and_null_means_none():
    assert spec(vendor_id="8086", physical_network="physnet1").physical_network == (
        "physnet1")
    assert spec(vendor_id="8086", physical_network=None).physical_network is None
    assert spec(vendor_id="8086").physical_network is None


@pytest.mark.parametrize("value,migratable", [
    ("yes", True), ("no", False), ("Yes ", True), (True, True), (False, False)])
def test_live_migratable_is_read(value, migratable):
    assert spec(vendor_id="8086", live_migratable=value).live_migratable is migratable


def test_a_device_is_not_live_migratable_unless_marked():
    assert spec(vendor_id="8086").live_migratable is False


def test_standard_resource_class_is_kept():
    assert spec(vendor_id="8086", resource_class="vgpu").resource_class == "VGPU"
    assert (spec(vendor_id="8086", resource_class="SRIOV_NET_VF").resource_class
            == "SRIOV_NET_VF")


def test_other_resource_class_is_made_custom():
    assert (spec(vendor_id="8086", resource_class="fast-nic").resource_class
            == "CUSTOM_FAST_NIC")


def test_custom_resource_class_is_not_prefixed_twice():
    assert (spec(vendor_id="10de", resource_class="CUSTOM_A16_16A").resource_class
            == "CUSTOM_A16_16A")


# --- one-time-use devices and their cleaning ----------------------------------

@pytest.mark.parametrize("value,once", [
    ("yes", True), ("no", False), (True, True), (False, False)])
def test_one_time_use_is_read_as_nova_spells_it(value, once):
    assert spec(vendor_id="8086", one_time_use=value).one_time_use is once


def test_a_device_is_not_one_time_use_unless_marked():
    s = spec(vendor_id="8086")
    assert (s.one_time_use, s.clean_command) == (False, None)


def test_a_clean_command_is_a_list_or_a_string_split_as_a_shell_would():
    listed = spec(address="0000:3b:00.0", one_time_use="yes",
                  clean_command=["/usr/sbin/nvme", "format", "--force"])
    written = spec(address="0000:3b:00.0", one_time_use="yes",
                   clean_command="/usr/sbin/nvme format '--force'", clean_timeout=30)
    assert listed.clean_command == written.clean_command == (
        "/usr/sbin/nvme", "format", "--force")
    assert (listed.clean_timeout, written.clean_timeout) == (600.0, 30.0)


@pytest.mark.parametrize("entry,message", [
    ({"one_time_use": "maybe"}, "one_time_use: must be \"yes\" or \"no\" (value: 'maybe'"),
    ({"clean_command": "reset"},
     'clean_command: only a one-time-use device is cleaned: add "one_time_use": "yes"'),
    ({"one_time_use": "yes", "clean_command": []},
     "clean_command: must be a command: a list of arguments or a string (value: []"),
    ({"one_time_use": "yes", "clean_command": "reset 'x"},
     "clean_command: cannot be split: No closing quotation"),
    ({"one_time_use": "yes", "clean_command": ["reset", 3]},
     "clean_command: must be a command"),
    ({"one_time_use": "yes", "clean_command": "reset", "clean_timeout": 0},
     "clean_timeout: must be a number of seconds above 0 (value: 0"),
    ({"one_time_use": "yes", "clean_command": "reset", "clean_timeout": "60"},
     "clean_timeout: must be a number of seconds above 0"),
    ({"one_time_use": "yes", "clean_timeout": 60},
     "clean_timeout: times a clean_command, which the entry does not name"),
])
def test_a_bad_one_time_use_key_is_one_line_naming_it(entry, message):
    with pytest.raises(ConfigError) as caught:
        spec(vendor_id="8086", **entry)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("[pci] device_spec: ") and message in text
