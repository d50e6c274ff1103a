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
