"""PCI addresses as the kernel and libvirt write them. libvirt's PCI domain
is 32 bits and real hosts use domains past ffff (Intel VMD puts the devices
behind it at 10000: and up), so a domain is 4 to 8 hex digits."""
import pytest

from compute_agent.common.pci_address import (
    address_from_node_device_name,
    canonical_address,
    format_address,
    node_device_name,
    split_address,
)


@pytest.mark.parametrize("text,parts", [
    ("0000:81:00.0", (0, 0x81, 0, 0)),
    ("0000:AF:1f.7", (0, 0xAF, 0x1F, 7)),
    ("10000:00:02.0", (0x10000, 0, 2, 0)),
    ("1000a:e1:00.1", (0x1000A, 0xE1, 0, 1)),
    ("ffffffff:ff:1f.7", (0xFFFFFFFF, 0xFF, 0x1F, 7)),
    ("00010000:00:02.0", (0x10000, 0, 2, 0)),
])
def test_split_accepts_domains_of_4_to_8_hex_digits(text, parts):
    assert split_address(text) == parts


@pytest.mark.parametrize("text", [
    "000:81:00.0",          # domain of three digits
    "100000000:00:00.0",    # nine digits: past 32 bits
    "0000:81:20.0",         # slot is five bits
    "0000:81:00.8",         # function is three bits
    "0000:8:00.0",          # bus of one digit
    "81:00.0",              # no domain
    "0000:81:00.0\n",       # trailing newline
    "",
])
def test_split_refuses_what_is_not_an_address(text):
    with pytest.raises(ValueError, match="PCI address"):
        split_address(text)


@pytest.mark.parametrize("text,canonical", [
    ("0000:AF:00.0", "0000:af:00.0"),
    ("10000:E1:00.1", "10000:e1:00.1"),
    ("00010000:00:02.0", "10000:00:02.0"),
])
def test_canonical_is_lower_case_with_a_domain_of_at_least_4_digits(
        text, canonical):
    assert canonical_address(text) == canonical


def test_format_pads_the_domain_to_4_digits_and_no_further():
    assert format_address(0, 0x3B, 2, 1) == "0000:3b:02.1"
    assert format_address(0x10000, 0, 2, 0) == "10000:00:02.0"
    assert format_address(0xFFFFFFFF, 0xFF, 0x1F, 7) == "ffffffff:ff:1f.7"


@pytest.mark.parametrize("parts,field", [
    ((0x100000000, 0, 0, 0), "domain"),
    ((0, 0x100, 0, 0), "bus"),
    ((0, 0, 0x20, 0), "slot"),
    ((0, 0, 0, 8), "function"),
    ((-1, 0, 0, 0), "domain"),
])
def test_format_refuses_a_part_out_of_range_naming_it(parts, field):
    with pytest.raises(ValueError, match=field):
        format_address(*parts)


@pytest.mark.parametrize("address,name", [
    ("0000:81:00.0", "pci_0000_81_00_0"),
    ("10000:e1:00.1", "pci_10000_e1_00_1"),
])
def test_node_device_name_round_trip(address, name):
    # libvirt's own naming: pci_%04x_%02x_%02x_%x
    assert node_device_name(address) == name
    assert address_from_node_device_name(name) == address
    assert address_from_node_device_name(name.upper().replace("PCI", "pci")
                                         ) == address


@pytest.mark.parametrize("name", ["usb_1_2", "pci_0000_81_00", "pci_000_81_00_0",
                                  "pci_100000000_00_00_0"])
def test_node_device_name_refuses_other_names(name):
    with pytest.raises(ValueError, match="node-device name"):
        address_from_node_device_name(name)
