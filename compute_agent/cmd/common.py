"""Start-up shared by the console scripts: read the config, check every
value, set up logging. A bad value is one line naming the option, exit 2.
Also what every command does alike: its --version, its own options before
or after its subcommand, its errors (one line on stderr, or one JSON object
on stdout with --json) and a stdout a reader may close early."""
from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import logging as std_logging
import os
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from oslo_config import cfg
from oslo_log import log as logging

from compute_agent import config
from compute_agent.cmd.config_check.options import files_in_config_dir, undecodable_config_file
from compute_agent.cmd.config_check.whole import check_config, cli_file_value_refusal
from compute_agent.exception import ConfigError

CONFIG_ERROR_EXIT = 2
DISTRIBUTION = "compute-agent"  # setup.cfg [metadata] name
# oslo.config lists its own options (config files, logging) beside the
# command's, sorted by name; the help says which are which.
GENERIC_OPTIONS_NOTE = ("Options other than those named above are oslo.config's and "
                        "oslo.log's, common to every OpenStack service: the config "
                        "files, and where and how logs are written.")


@dataclass(frozen=True)
class CommandHelp:
    """What --help says first: the command line in short, and what it does."""
    prog: str
    usage: str
    description: str


def version() -> str:
    """The installed distribution's version, as --version prints it."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"unknown ({DISTRIBUTION} is not installed: run tools/setup)"


def _takes_value(action: argparse.Action, word: str) -> bool:
    """The option ``word`` names takes the next word as its value."""
    return action.nargs != 0 and "=" not in word


def command_options_first(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with each option of the command itself (``parser``'s) that
    follows the subcommand moved before it, in order, so that
    ``manage status --debug`` is ``manage --debug status``. The
    subcommand's own options (its --help among them) and words stay where
    they are; so does all that follows ``--``. A command without
    subcommands keeps ``argv`` as it is."""
    subcommands = next((a for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction)), None)
    if subcommands is None:
        return argv
    command = parser._option_string_actions
    at, skip = None, False
    for i, word in enumerate(argv):
        if skip:
            skip = False
        elif word in subcommands.choices:
            at = i
            break
        elif word.split("=", 1)[0] in command:
            skip = _takes_value(command[word.split("=", 1)[0]], word)
    if at is None:
        return argv
    own = subcommands.choices[argv[at]]._option_string_actions
    moved: list[str] = []
    kept: list[str] = []
    words = iter(argv[at + 1:])
    for word in words:
        if word == "--":
            kept += [word, *words]
            break
        name = word.split("=", 1)[0]
        if name in own or name not in command:
            kept.append(word)
            if name in own and _takes_value(own[name], word):
                kept += list(itertools.islice(words, 1))
        else:
            moved.append(word)
            if _takes_value(command[name], word):
                moved += list(itertools.islice(words, 1))
    return argv[:at] + moved + [argv[at]] + kept


class _ConfigOpts(cfg.ConfigOpts):
    """oslo.config's, with the command's own options taken after its
    subcommand too (``command_options_first``)."""

    def _parse_config_files(self):
        # oslo.config's one step between building its parser (the options,
        # then the subcommands) and reading the command line with it; a
        # private one, so tests/unit/cmd/test_common.py would see it renamed.
        self._oparser.initialize_parser_arguments()
        self._args = command_options_first(self._oparser, self._args)
        return super()._parse_config_files()


def _parse(conf: cfg.ConfigOpts, argv: list[str], project: str,
           command_help: CommandHelp | None) -> None:
    """oslo.config's parse; a command-line option's bad value in a file,
    which oslo.config writes to stderr before exiting 1, becomes the one
    line naming it."""
    errors = io.StringIO()
    shown: dict[str, Any] = ({} if command_help is None else
             {"prog": command_help.prog, "usage": command_help.usage,
              "description": command_help.description,
              "epilog": GENERIC_OPTIONS_NOTE})
    try:
        with contextlib.redirect_stderr(errors):
            conf(argv, project=project, version=f"%(prog)s {version()}", **shown)
    except SystemExit:
        refused = cli_file_value_refusal(conf, errors.getvalue())
        if refused is not None:
            raise refused from None
        sys.stderr.write(errors.getvalue())
        raise
    except cfg.Error as e:
        raise ConfigError(str(e)) from None
    except UnicodeDecodeError as e:
        raise undecodable_config_file(_files_named(argv, project), e) from None
    sys.stderr.write(errors.getvalue())


def _files_named(argv: list[str], project: str) -> list[str]:
    """The config files oslo.config reads for ``argv``: the defaults, or
    those given, then each given directory's *.conf."""
    given = argparse.ArgumentParser(add_help=False)
    given.add_argument("--config-file", action="append", default=[])
    given.add_argument("--config-dir", action="append", default=[])
    named, _ = given.parse_known_args(argv)
    files = named.config_file or cfg.find_config_files(project=project)
    for directory in named.config_dir or cfg.find_config_dirs(project=project):
        files += files_in_config_dir(directory)
    return files


# The loggers that speak while the config is read: oslo.config's
# (deprecated names) and the check's (names it does not read).
READING_LOGGERS = ("oslo_config", "compute_agent.cmd.config_check")


class _HeldRecords(std_logging.Handler):
    """Keeps what the reading loggers say until oslo.log is set up
    (setup_logging), so that it is formatted and sent where the operator
    asked; dropped when the config is refused, whose one line is then
    all that is said."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[std_logging.LogRecord] = []

    def emit(self, record: std_logging.LogRecord) -> None:
        self.records.append(record)


_held = _HeldRecords()


@contextlib.contextmanager
def _holding_reading_lines():
    loggers = [std_logging.getLogger(name) for name in READING_LOGGERS]
    propagated = [logger.propagate for logger in loggers]
    _held.records.clear()
    for logger in loggers:
        logger.addHandler(_held)
        logger.propagate = False
    try:
        yield
    except ConfigError:
        _held.records.clear()
        raise
    finally:
        for logger, propagate in zip(loggers, propagated):
            logger.removeHandler(_held)
            logger.propagate = propagate


def load_config(argv: list[str], cli_opts=(), project="compute-agent",
                placement_required: bool = False,
                command_help: CommandHelp | None = None) -> cfg.ConfigOpts:
    """Read the config and check every value in it (compute_agent.cmd.config_check),
    before the caller writes anything or starts a thread. Raises
    ConfigError naming the option and the value. ``placement_required``:
    the command talks to Placement, so its auth plugin must be set.
    ``command_help``: what a console script's --help says first. What the
    reading logs (a deprecated name, names not read) is logged by
    setup_logging."""
    config.read_byte_order_marks()
    conf = _ConfigOpts()
    config.register_opts(conf)
    conf.set_default("use_stderr", True)
    conf.register_cli_opts(list(cli_opts))
    with _holding_reading_lines():
        _parse(conf, argv, project, command_help)
        check_config(conf, placement_required)
    return conf


def setup_logging(conf: cfg.ConfigOpts, project="compute-agent") -> None:
    """Console scripts only: oslo.log replaces the root logger's handlers.
    Logs go to stderr unless a log file is set, so stdout stays for data.
    Then the lines held while the config was read are logged."""
    logging.setup(conf, project)
    held, _held.records[:] = list(_held.records), []
    for record in held:
        std_logging.getLogger(record.name).handle(record)


class _ClosedPipeTolerant:
    """stdout for a reader that may stop early (``| head``): once the pipe
    is closed, the rest goes to /dev/null, with no traceback and the
    command's own exit code."""

    def __init__(self, stream):
        self._stream = stream

    def _divert(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._divert()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._divert()
            # What the closed pipe refused is still buffered: to /dev/null.
            self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def tolerate_closed_stdout() -> None:
    """Console scripts only, first thing: every later write to stdout
    (help, data, errors as JSON) survives a reader that closed the pipe."""
    if not isinstance(sys.stdout, _ClosedPipeTolerant):
        sys.stdout = _ClosedPipeTolerant(sys.stdout)


def print_output(text: str) -> None:
    """``text`` on stdout, flushed: a reader sees each answer as it comes."""
    print(text, flush=True)


def json_requested(argv: list[str]) -> bool:
    """The command line asks for JSON: then its errors are JSON too, a bad
    configuration's included (found before the subcommand's flags are
    read into the config)."""
    return "--json" in argv


def _prog() -> str:
    """The command's name, as its error lines begin."""
    return os.path.basename(sys.argv[0]).removesuffix(".py")


def report_error(error: Exception | str, exit_code: int, as_json: bool = False,
                 prefix: str = "error: ") -> int:
    """An error the command ends with, returning ``exit_code``: with
    --json, one object on stdout, {"error": message, "exit_code": N},
    where a reader of the answer looks; else one line per line of the
    message (a refusal lists each problem) on stderr."""
    message = str(error)
    if as_json:
        print_output(json.dumps({"error": message, "exit_code": exit_code}))
        return exit_code
    prog = _prog()
    for line in message.splitlines() or [""]:
        print(f"{prog}: {prefix}{line}", file=sys.stderr)
    return exit_code


# An error line's length at most, the command's name and "error: " included.
ERROR_LINE_LIMIT = 300


def bounded_line(text: str, limit: int) -> str:
    """``text`` on one line of at most ``limit`` characters: its lines
    joined, and cut with its whole length given."""
    line = " ".join(text.split("\n"))
    if len(line) <= limit:
        return line
    tail = f"... ({len(line)} characters)"
    return line[:limit - len(tail)] + tail


def exit_config_error(error: ConfigError, as_json: bool = False) -> int:
    """One line (see ERROR_LINE_LIMIT), exit 2."""
    room = ERROR_LINE_LIMIT - len(f"{_prog()}: error: ")
    return report_error(bounded_line(str(error), room), CONFIG_ERROR_EXIT, as_json)


# The state directory is another agent's, or its store is lost, corrupt
# or not this host's: an operator must act, so a restart would not help.
STORE_ERROR_EXIT = 2


def exit_store_error(error: Exception | str, as_json: bool = False) -> int:
    """One line (the error names the directory or the file), exit 2."""
    return report_error(error, STORE_ERROR_EXIT, as_json)


def process_age(stat: str | None = None, now: float | None = None,
                ticks_per_second: int | None = None) -> float:
    """Seconds since this process started, from /proc/self/stat's start
    time (field 22, clock ticks since boot; proc(5)) and the boot clock:
    the time a command spent importing counts against its --timeout.
    0 where /proc cannot tell."""
    try:
        if stat is None:
            with open("/proc/self/stat") as f:
                stat = f.read()
        # The command name (field 2) is in parentheses and may hold spaces.
        fields = stat.rpartition(")")[2].split()
        started_ticks = int(fields[19])  # field 22, counted from field 3
        ticks = ticks_per_second or os.sysconf("SC_CLK_TCK")
        boot_now = time.clock_gettime(time.CLOCK_BOOTTIME) if now is None else now
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(boot_now - started_ticks / ticks, 0.0)
