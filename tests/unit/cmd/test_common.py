"""What every console script does alike (compute_agent/cmd/common.py): its
own options before or after its subcommand, its --version, its errors (one
line per line on stderr, or one JSON object on stdout), what the reading
of its config logs, a stdout a reader may close early, and how long the
command has run, counted against its --timeout. (The commands
as subprocesses: tests/functional/test_cli.py.)"""
from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata

import pytest

from compute_agent.cmd import common, ctl
from compute_agent.cmd.config_check import names
from compute_agent.exception import ConfigError

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


def test_version_of_a_checkout_not_installed_says_so(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(common.metadata, "version", not_installed)
    assert common.version() == "unknown (compute-agent is not installed: run tools/setup)"


def parser_with_subcommand() -> argparse.ArgumentParser:
    """A command with --debug, --timeout S and one subcommand, run, which
    has its own --json and --target HOST."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--timeout")
    run = parser.add_subparsers().add_parser("run")
    run.add_argument("--json", action="store_true")
    run.add_argument("--target")
    return parser


@pytest.mark.parametrize("argv,expected", [
    (["run", "--debug", "x"], ["--debug", "run", "x"]),
    (["run", "--timeout", "5", "--json"], ["--timeout", "5", "run", "--json"]),
    (["run", "--timeout=5", "--target", "--debug"], ["--timeout=5", "run", "--target",
                                                     "--debug"]),
    (["--timeout", "run", "run", "--debug"], ["--timeout", "run", "--debug", "run"]),
    (["run", "--", "--debug"], ["run", "--", "--debug"]),
    (["--debug"], ["--debug"]),
], ids=["flag", "with-value", "subcommand-value-kept", "value-named-as-subcommand",
        "after-double-dash", "no-subcommand-given"])
def test_the_commands_options_after_its_subcommand_move_before_it(argv, expected):
    assert common.command_options_first(parser_with_subcommand(), argv) == expected


def test_a_command_without_subcommands_keeps_its_words():
    parser = argparse.ArgumentParser()
    parser.add_argument("--debug", action="store_true")
    assert common.command_options_first(parser, ["x", "--debug"]) == ["x", "--debug"]


def test_an_error_line_begins_with_the_commands_name(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/compute-agent-ctl"])
    common.report_error("no answer", 1)
    assert capsys.readouterr().err == "compute-agent-ctl: error: no answer\n"


def test_a_line_is_bounded_with_its_whole_length_said():
    assert common.bounded_line("a\nb", 10) == "a b"
    line = common.bounded_line("x" * 500, 100)
    assert len(line) == 100 and line.endswith("... (500 characters)")


def test_a_config_error_is_one_line_of_at_most_the_limit_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["compute-agent"])
    assert common.exit_config_error(ConfigError("[DEFAULT] host: " + "x" * 400)) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert len(line) == common.ERROR_LINE_LIMIT
    assert line.startswith("compute-agent: error: [DEFAULT] host: xxx")
    assert common.exit_config_error(ConfigError("bad"), as_json=True) == 2
    assert json.loads(capsys.readouterr().out) == {"error": "bad", "exit_code": 2}


def test_a_store_error_is_exit_2(capsys):
    assert common.exit_store_error("store /x is corrupt") == 2
    assert capsys.readouterr().err.endswith("error: store /x is corrupt\n")


def unknown_section_conf(tmp_path, text: str = "") -> list[str]:
    """A config with a section no version reads (one warning) and ``text``."""
    path = tmp_path / "agent.conf"
    path.write_text("[newer_feature]\nx = 1\n" + text)
    return ["--config-file", str(path)]


def test_what_the_reading_says_is_logged_once_logging_is_set_up(tmp_path, monkeypatch,
                                                                  caplog):
    """Held until oslo.log is set up, so that it goes where the operator
    asked (here, as oslo.log is not the test's, to the test's capture)."""
    conf = common.load_config(unknown_section_conf(tmp_path))
    assert [r for r in caplog.records if r.name == names.__name__] == []
    monkeypatch.setattr(common.logging, "setup", lambda conf, project: None)
    common.setup_logging(conf)
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == names.__name__] == [
        ("WARNING", f"Not read by this version, ignored: {tmp_path / 'agent.conf'}: "
                    "[newer_feature]")]


def test_a_refused_config_is_its_one_line_and_nothing_else(tmp_path, monkeypatch, caplog):
    with pytest.raises(ConfigError):
        common.load_config(unknown_section_conf(tmp_path, "[DEFAULT]\nupdate_interval = 0\n"))
    monkeypatch.setattr(common.logging, "setup", lambda conf, project: None)
    common.setup_logging(None)
    assert [r for r in caplog.records if r.name == names.__name__] == []


@pytest.mark.parametrize("answer", ["a short answer\n", "x" * 1_000_000],
                         ids=["buffered-until-flush", "longer-than-the-buffer"])
def test_a_reader_that_closes_stdout_early_costs_no_traceback(answer):
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    os.close(read_end)  # | head, done reading
    tolerant = common._ClosedPipeTolerant(stream)
    try:
        assert tolerant.write(answer) == len(answer)
        tolerant.flush()
        assert tolerant.write("more\n") == 5
        tolerant.flush()
        diverted = os.fstat(stream.fileno())
        assert (diverted.st_rdev, diverted.st_ino) == (os.stat(os.devnull).st_rdev,
                                                       os.stat(os.devnull).st_ino)
    finally:
        stream.close()


def test_stdout_is_made_tolerant_once(monkeypatch):
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    common.tolerate_closed_stdout()
    wrapped = sys.stdout
    common.tolerate_closed_stdout()
    assert isinstance(wrapped, common._ClosedPipeTolerant) and sys.stdout is wrapped


# --- how long the command has run, counted against --timeout (process_age) ----

# proc(5): pid (comm) state ppid ...; field 22 is starttime in clock ticks.
# A command name with spaces and a parenthesis, as a process may name itself.
STAT = ("4242 (compute-agent (ctl) x) S 1 4242 4242 0 -1 4194304 100 0 0 0 5 2 0 0 20 0 "
        "3 0 {start} 50000000 3000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0")


def test_the_age_is_the_boot_clock_less_the_start_time():
    assert common.process_age(STAT.format(start=12_300), now=125.5, ticks_per_second=100) == 2.5


def test_an_unreadable_stat_is_no_age():
    assert common.process_age("garbage", now=125.5, ticks_per_second=100) == 0.0
    assert common.process_age(STAT.format(start="x"), now=125.5, ticks_per_second=100) == 0.0


def test_this_process_has_run_a_while_and_not_longer_than_the_machine():
    age = common.process_age()
    assert 0 < age < 10 ** 7
