"""What every console script does alike (compute_agent/cmd/common.py): its
own options before or after its subcommand, its --version, its errors (one
line per line on stderr, or one JSON object on stdout). (The commands as
subprocesses: tests/functional/test_cli.py.)"""
from __future__ import annotations

import json
from importlib import metadata

import pytest

from compute_agent.cmd import common, ctl

MIGRATION = "1d2c3b4a-5f6e-4d7c-8b9a-0f1e2d3c4b5a"


@pytest.mark.parametrize("argv", [
    ["--timeout", "5", "--debug", "--config-file", "F", "evacuate", "src", "--target", "h"],
    ["evacuate", "src", "--timeout", "5", "--target", "h", "-d", "--config-file", "F"],
    ["--config-file=F", "evacuate", "--timeout=5", "src", "--debug", "--target", "h"],
    ["evacuate", "src", "--target", "h", "--config-file", "F", "--debug", "--timeout", "5"],
], ids=["before", "after", "between", "last"])
def test_the_commands_own_options_come_before_or_after_its_subcommand(argv, conf_file):
    conf = common.load_config([str(conf_file) if a == "F" else a.replace("=F", f"={conf_file}")
                               for a in argv], ctl.cli_opts, command_help=ctl.HELP)
    assert (conf.timeout, conf.debug, conf.config_file, conf.host) == (
        5, True, [str(conf_file)], "here")
    assert (conf.command.name, conf.command.agent_host, conf.command.target) == (
        "evacuate", "src", "h")


def test_a_subcommands_own_options_and_what_follows_double_dash_stay_its_own(conf_file):
    conf = common.load_config(
        ["--config-file", str(conf_file), "live-migrate", "inst", "--target", "h",
         "--timeout", "7", "--migration", MIGRATION], ctl.cli_opts, command_help=ctl.HELP)
    assert (conf.command.instance, conf.command.target, conf.command.migration,
            conf.timeout) == ("inst", "h", MIGRATION, 7)
    conf = common.load_config(["--config-file", str(conf_file), "show", "h", "--",
                               "--debug"], ctl.cli_opts, command_help=ctl.HELP)
    assert (conf.command.instance, conf.debug) == ("--debug", False)


def test_version_is_the_installed_distributions():
    assert common.version() == metadata.version("compute-agent")


def test_an_error_with_json_is_one_object_on_stdout(capsys):
    assert common.report_error("no answer from h1\nsecond line", 1, as_json=True) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == {"error": "no answer from h1\nsecond line", "exit_code": 1}


def test_an_error_without_json_is_a_line_per_line_on_stderr(capsys):
    assert common.report_error(ValueError("a\nb"), 2, prefix="unknown: ") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert [line.split(": ", 1)[1] for line in err.splitlines()] == [
        "unknown: a", "unknown: b"]


def test_json_is_asked_for_by_the_flag_anywhere_on_the_line():
    assert common.json_requested(["--config-file", "f", "tree", "--json"])
    assert not common.json_requested(["--config-file", "f", "tree"])
