"""Start-up shared by the console scripts: read the config, check every
value, set up logging. A bad value is one line naming the option, exit 2."""
from __future__ import annotations

import configparser
import sys

from oslo_config import cfg
from oslo_log import log as logging

from agent import config
from agent.exception import ConfigError

CONFIG_ERROR_EXIT = 2


def _raw_value(conf: cfg.ConfigOpts, group: str, name: str) -> str | None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        parser.read(conf.config_file or [])
        return parser.get(group, name, fallback=None)
    except configparser.Error:
        return None


def _written_as(conf: cfg.ConfigOpts, section: str, opt: cfg.Opt
                ) -> tuple[str, str, str | None]:
    """The section, name and raw value the file gives an option: under
    its own name, or else under a deprecated one (nova's)."""
    for group, name in [(section, opt.name)] + [
            (d.group or section, d.name or opt.name) for d in opt.deprecated_opts]:
        raw = _raw_value(conf, group, name)
        if raw is not None:
            return group, name, raw
    return section, opt.name, None


def check_all_values(conf: cfg.ConfigOpts) -> None:
    """oslo.config checks a value only when it is first read: read them all
    now, so a typo fails at start-up and not an hour later."""
    for group, opts in config.list_opts():
        for opt in opts:
            try:
                (conf[group] if group else conf)[opt.dest]
            except (cfg.ConfigFileValueError, ValueError) as e:
                reason = str(e).split("is not valid: ", 1)[-1]
                section, name, raw = _written_as(conf, group or "DEFAULT", opt)
                raise ConfigError(f"[{section}] {name}: {reason} "
                                  f"(value: {raw!r})") from None
            except cfg.NoSuchOptError:
                pass


def load_config(argv: list[str], cli_opts=(), project="compute-agent") -> cfg.ConfigOpts:
    """Raises ConfigError naming the option and the value."""
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf.set_default("use_stderr", True)
    conf.register_cli_opts(list(cli_opts))
    try:
        conf(argv, project=project)
    except cfg.Error as e:
        raise ConfigError(str(e)) from None
    check_all_values(conf)
    return conf


def setup_logging(conf: cfg.ConfigOpts, project="compute-agent") -> None:
    """Console scripts only: oslo.log replaces the root logger's handlers.
    Logs go to stderr unless a log file is set, so stdout stays for data."""
    logging.setup(conf, project)


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
