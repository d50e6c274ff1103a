"""The names a config file sets that no part of the agent reads: a
misspelling is refused, another version's name is one warning."""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from keystoneauth1 import loading as ks_loading
from keystoneauth1.plugin import BaseAuthPlugin
from oslo_config import cfg, iniparser

from compute_agent import config
from compute_agent.cmd.config_check.options import DEFAULT, auth_group, config_files, registered_options
from compute_agent.exception import ConfigError

LOG = logging.getLogger(__name__)

# A name no part of the agent reads is either a misspelling of one it
# reads (a refusal: the operator's setting would silently not apply) or
# a name of another version or another service (one warning: a fleet's
# shared config may carry options a newer agent reads).

MDEV_SECTION_PREFIX = "mdev_"
MDEV_OPTIONS = frozenset(o.dest for o in config.mdev_type_opts)


@dataclass(frozen=True)
class UnknownName:
    """A section, or an option in a section, that the agent does not read;
    ``known``: the name it reads that this one is a misspelling of."""
    file: str
    section: str
    option: str | None = None  # None: the section itself
    known: str | None = None

    def where(self) -> str:
        return f"[{self.section}]" + ("" if self.option is None else f" {self.option}")

    def refusal(self) -> ConfigError:
        kind = "section" if self.option is None else "option"
        known = f"[{self.known}]" if self.option is None else self.known
        return ConfigError(f"{self.file}: {self.where()}: unknown {kind}; "
                           f"did you mean {known}?")


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbours
    that turn ``a`` into ``b`` (the optimal string alignment distance)."""
    previous, row = None, list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        before, row = row, [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            row[j] = min(before[j] + 1, row[j - 1] + 1, before[j - 1] + (x != y))
            if (previous is not None and i > 1 and j > 1 and x == b[j - 2]
                    and a[i - 2] == y):
                row[j] = min(row[j], previous[j - 2] + 1)
        previous = before
    return row[-1]


def typo_allowance(length: int) -> int:
    """The edits a misspelling of a name this long is within: none below
    four characters ([api] is not [pci]), one up to nine, two beyond. A
    newer version's name that extends one of ours
    (update_interval_max) is further off, and only warned of."""
    return 0 if length < 4 else 1 if length < 10 else 2


def misspelling_of(name: str, known: Iterable[str]) -> str | None:
    """The nearest of ``known`` that ``name`` is within typo_allowance
    edits of, letter case aside (a name in the wrong case is not read
    either); None when none is that near."""
    near = [(edit_distance(name.lower(), k.lower()), k) for k in known if k != name]
    near = [(d, k) for d, k in near if d <= typo_allowance(max(len(name), len(k)))]
    return min(near)[1] if near else None


def group_key(section: str) -> str:
    """A section as oslo.config matches it to a group (letter case aside,
    but for DEFAULT)."""
    return section if section == DEFAULT else section.lower()


def file_sections(path: str) -> dict[str, dict[str, list[str]]]:
    """A config file's sections and their options, read by oslo.config's
    own parser; {} for a file oslo.config has already refused."""
    sections: dict[str, dict[str, list[str]]] = {}
    try:
        cfg.ConfigParser(path, sections).parse()
    except (OSError, UnicodeDecodeError, iniparser.ParseError):
        return {}
    return sections


@functools.cache
def _plugin_option_names() -> dict[str, frozenset[str]]:
    """Each auth plugin keystoneauth has, and the options it reads."""
    out: dict[str, frozenset[str]] = {}
    # keystoneauth's return type names a type variable it never binds.
    loaders: dict[str, ks_loading.BaseLoader[BaseAuthPlugin]] = (
        ks_loading.get_available_plugin_loaders())
    for name, loader in loaders.items():
        out[name] = frozenset(n.replace("-", "_") for o in loader.get_options()
                              for n in [o.dest, *(d.name for d in o.deprecated)])
    return out


def read_names(conf: cfg.ConfigOpts) -> dict[str, set[str]]:
    """Section (as group_key gives it) -> the option names read there:
    every registered option, under its own name and its deprecated ones,
    and the chosen auth plugin's options."""
    names: dict[str, set[str]] = {}
    for option in registered_options(conf):
        names.setdefault(group_key(option.section), set()).add(option.name)
        for old in option.opt.deprecated_opts:
            names.setdefault(group_key(old.group or option.section), set()).add(
                (old.name or option.opt.dest).replace("-", "_"))
    group = auth_group(conf)
    plugin = _plugin_option_names().get(conf[group].auth_type or "", frozenset())
    names.setdefault(group_key(group), set()).update(plugin)
    return names


def _enabled_mdev_sections(conf: cfg.ConfigOpts) -> None:
    """Register the [mdev_<type>] groups of the enabled types; a bad
    enabled_mdev_types is refused by the walk over the values."""
    try:
        config.register_mdev_type_groups(conf)
    except (ValueError, cfg.Error):
        pass


def unknown_names(conf: cfg.ConfigOpts) -> list[UnknownName]:
    """Every section and option of the config files that the agent does
    not read, a misspelling with the name it misspells. The sections of
    [DEFAULT] config_source are their source driver's to read."""
    _enabled_mdev_sections(conf)
    read = read_names(conf)
    auth = group_key(auth_group(conf))
    other_plugins = frozenset().union(*_plugin_option_names().values())
    sources = {group_key(s) for s in _config_source_names(conf)}
    out = []
    for path in config_files(conf):
        for section, options in file_sections(path).items():
            key = group_key(section)
            if key in sources:
                continue
            if key not in read:
                # [mdev_<type>] of a type not enabled here: another host's.
                near = (None if key.startswith(MDEV_SECTION_PREFIX)
                        else misspelling_of(key, read))
                out.append(UnknownName(path, section, None, near))
                continue
            for name in options:
                if name in read[key]:
                    continue
                near = (None if key == auth and name in other_plugins
                        else misspelling_of(name, read[key]))
                out.append(UnknownName(path, section, name, near))
    return out


def _config_source_names(conf: cfg.ConfigOpts) -> list[str]:
    try:
        return list(conf.config_source or [])
    except (ValueError, cfg.Error):
        return []


WARNING_LINE_LIMIT = 300


def unknown_names_line(unknown: list[UnknownName]) -> str:
    """The one warning line naming what is not read, cut to
    WARNING_LINE_LIMIT characters with how many names there are."""
    by_file: dict[str, list[str]] = {}
    for u in unknown:
        by_file.setdefault(u.file, []).append(u.where())
    text = ("Not read by this version, ignored: "
            + "; ".join(f"{f}: {', '.join(ws)}" for f, ws in by_file.items()))
    if len(text) <= WARNING_LINE_LIMIT:
        return text
    tail = f"... ({len(unknown)} names in all)"
    return text[:WARNING_LINE_LIMIT - len(tail)] + tail


def check_names(conf: cfg.ConfigOpts) -> None:
    """Refuse the first misspelt name; log the others in one warning."""
    unknown = unknown_names(conf)
    for u in unknown:
        if u.known is not None:
            raise u.refusal()
    if unknown:
        LOG.warning("%s", unknown_names_line(unknown))
