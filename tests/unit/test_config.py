"""The agent's options: every one listed for the sample config, nova's
names carried over, [mdev_<type>] groups once the types are known, a
config file that starts with a byte-order mark, and each config's own
[placement] auth plugin options. (Each value's checks:
tests/unit/cmd/config_check/test_value_rules.py; the sample:
test_sample_config.py.)"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from compute_agent import config

# oslo.messaging's own groups, which its own sample namespace lists.
OSLO_MESSAGING_PREFIX = "oslo_messaging_"


@pytest.fixture
def read(tmp_path: Path) -> Callable[[str], cfg.ConfigOpts]:
    """A config with the agent's options, read from a file of ``text``."""
    def read_text(text: str, encoding: str = "utf-8") -> cfg.ConfigOpts:
        path = tmp_path / "compute-agent.conf"
        path.write_text(text, encoding=encoding)
        conf = cfg.ConfigOpts()
        config.register_opts(conf)
        conf(args=["--config-file", str(path)], default_config_files=[],
             default_config_dirs=[])
        return conf
    return read_text


def listed() -> dict[str, set[str]]:
    """group -> the options list_opts() gives the sample config."""
    out: dict[str, set[str]] = {}
    for group, opts in config.list_opts():
        name = group.name if isinstance(group, cfg.OptGroup) else group or "DEFAULT"
        out[name] = {o.dest for o in opts}
    return out


def test_every_option_registered_in_the_agents_groups_is_in_the_sample():
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    groups = {name for name in conf if isinstance(conf[name], cfg.ConfigOpts.GroupAttr)
              and not name.startswith(OSLO_MESSAGING_PREFIX)}
    sample = listed()
    assert groups == set(sample) - {"DEFAULT"}
    for group in groups - {config.PLACEMENT_GROUP}:
        assert set(conf[group]) == sample[group], group
    # [placement] lists the password plugin's options too, which keystoneauth
    # registers only once it reads auth_type.
    assert set(conf[config.PLACEMENT_GROUP]) < sample[config.PLACEMENT_GROUP]
    assert {o.dest for o in config.default_opts} <= set(conf)


def test_placement_is_found_in_the_catalog_as_placement(read):
    assert read("").placement.service_type == "placement"


def test_a_configs_auth_plugin_options_are_its_own(read, tmp_path):
    with_keystone = read("[placement]\nauth_type = password\nauth_url = http://ks/v3\n"
                         "username = agent\npassword = secret\n")
    ks_loading.load_auth_from_conf_options(with_keystone, config.PLACEMENT_GROUP)
    assert with_keystone.placement.username == "agent"
    # A config read after it has no password plugin, so no required auth_url.
    another = read("")
    assert "username" not in another.placement


@pytest.mark.parametrize("nova, option, value", [
    ("[DEFAULT]\nreserved_host_memory_mb = 2048\n", ("compute", "reserved_host_memory_mb"),
     2048),
    ("[DEFAULT]\ncpu_allocation_ratio = 16.0\n", ("compute", "cpu_allocation_ratio"), 16.0),
    ('[pci]\npassthrough_whitelist = {"vendor_id": "8086"}\n', ("pci", "device_spec"),
     ['{"vendor_id": "8086"}']),
    ("[libvirt]\npmem_namespaces = 128G:ns0|ns1\n", ("pmem", "namespaces"), ["128G:ns0|ns1"]),
])
def test_a_nova_conf_value_carries_over_under_novas_name(read, nova, option, value):
    group, name = option
    assert read(nova)[group][name] == value


def test_each_enabled_mdev_type_gets_its_group_once_the_types_are_read(read):
    conf = read("[devices]\nenabled_mdev_types = nvidia-35,nvidia-36\n"
                "[mdev_nvidia-35]\ndevice_addresses = 0000:af:00.0\nmdev_class = CUSTOM_A\n")
    config.register_mdev_type_groups(conf)
    assert (conf["mdev_nvidia-35"].device_addresses, conf["mdev_nvidia-35"].mdev_class) == (
        ["0000:af:00.0"], "CUSTOM_A")
    assert (conf["mdev_nvidia-36"].device_addresses, conf["mdev_nvidia-36"].mdev_class) == (
        [], "VGPU")
    assert "mdev_nvidia-37" not in conf


def test_a_config_file_that_starts_with_a_byte_order_mark_is_read(read, monkeypatch):
    # Patched back after the test, as it was.
    monkeypatch.setattr(cfg.ConfigParser, "parse", cfg.ConfigParser.parse)
    config.read_byte_order_marks()
    conf = read("[DEFAULT]\nhost = compute-1\n", encoding="utf-8-sig")
    assert conf.host == "compute-1"
