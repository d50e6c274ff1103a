"""The registered options of every group, where a value was written, and
how it is shown (a URL with its password masked)."""
from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oslo_config import cfg

from compute_agent.config import PLACEMENT_GROUP
from compute_agent.exception import ConfigError, shown

DEFAULT = "DEFAULT"


@dataclass(frozen=True)
class Option:
    """A registered option and the section it lives in."""
    section: str
    opt: cfg.Opt

    @property
    def name(self) -> str:
        """As a config file writes it (keystoneauth's 'auth-url' is auth_url)."""
        return self.opt.dest

    def value(self, conf: cfg.ConfigOpts) -> Any:
        group = conf if self.section == DEFAULT else conf[self.section]
        return group[self.opt.dest]


# --- showing a value --------------------------------------------------------

_URL_PASSWORD = re.compile(r"(//|,)([^:@/,]*):([^@/]*)@")


def masked_url(text: str) -> str:
    """A URL with every password in it replaced by ***."""
    return _URL_PASSWORD.sub(r"\1\2:***@", text)


def files_in_config_dir(directory: str) -> list[str]:
    """What oslo.config reads of a --config-dir, in its order."""
    return sorted(str(p) for p in Path(directory).glob("*.conf"))


def config_files(conf: cfg.ConfigOpts) -> list[str]:
    files = list(conf.config_file or [])
    for directory in conf.config_dir or []:
        try:
            files += files_in_config_dir(directory)
        except OSError as e:  # a name too long, say: never "no files there"
            raise ConfigError(f"[{DEFAULT}] config_dir: cannot be read ({e.strerror}) "
                              f"(value: {shown(directory)})") from None
    return files


def undecodable_config_file(files: list[str], error: UnicodeDecodeError) -> ConfigError:
    """The one line for a config file that is not UTF-8 text, naming the
    first of ``files`` that is not (oslo.config's error names none)."""
    for name in files:
        try:
            Path(name).read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            return ConfigError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})")
        except OSError:
            continue  # oslo.config names a file it cannot read itself
    return ConfigError(f"a config file is not UTF-8 text ({error.reason} at byte "
                       f"{error.start})")


def read_config_files(conf: cfg.ConfigOpts) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        parser.read(config_files(conf), encoding="utf-8-sig")
    except configparser.Error:
        pass  # oslo.config read them: what configparser cannot is not shown
    return parser


def written_as(conf: cfg.ConfigOpts, option: Option) -> tuple[str, str, str | None]:
    """The section, name and raw text the files give an option: under its
    own name, or else under a deprecated one (nova's)."""
    files = read_config_files(conf)
    for section, name in [(option.section, option.name)] + [
            (d.group or option.section, (d.name or option.name).replace("-", "_"))
            for d in option.opt.deprecated_opts]:
        raw = files.get(section, name, fallback=None)
        if raw is not None:
            return section, name, raw
    return option.section, option.name, None


# --- the registry -----------------------------------------------------------

def registered_options(conf: cfg.ConfigOpts) -> list[Option]:
    """Every option registered on ``conf``, in every group. oslo.config has
    no public way to list the Opt objects, so this reads its registry."""
    out = [Option(DEFAULT, info["opt"]) for info in conf._opts.values()]
    for name, group in conf._groups.items():
        out += [Option(name, info["opt"]) for info in group._opts.values()]
    return out


def auth_group(conf: cfg.ConfigOpts) -> str:
    """Where the auth plugin's options are read: [placement], or the
    section its auth_section names."""
    return conf[PLACEMENT_GROUP].auth_section or PLACEMENT_GROUP
