"""The operator's policy read from a config file: nova's option names are
accepted, bad values are refused naming the option."""
import pytest

from compute_agent.cmd.common import load_config
from compute_agent.exception import ConfigError
from compute_agent.tree.policy import tree_policy_from_conf

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"


def policy_from(tmp_path, text: str):
    path = tmp_path / "agent.conf"
    path.write_text(text)
    return tree_policy_from_conf(load_config(["--config-file", str(path)]), ROOT)


def test_the_owner_trait_defaults_to_nova_s(tmp_path):
    assert policy_from(tmp_path, "[DEFAULT]\n").owner_trait == "OWNER_NOVA"


@pytest.mark.parametrize("value", ["OWNER_CYBORG", "CUSTOM_OWNER_ME"])
def test_an_owner_trait_of_os_traits_or_custom_is_taken(tmp_path, value):
    assert policy_from(tmp_path, f"[DEFAULT]\nowner_trait = {value}\n").owner_trait == value


@pytest.mark.parametrize("value", ["owner_nova", "OWNER_ME", "CUSTOM_my-owner",
                                   "COMPUTE_NODE"])
def test_a_bad_owner_trait_is_refused_naming_the_option(tmp_path, value):
    with pytest.raises(ConfigError) as err:
        policy_from(tmp_path, f"[DEFAULT]\nowner_trait = {value}\n")
    assert "[DEFAULT] owner_trait" in str(err.value) and value in str(err.value)


# nova's names for the same settings, as a nova.conf carries them.
NOVA_CONF = """[DEFAULT]
cpu_allocation_ratio = 2.5
ram_allocation_ratio = 1.5
disk_allocation_ratio = 3.0
reserved_host_memory_mb = 4096
reserved_host_disk_mb = 10240

[pci]
passthrough_whitelist = {"vendor_id": "8086", "product_id": "154c"}

[libvirt]
pmem_namespaces = 128G:ns0|ns1,MEDIUM:ns2
"""


def test_nova_s_option_names_are_read_as_ours(tmp_path):
    p = policy_from(tmp_path, NOVA_CONF)
    assert (p.cpu_allocation_ratio, p.ram_allocation_ratio, p.disk_allocation_ratio) == (
        2.5, 1.5, 3.0)
    assert (p.reserved_memory_mb, p.reserved_disk_mb) == (4096, 10240)
    assert [s.text for s in p.device_specs] == [
        '{"vendor_id": "8086", "product_id": "154c"}']
    assert p.pmem_labels == (("128G", frozenset({"ns0", "ns1"})),
                             ("MEDIUM", frozenset({"ns2"})))


def test_our_option_names_win_over_nova_s(tmp_path):
    p = policy_from(tmp_path, NOVA_CONF + "[compute]\ncpu_allocation_ratio = 8.0\n")
    assert p.cpu_allocation_ratio == 8.0


def test_a_bad_value_under_nova_s_name_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        policy_from(tmp_path, "[DEFAULT]\ncpu_allocation_ratio = lots\n")
    assert str(err.value).startswith("[DEFAULT] cpu_allocation_ratio: ")
    assert "(value: 'lots')" in str(err.value)


@pytest.mark.parametrize("text,reason", [
    ("[compute]\ncpu_dedicated_set = 0-7,^0-7\n", "[compute] cpu_dedicated_set: names no CPU"),
    ("[compute]\ncpu_shared_set = 1,,2\n", "[compute] cpu_shared_set: an empty item"),
    ("[compute]\ncpu_shared_set = 4-x\n", "[compute] cpu_shared_set: not a CPU number"),
    ("[pmem]\nnamespaces = bad label!:ns0\n", "[pmem] namespaces: label 'bad label!'"),
    ("[pmem]\nnamespaces = L:ns 0\n", "[pmem] namespaces: namespace 'ns 0'"),
    ("[pmem]\nnamespaces = L:ns0,L:ns1\n", "[pmem] namespaces: label 'L' given twice"),
    ("[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\nmdev_class = CUSTOM_\n",
     "[mdev_nvidia-35] mdev_class: not a standard class"),
    ("[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\n"
     "device_addresses = 81:00.0\n", "[mdev_nvidia-35] device_addresses: not a PCI"),
    ("[devices]\nenabled_mdev_types = bad type!\n", "[devices] enabled_mdev_types: not an"),
    ("[pci]\nvf_counts = 0000:81:00.0\n", "[pci] vf_counts: expected ADDRESS=COUNT"),
    ("[pci]\nvf_counts = 0000:81:00.0=-1\n", "[pci] vf_counts: expected ADDRESS=COUNT"),
    ("[pci]\nvf_counts = 0000:81:00.0=65536\n", "[pci] vf_counts: expected ADDRESS=COUNT"),
    ("[pci]\nvf_counts = 81:00.0=8\n", "[pci] vf_counts: not a PCI"),
    ("[pci]\nvf_counts = 0000:81:00.0=8,0000:81:00.0=4\n",
     "[pci] vf_counts: PF 0000:81:00.0 given twice"),
])
def test_a_policy_that_can_never_work_is_refused_naming_the_option(tmp_path, text, reason):
    with pytest.raises(ConfigError) as err:
        policy_from(tmp_path, text)
    assert str(err.value).startswith(reason) and "(value: " in str(err.value)


def test_mdev_addresses_are_read_in_canonical_form(tmp_path):
    p = policy_from(tmp_path, "[devices]\nenabled_mdev_types = nvidia-35\n"
                    "[mdev_nvidia-35]\ndevice_addresses = 0000:81:00.0, 0000:82:00.0\n")
    assert p.mdev_types[0].addresses == frozenset({"0000:81:00.0", "0000:82:00.0"})


def test_vf_counts_are_read_by_canonical_address(tmp_path):
    p = policy_from(tmp_path, "[pci]\nvf_counts = 0000:82:00.0=0, 0000:81:00.0 = 8\n")
    assert p.vf_counts == (("0000:81:00.0", 8), ("0000:82:00.0", 0))
