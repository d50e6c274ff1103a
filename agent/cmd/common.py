"""Start-up shared by the console scripts: read the config, check every
value, set up logging. A bad value is one line naming the option, exit 2."""
from __future__ import annotations

import contextlib
import io
import os
import sys

from oslo_config import cfg
from oslo_log import log as logging

from agent import config
from agent.config_check import check_config, cli_file_value_refusal
from agent.exception import ConfigError

CONFIG_ERROR_EXIT = 2


def _parse(conf: cfg.ConfigOpts, argv: list[str], project: str) -> None:
    """oslo.config's parse; a command-line option's bad value in a file,
    which oslo.config writes to stderr before exiting 1, becomes the one
    line naming it."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            conf(argv, project=project)
    except SystemExit:
        refused = cli_file_value_refusal(conf, errors.getvalue())
        if refused is not None:
            raise refused from None
        sys.stderr.write(errors.getvalue())
        raise
    except cfg.Error as e:
        raise ConfigError(str(e)) from None
    sys.stderr.write(errors.getvalue())


def load_config(argv: list[str], cli_opts=(), project="compute-agent",
                placement_required: bool = False) -> cfg.ConfigOpts:
    """Read the config and check every value in it (agent.config_check),
    before the caller writes anything or starts a thread. Raises
    ConfigError naming the option and the value. ``placement_required``:
    the command talks to Placement, so its auth plugin must be set."""
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf.set_default("use_stderr", True)
    conf.register_cli_opts(list(cli_opts))
    _parse(conf, argv, project)
    check_config(conf, placement_required)
    return conf


def setup_logging(conf: cfg.ConfigOpts, project="compute-agent") -> None:
    """Console scripts only: oslo.log replaces the root logger's handlers.
    Logs go to stderr unless a log file is set, so stdout stays for data."""
    logging.setup(conf, project)


def print_output(text: str) -> None:
    """``text`` on stdout; a reader that stopped early (``| head``) is no
    error: the rest goes nowhere, with no traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _print_error(error: Exception) -> None:
    """One line per line of the error (a refusal lists each problem)."""
    for line in str(error).splitlines() or [""]:
        print(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {line}", file=sys.stderr)


def exit_config_error(error: ConfigError) -> int:
    _print_error(error)
    return CONFIG_ERROR_EXIT


# The state directory is another agent's, or its store is lost, corrupt
# or not this host's: an operator must act, so a restart would not help.
STORE_ERROR_EXIT = 2


def exit_store_error(error: Exception) -> int:
    """One line (the error names the directory or the file), exit 2."""
    _print_error(error)
    return STORE_ERROR_EXIT
