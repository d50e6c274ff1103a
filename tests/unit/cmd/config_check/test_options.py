"""Where the start-up check reads the config files, and how it shows a
value (compute_agent/cmd/config_check/options.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.cmd.config_check import options
from compute_agent.exception import ConfigError
from tests.unit.cmd.config_check.configs import conf_argv, refused


def test_a_url_is_shown_with_its_passwords_masked():
    assert options.masked_url("rabbit://a:pw1@h1:5672,b:pw2@h2/v") == (
        "rabbit://a:***@h1:5672,b:***@h2/v")


def test_fuzz_bug_a_config_file_not_in_utf8_names_the_file(tmp_path):
    """Found by tools/reliability (fuzz, config files): a value written as
    an unpaired surrogate (bytes ED A0 80) escaped oslo.config's parse as a
    UnicodeDecodeError traceback, not the one line and exit 2."""
    argv = conf_argv(tmp_path, "")
    path = Path(argv[1])
    path.write_bytes(path.read_bytes() + b"update_interval = \xed\xa0\x80\n")
    with pytest.raises(ConfigError) as e:
        load_config(argv, placement_required=False)
    assert str(e.value).startswith(f"{path}: not UTF-8 text (invalid continuation byte "
                                   "at byte ")


def test_fuzz_bug_a_config_dir_that_cannot_be_read_is_named(tmp_path):
    """Found by tools/reliability (fuzz, config files): a config_dir whose
    name is too long for the kernel escaped as an OSError traceback."""
    line = refused(tmp_path, f"config_dir = {'9' * 300}\n", placement_required=False)
    assert line.startswith("[DEFAULT] config_dir: cannot be read (File name too long) "
                           "(value: '999")


def test_a_value_written_under_nova_s_name_is_shown_under_it(tmp_path):
    line = refused(tmp_path, "reserved_host_memory_mb = -1\n", placement_required=False)
    assert line.startswith("[DEFAULT] reserved_host_memory_mb: ")
    assert line.endswith("(value: '-1')")


def test_a_config_dir_is_read_in_name_order_conf_files_only(tmp_path):
    for name in ("b.conf", "a.conf", "c.conf.orig", "d.txt"):
        (tmp_path / name).write_text("")
    assert options.files_in_config_dir(str(tmp_path)) == [
        str(tmp_path / "a.conf"), str(tmp_path / "b.conf")]


def undecodable() -> UnicodeDecodeError:
    try:
        b"\xed\xa0\x80".decode("utf-8")
    except UnicodeDecodeError as e:
        return e
    raise AssertionError("decoded")


def test_the_file_not_in_utf8_is_named_past_those_that_cannot_be_read(tmp_path):
    good, bad = tmp_path / "good.conf", tmp_path / "bad.conf"
    good.write_text("[DEFAULT]\n")
    bad.write_bytes(b"[DEFAULT]\nhost = \xff\n")
    error = options.undecodable_config_file(
        [str(tmp_path / "missing.conf"), str(good), str(bad)], undecodable())
    assert str(error) == f"{bad}: not UTF-8 text (invalid start byte at byte 17)"


def test_a_file_not_in_utf8_that_cannot_be_found_again_is_still_one_line(tmp_path):
    error = options.undecodable_config_file([str(tmp_path / "gone.conf")], undecodable())
    assert str(error) == "a config file is not UTF-8 text (invalid continuation byte at " \
                         "byte 0)"
