"""The names a config file sets that no part of the agent reads
(compute_agent/cmd/config_check/names.py): a misspelling refused, another
version's name one warning."""
from __future__ import annotations

import pytest
from oslo_config import cfg

from compute_agent import config
from compute_agent.cmd.config_check import names
from compute_agent.exception import ConfigError
from tests.unit.cmd.config_check.configs import conf_argv, refused


@pytest.mark.parametrize("a,b,distance", [
    ("pmem", "pmem", 0), ("pmemm", "pmem", 1), ("enabled_mdev_type", "enabled_mdev_types", 1),
    ("debgu", "debug", 1), ("api", "pci", 2), ("update_interval_max", "update_interval", 4),
    ("", "abc", 3),
])
def test_edit_distance_counts_each_typing_slip_once(a, b, distance):
    assert names.edit_distance(a, b) == names.edit_distance(b, a) == distance


@pytest.mark.parametrize("name,known", [
    ("pmemm", "pmem"), ("enabled_mdev_type", "enabled_mdev_types"),
    ("UPDATE_INTERVAL", "update_interval"), ("default", "DEFAULT"),
    ("reconcile_intreval", "reconcile_interval"), ("pcii", "pci"),
    # Not misspellings: a short name of another service, and a newer
    # version's name that extends one of ours.
    ("api", None), ("update_interval_max", None), ("newer_feature", None),
])
def test_a_misspelling_is_a_typing_slip_or_two_from_a_name_read(name, known):
    read = ["pmem", "pci", "DEFAULT", "devices", "enabled_mdev_types", "update_interval",
            "reconcile_interval", "update_jitter"]
    assert names.misspelling_of(name, read) == known


def read_unchecked(tmp_path, text: str) -> cfg.ConfigOpts:
    """The config with ``text``, read as the check reads it, unchecked."""
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf(conf_argv(tmp_path, text + "[placement]\nauth_type = placement_noauth2\n"))
    return conf


def unknown(tmp_path, text: str) -> list[tuple[str, str | None, str | None]]:
    """The names read as the check reads them, unchecked otherwise."""
    return [(u.where(), u.known, u.file) for u in names.unknown_names(
        read_unchecked(tmp_path, text))]


def test_every_name_the_agent_reads_is_known(tmp_path):
    """Ours, a deprecated (nova's) name, oslo.log's, oslo.messaging's and
    its drivers', keystoneauth's and the chosen plugin's, [mdev_<type>]
    of an enabled type, and a section a config_source names."""
    assert unknown(tmp_path, "reserved_host_memory_mb = 512\ndebug = true\n"
                   "config_source = remote\n"
                   "[pci]\npassthrough_whitelist = {\"vendor_id\": \"8086\"}\n"
                   "[oslo_messaging_rabbit]\nheartbeat_rate = 3\n"
                   "[oslo_messaging_kafka]\nconsumer_group = agents\n"
                   "[devices]\nenabled_mdev_types = nvidia-35\n"
                   "[mdev_nvidia-35]\ndevice_addresses = 0000:81:00.0\n"
                   "[remote]\ndriver = remote_file\nuri = http://config/agent.conf\n"
                   "[Placement]\ntimeout = 10\n") == []


def test_unknown_names_are_listed_and_only_a_misspelling_names_a_known_one(tmp_path):
    path = str(tmp_path / "agent.conf")
    assert unknown(tmp_path, "update_interval_max = 5\n[devices]\nenabled_mdev_type = a\n"
                   "[mdev_nvidia-36]\nmdev_class = VGPU\n[newer]\nx = 1\n"
                   "[placement]\nusername = other-plugin\n") == [
        ("[DEFAULT] update_interval_max", None, path),
        ("[devices] enabled_mdev_type", "enabled_mdev_types", path),
        ("[mdev_nvidia-36]", None, path),
        ("[newer]", None, path),
        ("[placement] username", None, path),
    ]


def test_a_misspelt_name_is_refused_before_any_value(tmp_path):
    line = refused(tmp_path, "update_interval = 0\n[pmemm]\nnamespaces = L:ns0\n")
    assert line == f"{tmp_path / 'agent.conf'}: [pmemm]: unknown section; did you mean [pmem]?"


def test_the_unknown_names_line_is_one_line_of_at_most_300_characters():
    unknown = [names.UnknownName("/etc/compute-agent/compute-agent.conf", f"section_{i}")
               for i in range(100)]
    line = names.unknown_names_line(unknown)
    assert len(line) == 300 and line.endswith("... (100 names in all)")


@pytest.mark.parametrize("length,edits", [(3, 0), (4, 1), (9, 1), (10, 2), (30, 2)])
def test_a_longer_name_may_be_misspelt_by_more_edits(length, edits):
    assert names.typo_allowance(length) == edits


def test_a_source_drivers_section_is_its_own_to_read(tmp_path):
    """Options of [DEFAULT] config_source's sections that the agent does
    not register are the source driver's: not ours to call unknown."""
    assert unknown(tmp_path, "config_source = remote\n[remote]\ndriver = remote_file\n"
                   "uri = http://config/agent.conf\nheaders = a:b\nnewer_knob = 1\n") == []


def test_a_file_oslo_config_refused_has_no_names_to_judge(tmp_path):
    path = tmp_path / "broken.conf"
    path.write_text("an option before any section\n")
    assert names.file_sections(str(path)) == {}
    assert names.file_sections(str(tmp_path / "gone.conf")) == {}


def test_names_of_another_version_are_one_warning_and_a_misspelling_a_refusal(tmp_path,
                                                                              caplog):
    conf = read_unchecked(tmp_path, "[newer]\nx = 1\n[older]\ny = 2\n")
    names.check_names(conf)
    path = tmp_path / "agent.conf"
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == names.__name__] == [
        ("WARNING", f"Not read by this version, ignored: {path}: [newer], [older]")]
    conf = read_unchecked(tmp_path, "[newer]\nx = 1\n[pmemm]\nnamespaces = L:ns0\n")
    with pytest.raises(ConfigError, match=r"\[pmemm\]: unknown section; did you mean"):
        names.check_names(conf)
