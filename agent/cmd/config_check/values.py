"""The start-up check of the whole configuration.

Every command (compute-agent, compute-agent-manage, compute-agent-ctl) runs
``check_config`` right after reading its config files and before it writes
anything or starts a thread. It reads every registered option of every
group (ours, oslo.log's, oslo.messaging's, keystoneauth's and the
``[placement]`` auth plugin's own) and refuses the first bad one with a
ConfigError of one line: ``[section] option: reason (value: ...)``. A
secret's value is never shown (``***``); a URL is shown with its password
masked.

oslo.config checks a value's type and its declared bounds when the value
is first read; the rules here add what a type cannot say: bounds for the
libraries' numbers (which declare none), finite floats, paths that exist,
URLs that parse, names Placement accepts, and the options an auth plugin
cannot do without. A string option that no rule checks is listed in
FREE_FORM with the reason any value is valid.
"""
from __future__ import annotations

import configparser
import errno
import functools
import logging
import logging.handlers
import math
import os
import re
import socket
import ssl
import syslog
import threading
import uuid
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from keystoneauth1 import discover
from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg
from oslo_config import iniparser
from oslo_context import context as request_context
from oslo_log import formatters as log_formatters
from oslo_log import log as oslo_log

from agent import config
from agent.cmd.errors import BadValue
from agent.config import PLACEMENT_GROUP
from agent.exception import ConfigError, shown
from agent.messaging import messaging
from agent.metrics import parse_listen
from agent.rpc import versions as rpc_versions
from agent.tree.policy import tree_policy_from_conf

LOG = logging.getLogger(__name__)

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


def _config_files(conf: cfg.ConfigOpts) -> list[str]:
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


def _read_files(conf: cfg.ConfigOpts) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        parser.read(_config_files(conf), encoding="utf-8-sig")
    except configparser.Error:
        pass  # oslo.config read them: what configparser cannot is not shown
    return parser


def written_as(conf: cfg.ConfigOpts, option: Option) -> tuple[str, str, str | None]:
    """The section, name and raw text the files give an option: under its
    own name, or else under a deprecated one (nova's)."""
    files = _read_files(conf)
    for section, name in [(option.section, option.name)] + [
            (d.group or option.section, (d.name or option.name).replace("-", "_"))
            for d in option.opt.deprecated_opts]:
        raw = files.get(section, name, fallback=None)
        if raw is not None:
            return section, name, raw
    return option.section, option.name, None


# A refusal's longest: with the command's name and "error: " before it,
# the line stays within 300 characters (agent.cmd.common.ERROR_LINE_LIMIT).
REFUSAL_LENGTH = 270


def refusal(conf: cfg.ConfigOpts, option: Option, reason: str,
            value: Any = None) -> ConfigError:
    """The one line for a bad value: where the operator wrote it, why it is
    bad, and the value as written (a secret as ***)."""
    section, name, raw = written_as(conf, option)
    text = raw if raw is not None else value
    if isinstance(text, str) and len(repr(text)) > 80:
        # A library's reason may quote the value whole: shown once, cut.
        reason = reason.replace(repr(text), "the value").replace(text, "the value")
    if text is None:
        text_shown = "unset"
    elif option.opt.secret and VALUE_RULES.get(_key(option)) is not transport_url:
        text_shown = "***"
    elif isinstance(text, str):
        text_shown = shown(masked_url(text))
    else:
        text_shown = shown(text)
    head, tail = f"[{section}] {name}: ", f" (value: {text_shown})"
    room = max(REFUSAL_LENGTH - len(head) - len(tail), 40)
    if len(reason) > room:
        reason = reason[:room - 3] + "..."
    return ConfigError(f"{head}{reason}{tail}")


# --- the registry -----------------------------------------------------------

def registered_options(conf: cfg.ConfigOpts) -> list[Option]:
    """Every option registered on ``conf``, in every group. oslo.config has
    no public way to list the Opt objects, so this reads its registry."""
    out = [Option(DEFAULT, info["opt"]) for info in conf._opts.values()]
    for name, group in conf._groups.items():
        out += [Option(name, info["opt"]) for info in group._opts.values()]
    return out


# --- names: read, misspelt, unknown ------------------------------------------
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
    out = {}
    for name, loader in ks_loading.get_available_plugin_loaders().items():
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
    for path in _config_files(conf):
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


# --- rules on one value -----------------------------------------------------
# Each takes the value oslo.config converted and raises BadValue.

# Linux's limits: a whole path, and one name in it (a file system's own).
PATH_MAX = 4095
NAME_MAX = 255


def path_lengths(value: str) -> None:
    """A path the kernel takes: asked about a longer one, every call fails
    with ENAMETOOLONG, which no later step expects."""
    if len(os.fsencode(value)) > PATH_MAX:
        raise BadValue(f"longer than a path may be ({PATH_MAX} bytes)")
    for name in Path(value).parts:
        if len(os.fsencode(name)) > NAME_MAX:
            raise BadValue(f"a name in the path is longer than {NAME_MAX} bytes "
                           f"({len(os.fsencode(name))})")


def absolute_path(value: str) -> None:
    if not value.strip() or not os.path.isabs(value):
        raise BadValue("not an absolute path")
    path_lengths(value)


def existing_directory(value: str) -> None:
    absolute_path(value)
    if not os.path.isdir(value):
        raise BadValue("no such directory")


def readable_file(value: str) -> None:
    """'' is unset: the libraries' defaults for their file options."""
    if value == "":
        return
    path_lengths(value)
    if os.path.isdir(value):
        raise BadValue("a directory, not a file")
    if not os.path.isfile(value):
        raise BadValue("no such file")
    if not os.access(value, os.R_OK):
        raise BadValue("not readable")


def file_to_write(value: str) -> None:
    """A file the agent writes, there or not yet: not a directory, and in
    a directory that is there. Nothing is created here."""
    absolute_path(value)
    if os.path.isdir(value):
        raise BadValue("a directory, not a file")
    if not os.path.isdir(os.path.dirname(value)):
        raise BadValue(f"no such directory {os.path.dirname(value)}")


def state_directory(value: str) -> None:
    """A directory the agent can make its own: there, or creatable under
    the nearest ancestor that is there. Nothing is created here."""
    absolute_path(value)
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise BadValue("not a directory")
    existing = next(p for p in [path, *path.parents] if p.exists())
    if not existing.is_dir():
        raise BadValue(f"{existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BadValue(f"{existing} is not writable")


# A host name (RFC 1123 letters, digits, '-', '.'), with '_' as nova allows;
# it prefixes every provider's name, which Placement bounds at 200.
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def host_name(value: str) -> None:
    if not _HOST.fullmatch(value):
        raise BadValue("not a host name of up to 100 letters, digits, "
                       "'.', '-' and _")


def http_url(value: str) -> None:
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        raise BadValue(f"not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadValue("not an http:// or https:// URL with a host")
    if port == 0:
        raise BadValue("port 0")


@functools.cache
def _drivers(group: str) -> tuple[str, ...]:
    """The names of an oslo.messaging driver entry point group."""
    return tuple(sorted(e.name for e in entry_points(group=group)))


def _known_transports() -> tuple[str, ...]:
    return _drivers("oslo.messaging.drivers")


@functools.cache
def driver_import_problem(name: str) -> str | None:
    """Why oslo.messaging's driver ``name`` cannot be loaded (its module,
    or a library it needs, is not installed), or None when it loads. The
    entry point is listed whether or not its library is there."""
    for point in entry_points(group="oslo.messaging.drivers"):
        if point.name == name:
            try:
                point.load()
            except ImportError as e:
                return str(e)
    return None


def transport_url(value: str) -> None:
    """oslo.messaging's URL: driver://[user:pass@]host:port[,...]/[vhost],
    with a driver it has, and hosts and ports that can be connected to.
    No host (its default, 'rabbit://') is the driver's default host."""
    if value is None:
        return
    if "://" not in value:
        raise BadValue("not a transport URL driver://user:pass@host:port/")
    try:
        url = messaging.TransportURL.parse(cfg.ConfigOpts(), value)
    except (ValueError, messaging.InvalidTransportURL) as e:
        raise BadValue(f"not a transport URL: {str(e).splitlines()[0]}") from None
    if url.transport not in _known_transports():
        raise BadValue(f"unknown driver {url.transport!r}; known: "
                       f"{', '.join(_known_transports())}")
    missing = driver_import_problem(url.transport)
    if missing is not None:
        raise BadValue(f"the {url.transport} driver is not installed ({missing})")
    for host in url.hosts:
        if not host.hostname or not re.fullmatch(r"[A-Za-z0-9_.:\[\]-]+", host.hostname):
            raise BadValue(f"bad host {host.hostname!r}")
        if host.port is not None and not 1 <= host.port <= 65535:
            raise BadValue(f"port {host.port} is not within 1-65535")


_LIBVIRT_URI = re.compile(
    r"(?P<driver>[a-z0-9]+)(\+(?P<transport>unix|ssh|tcp|tls|libssh|libssh2|ext))?"
    r"://[^\s]*/[^\s]*")


def libvirt_uri(value: str) -> None:
    """A URI the agent's libvirt driver can use: QEMU's, or the test
    driver's (test:///default or test:///<host XML>)."""
    match = _LIBVIRT_URI.fullmatch(value)
    if not match or match["driver"] not in ("qemu", "test"):
        raise BadValue("not a libvirt URI qemu[+transport]://[host]/system "
                       "or test:///<file>")


@functools.cache
def request_context_values() -> dict[str, Any]:
    """A request context's logging values, as oslo.log fills a record
    with them. The context is made in a thread of its own: oslo.context
    makes a new context its thread's current one, which every later line
    the thread logs would carry."""
    values: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: values.update(
        request_context.RequestContext().get_logging_values()))
    thread.start()
    thread.join()
    return values


@functools.cache
def log_record_fields(with_context: bool) -> dict[str, Any]:
    """The fields of a record as oslo.log's formatter fills them, with
    its defaults: the standard ones, oslo.log's own, and with a request
    context, the context's. A record logged outside a request has no
    context (the default format's record)."""
    defaults = cfg.ConfigOpts()
    oslo_log.register_options(defaults)
    defaults([], default_config_files=[], default_config_dirs=[])
    formatter = log_formatters.ContextFormatter(config=defaults, project="compute-agent",
                                                version="0")
    record = logging.LogRecord("agent", logging.DEBUG, __file__, 1, "message %s", ("x",),
                               None)
    if with_context:
        record.context = dict(request_context_values())
    formatter.format(record)
    return dict(record.__dict__)


def _rendered(value: str, fields: dict[str, Any]) -> None:
    """``value`` filled from ``fields`` as oslo.log fills it: a field a
    record lacks or a conversion its value does not take would make every
    log line a "Logging error" traceback."""
    try:
        value % fields
    except KeyError as e:
        raise BadValue(f"a log record has no field {e.args[0]!r}") from None
    except (ValueError, TypeError) as e:
        raise BadValue(f"not a %-format string for a log record: {e}") from None


def record_format(value: str) -> None:
    """A format of a record logged outside a request (the default format,
    the debug suffix and the exception prefix of every record)."""
    _rendered(value, log_record_fields(with_context=False))


def context_record_format(value: str) -> None:
    """The format of a record logged within a request."""
    _rendered(value, log_record_fields(with_context=True))


def user_identity_format(value: str) -> None:
    """Filled from a request context's logging values."""
    _rendered(value, request_context_values())


def instance_format(value: str) -> None:
    """Filled with an instance's uuid."""
    _rendered(value, {"uuid": "00000000-0000-0000-0000-000000000000"})


def log_levels(value: list[str]) -> None:
    """oslo.log's logger=LEVEL pairs."""
    for item in value:
        logger, sep, level = item.partition("=")
        if not sep or not logger.strip() or not isinstance(
                logging.getLevelName(level.strip().upper()), int):
            raise BadValue(f"{item!r} is not logger=LEVEL with a known level")


def syslog_facility(value: str) -> None:
    name = value.upper() if value.upper().startswith("LOG_") else "LOG_" + value.upper()
    if not hasattr(syslog, name):
        raise BadValue("not a syslog facility; known: " + ", ".join(
            sorted(logging.handlers.SysLogHandler.facility_names)))


# AMQP and Kafka names: exchanges, topics, consumer groups.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,255}")


def queue_name(value: str) -> None:
    if not _QUEUE_NAME.fullmatch(value):
        raise BadValue("not a name of letters, digits, '.', ':', '-' and _")


def queue_names(value: list[str]) -> None:
    if not value:
        raise BadValue("empty")
    for item in value:
        queue_name(item)


def notification_drivers(value: list[str]) -> None:
    known = _drivers("oslo.messaging.notify.drivers")
    for item in value:
        if item not in known:
            raise BadValue(f"unknown driver {item!r}; known: {', '.join(known)}")


def rabbit_ssl_version(value: str) -> None:
    """'' (the default) leaves the choice to the SSL library."""
    from oslo_messaging._drivers.impl_rabbit import Connection
    if value == "":
        return
    try:
        Connection.validate_ssl_version(value)
    except RuntimeError:
        raise BadValue("not an SSL version oslo.messaging knows: " + ", ".join(
            sorted(Connection._SSL_PROTOCOLS))) from None


def kombu_compression(value: str) -> None:
    import kombu.compression
    try:
        kombu.compression.get_encoder(value)
    except KeyError:
        raise BadValue("not a compression kombu has (gzip, bz2, lzma)") from None


def kafka_sasl_mechanism(value: str) -> None:
    known = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
    if value not in known:
        raise BadValue(f"not one of {', '.join(known)}")


def tls_ciphers(value: str) -> None:
    try:
        ssl.create_default_context().set_ciphers(value)
    except ssl.SSLError:
        raise BadValue("OpenSSL knows no cipher in this list") from None


def service_type(value: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,63}", value):
        raise BadValue("not a service type (lower-case letters, digits, -)")


def endpoint_interfaces(value: list[str]) -> None:
    known = ("public", "internal", "admin")
    if not value or any(v not in known for v in value):
        raise BadValue(f"not a list of {', '.join(known)}")


def api_version(value: str) -> None:
    try:
        discover.normalize_version_number(value)
    except (TypeError, ks_exc.DiscoveryFailure):
        raise BadValue("not an API version such as 1.0 or latest") from None


def http_status_codes(value: list[int]) -> None:
    for item in value:
        if not 100 <= item <= 599:
            raise BadValue(f"{item} is not an HTTP status code 100-599")


def rpc_version(value: str) -> None:
    """A version of the RPC API's ledger (there are no aliases)."""
    try:
        rpc_versions.known(value)
    except ValueError:
        raise BadValue("not an RPC API version; known: " + ", ".join(
            v.number for v in rpc_versions.VERSIONS)) from None


def keystone_system_scope(value: str) -> None:
    if value != "all":
        raise BadValue("Keystone has one system scope: all")


def listen_address(value: str) -> None:
    """host:port for a server of ours (agent/metrics.py parses it)."""
    try:
        parse_listen(value)
    except ValueError as e:
        raise BadValue(str(e)) from None


# A rule per (section, option): value -> None, raising BadValue. Options
# whose values the operator's policy parses are checked by policy_rules.
VALUE_RULES: dict[tuple[str, str], Callable[[Any], None]] = {
    (DEFAULT, "host"): host_name,
    (DEFAULT, "state_path"): state_directory,
    (DEFAULT, "sysfs_root"): existing_directory,
    (DEFAULT, "log_config_append"): readable_file,
    (DEFAULT, "log_dir"): existing_directory,
    (DEFAULT, "syslog_log_facility"): syslog_facility,
    (DEFAULT, "logging_context_format_string"): context_record_format,
    (DEFAULT, "logging_default_format_string"): record_format,
    (DEFAULT, "logging_debug_format_suffix"): record_format,
    (DEFAULT, "logging_exception_prefix"): record_format,
    (DEFAULT, "logging_user_identity_format"): user_identity_format,
    (DEFAULT, "instance_format"): instance_format,
    (DEFAULT, "instance_uuid_format"): instance_format,
    (DEFAULT, "default_log_levels"): log_levels,
    (DEFAULT, "transport_url"): transport_url,
    (DEFAULT, "control_exchange"): queue_name,
    ("libvirt", "connection_uri"): libvirt_uri,
    ("libvirt", "live_migration_uri"): libvirt_uri,
    ("libvirt", "instances_path"): absolute_path,
    ("pmem", "ndctl_json"): readable_file,
    ("fake", "host_file"): readable_file,
    ("fake", "state_file"): file_to_write,
    ("metrics", "listen"): listen_address,
    (PLACEMENT_GROUP, "cafile"): readable_file,
    (PLACEMENT_GROUP, "certfile"): readable_file,
    (PLACEMENT_GROUP, "keyfile"): readable_file,
    (PLACEMENT_GROUP, "tls_ciphers"): tls_ciphers,
    (PLACEMENT_GROUP, "service_type"): service_type,
    (PLACEMENT_GROUP, "valid_interfaces"): endpoint_interfaces,
    (PLACEMENT_GROUP, "endpoint_override"): http_url,
    (PLACEMENT_GROUP, "version"): api_version,
    (PLACEMENT_GROUP, "min_version"): api_version,
    (PLACEMENT_GROUP, "max_version"): api_version,
    (PLACEMENT_GROUP, "retriable_status_codes"): http_status_codes,
    (PLACEMENT_GROUP, "auth_url"): http_url,
    (PLACEMENT_GROUP, "endpoint"): http_url,
    (PLACEMENT_GROUP, "system_scope"): keystone_system_scope,
    ("oslo_messaging_notifications", "driver"): notification_drivers,
    ("oslo_messaging_notifications", "transport_url"): transport_url,
    ("oslo_messaging_notifications", "topics"): queue_names,
    ("oslo_messaging_rabbit", "ssl_version"): rabbit_ssl_version,
    ("oslo_messaging_rabbit", "ssl_key_file"): readable_file,
    ("oslo_messaging_rabbit", "ssl_cert_file"): readable_file,
    ("oslo_messaging_rabbit", "ssl_ca_file"): readable_file,
    ("oslo_messaging_rabbit", "kombu_compression"): kombu_compression,
    ("oslo_messaging_kafka", "consumer_group"): queue_name,
    ("oslo_messaging_kafka", "sasl_mechanism"): kafka_sasl_mechanism,
    ("oslo_messaging_kafka", "ssl_cafile"): readable_file,
    ("oslo_messaging_kafka", "ssl_client_cert_file"): readable_file,
    ("oslo_messaging_kafka", "ssl_client_key_file"): readable_file,
    ("oslo_messaging_metrics", "metrics_socket_file"): absolute_path,
    ("oslo_messaging_tracing", "otel_exporter_otlp_endpoint"): http_url,
    ("upgrade_levels", "compute_agent"): rpc_version,
}

# Options the operator's policy reads (agent/tree/policy.py); policy_rules
# checks them as the agent will read them.
POLICY_OPTIONS = frozenset({
    (DEFAULT, "owner_trait"),
    ("compute", "cpu_dedicated_set"),
    ("compute", "cpu_shared_set"),
    ("pci", "device_spec"),
    ("devices", "enabled_mdev_types"),
    ("pmem", "namespaces"),
    ("mdev_*", "device_addresses"),
    ("mdev_*", "mdev_class"),
})

# Options checked by a rule on several options below.
CROSS_OPTIONS = frozenset({
    (DEFAULT, "log_file"),
    (DEFAULT, "config_source"),
    (PLACEMENT_GROUP, "auth_type"),
    (PLACEMENT_GROUP, "auth_section"),
})

# String options where any value is valid, and why.
FREE_FORM: dict[tuple[str, str], str] = {
    (DEFAULT, "log_date_format"): "a strftime format: any text is one "
                                  "(unknown directives are copied as they are)",
    (PLACEMENT_GROUP, "service_name"): "matched against the catalog's names, "
                                       "which Keystone does not restrict",
    (PLACEMENT_GROUP, "region_name"): "a Keystone region id: any text",
    ("oslo_messaging_rabbit", "hostname"): "a label sent to the broker",
    ("oslo_messaging_rabbit", "processname"): "a label sent to the broker",
    ("oslo_messaging_kafka", "ssl_client_key_password"): "a password",
    ("oslo_messaging_metrics", "metrics_process_name"): "a label",
    ("oslo_messaging_tracing", "tracing_service_name"): "a label",
} | {
    (PLACEMENT_GROUP, name): "a Keystone name, id or secret: any text"
    for name in ("domain_id", "domain_name", "project_id", "project_name",
                 "project_domain_id", "project_domain_name", "trust_id",
                 "default_domain_id", "default_domain_name", "user_id",
                 "username", "user_domain_id", "user_domain_name", "password",
                 "token", "roles")
}

# Bounds for the numbers of the libraries, which declare none (or only a
# minimum): (min, max), inclusive. Ours declare theirs (agent/config.py).
LIBRARY_BOUNDS: dict[tuple[str, str], tuple[float, float]] = {
    (DEFAULT, "log_rotate_interval"): (1, 1_000_000),
    (DEFAULT, "max_logfile_count"): (1, 10_000),
    (DEFAULT, "max_logfile_size_mb"): (1, 1_048_576),
    (DEFAULT, "rate_limit_interval"): (0, 86400),
    (DEFAULT, "rate_limit_burst"): (0, 1_000_000),
    (DEFAULT, "executor_thread_pool_size"): (1, 1024),
    (DEFAULT, "rpc_response_timeout"): (1, 86400),
    (PLACEMENT_GROUP, "timeout"): (0.1, 3600),
    (PLACEMENT_GROUP, "connect_retries"): (0, 100),
    (PLACEMENT_GROUP, "connect_retry_delay"): (0, 3600),
    (PLACEMENT_GROUP, "status_code_retries"): (0, 100),
    (PLACEMENT_GROUP, "status_code_retry_delay"): (0, 3600),
    ("oslo_messaging_notifications", "retry"): (-1, 1_000_000),
    ("oslo_messaging_rabbit", "rpc_conn_pool_size"): (1, 10_000),
    ("oslo_messaging_rabbit", "conn_pool_min_size"): (0, 10_000),
    ("oslo_messaging_rabbit", "conn_pool_ttl"): (0, 86400),
    ("oslo_messaging_rabbit", "kombu_reconnect_splay"): (0, 3600),
    ("oslo_messaging_rabbit", "kombu_missing_consumer_retry_timeout"): (1, 3600),
    ("oslo_messaging_rabbit", "rabbit_retry_interval"): (1, 3600),
    ("oslo_messaging_rabbit", "rabbit_retry_backoff"): (0, 3600),
    ("oslo_messaging_rabbit", "rabbit_interval_max"): (1, 3600),
    ("oslo_messaging_rabbit", "rabbit_quorum_delivery_limit"): (0, 2**31 - 1),
    ("oslo_messaging_rabbit", "rabbit_quorum_max_memory_length"): (0, 2**31 - 1),
    ("oslo_messaging_rabbit", "rabbit_quorum_max_memory_bytes"): (0, 2**40),
    ("oslo_messaging_rabbit", "rabbit_transient_queues_ttl"): (1, 365 * 86400),
    ("oslo_messaging_rabbit", "rabbit_qos_prefetch_count"): (0, 65535),
    ("oslo_messaging_rabbit", "heartbeat_timeout_threshold"): (0, 3600),
    ("oslo_messaging_rabbit", "heartbeat_rate"): (1, 100),
    ("oslo_messaging_kafka", "kafka_max_fetch_bytes"): (1, 2**31 - 1),
    ("oslo_messaging_kafka", "kafka_consumer_timeout"): (0.001, 3600),
    ("oslo_messaging_kafka", "producer_batch_timeout"): (0, 3600),
    ("oslo_messaging_kafka", "producer_batch_size"): (0, 2**31 - 1),
    ("oslo_messaging_kafka", "max_poll_records"): (1, 100_000),
    ("oslo_messaging_metrics", "metrics_buffer_size"): (1, 1_000_000),
    ("oslo_messaging_metrics", "metrics_thread_stop_timeout"): (0, 3600),
}


def _key(option: Option) -> tuple[str, str]:
    section = "mdev_*" if option.section.startswith("mdev_") else option.section
    return section, option.name


def number_bounds(option: Option) -> tuple[float | None, float | None]:
    """(min, max) of a numeric option: declared, or from LIBRARY_BOUNDS."""
    declared = (getattr(option.opt.type, "min", None),
                getattr(option.opt.type, "max", None))
    low, high = LIBRARY_BOUNDS.get(_key(option), (None, None))
    return (declared[0] if declared[0] is not None else low,
            declared[1] if declared[1] is not None else high)


def within_bounds(option: Option, value: float) -> None:
    """Finite, and within the option's bounds: an unbounded interval ends
    as an OverflowError in a thread that then dies unseen."""
    if isinstance(value, float) and not math.isfinite(value):
        raise BadValue("not a finite number")
    low, high = number_bounds(option)
    if low is not None and value < low:
        raise BadValue(f"below the minimum {low:g}")
    if high is not None and value > high:
        raise BadValue(f"above the maximum {high:g}")


def check_option(conf: cfg.ConfigOpts, option: Option) -> None:
    """Read one option (oslo.config converts it then), and apply its rule."""
    try:
        value = option.value(conf)
    except (cfg.ConfigFileValueError, ValueError) as e:
        raise refusal(conf, option, str(e).split("is not valid: ", 1)[-1]) from None
    except cfg.Error as e:  # $-substitution of an unknown option, and such
        raise refusal(conf, option, str(e).splitlines()[0]) from None
    if value is None:
        if option.opt.default is not None:  # 'name =' reads as None
            raise refusal(conf, option, "empty: give a value, or remove the "
                          "line for the default")
        return
    try:
        if isinstance(option.opt.type, (cfg.types.Integer, cfg.types.Float)):
            within_bounds(option, value)
        rule = VALUE_RULES.get(_key(option))
        if rule is not None:
            rule(value)
    except BadValue as e:
        raise refusal(conf, option, str(e), value) from None


# --- rules on several options -----------------------------------------------

def _option(conf: cfg.ConfigOpts, section: str, name: str) -> Option:
    return Option(section, conf._get_opt_info(
        name, None if section == DEFAULT else section)["opt"])


def auth_group(conf: cfg.ConfigOpts) -> str:
    """Where the auth plugin's options are read: [placement], or the
    section its auth_section names."""
    return conf[PLACEMENT_GROUP].auth_section or PLACEMENT_GROUP


def auth_section(conf: cfg.ConfigOpts) -> None:
    """An auth_section must name a section the files have."""
    section = conf[PLACEMENT_GROUP].auth_section
    if section is None:
        return
    if not _read_files(conf).has_section(section):
        raise refusal(conf, _option(conf, PLACEMENT_GROUP, "auth_section"),
                      "no such section in the config files")
    if section not in conf:
        conf.register_group(cfg.OptGroup(section))
    ks_loading.register_auth_conf_options(conf, PLACEMENT_GROUP)


def plugin_names_shown(known: list[str]) -> str:
    """keystoneauth's plugins, those for a Keystone version (v2password,
    v3oidcpassword...) counted rather than named, so that the line stays
    one."""
    versioned = [n for n in known if re.match(r"v\d", n)]
    named = [n for n in known if n not in versioned]
    return ", ".join(named) + (f" and {len(versioned)} Keystone v2/v3 plugins (v3password...)"
                               if versioned else "")


def auth_plugin(conf: cfg.ConfigOpts, required: bool) -> None:
    """[placement] auth_type: present when Placement is used, a plugin
    keystoneauth has, and registered with its options so that the walk
    over every option reads them too."""
    group = auth_group(conf)
    option = _option(conf, group, "auth_type")
    name = conf[group].auth_type
    if name is None or not name.strip():
        if required:
            raise refusal(conf, option, "missing: give the auth plugin for "
                          "Placement (password with Keystone, placement_noauth2 "
                          "for a noauth2 Placement)", name)
        return
    known = sorted(ks_loading.get_available_plugin_names())
    if name not in known:
        near = misspelling_of(name, known)
        raise refusal(conf, option, "unknown auth plugin"
                      + (f"; did you mean {near}?" if near else "")
                      + "; known: " + plugin_names_shown(known))
    loader = ks_loading.get_plugin_loader(name)
    conf.register_opts(ks_loading.get_auth_plugin_conf_options(loader), group=group)


def auth_plugin_options(conf: cfg.ConfigOpts) -> None:
    """The options the plugin cannot work without: those keystoneauth marks
    required, the URL of a plugin that has an 'endpoint' (it gets no
    service catalog to find Placement in), and for a password
    the user, and the domain a name is looked up in."""
    group = auth_group(conf)
    name = conf[group].auth_type
    if not name:
        return
    plugin_opts = ks_loading.get_plugin_loader(name).get_options()
    names = {o.dest for o in plugin_opts}
    values = {d: conf[group][d] for d in names}

    def missing(option_name: str, why: str) -> ConfigError:
        return refusal(conf, _option(conf, group, option_name),
                       f"missing, and auth_type = {name} needs it{why}")

    for o in plugin_opts:
        if (o.required or o.dest == "endpoint") and values.get(o.dest) in (None, ""):
            raise missing(o.dest, "")
    if "password" in names and "username" in names:
        _password_options(values, missing)


def _password_options(values: dict[str, Any], missing) -> None:
    if not values.get("username") and not values.get("user_id"):
        raise missing("username", " (or user_id)")
    if not values.get("password"):
        raise missing("password", "")
    default_domain = values.get("default_domain_id") or values.get("default_domain_name")
    if values.get("username") and not (values.get("user_domain_id")
                                       or values.get("user_domain_name")
                                       or default_domain or "user_domain_id" not in values):
        raise missing("user_domain_name", " (or user_domain_id) for the username")
    if values.get("project_name") and not (values.get("project_domain_id")
                                           or values.get("project_domain_name")
                                           or default_domain
                                           or "project_domain_id" not in values):
        raise missing("project_domain_name", " (or project_domain_id) for the "
                      "project_name")
    scopes = ("project_id", "project_name", "domain_id", "domain_name",
              "system_scope", "trust_id")
    if not any(values.get(s) for s in scopes if s in values):
        raise missing("project_name", " (or project_id): Placement needs a "
                      "project-scoped token")


def auth_plugin_loads(conf: cfg.ConfigOpts) -> None:
    """The plugin builds from its options (what the rules above cannot
    foresee, keystoneauth says here)."""
    group = auth_group(conf)
    if not conf[group].auth_type:
        return
    try:
        ks_loading.load_auth_from_conf_options(conf, PLACEMENT_GROUP)
    except (ks_exc.ClientException, TypeError, ValueError) as e:
        raise refusal(conf, _option(conf, group, "auth_type"),
                      f"the plugin refuses its options: {e}") from None


def adapter_versions(conf: cfg.ConfigOpts) -> None:
    """keystoneauth takes version or min_version/max_version, not both."""
    p = conf[PLACEMENT_GROUP]
    if p.version and (p.min_version or p.max_version):
        raise refusal(conf, _option(conf, PLACEMENT_GROUP, "version"),
                      "give version or min_version/max_version, not both")


def compute_driver_needs(conf: cfg.ConfigOpts) -> None:
    if conf.compute_driver == "fake" and not conf.fake.host_file:
        raise refusal(conf, _option(conf, "fake", "host_file"),
                      "missing, and compute_driver = fake needs it")


def log_destination(conf: cfg.ConfigOpts) -> None:
    """The log file's directory is there: oslo.log creates the file, not
    the directories above it."""
    if not conf.log_file:
        return
    path = Path(conf.log_dir or "", conf.log_file) if conf.log_dir else Path(conf.log_file)
    try:
        path_lengths(str(path))
    except BadValue as e:
        raise refusal(conf, _option(conf, DEFAULT, "log_file"), str(e)) from None
    if path.is_dir():
        problem = "a directory, not a file"
    elif not path.parent.is_dir():
        problem = f"no such directory {path.parent}"
    elif not os.access(path.parent, os.W_OK):
        problem = f"{path.parent} is not writable"
    else:
        return
    raise refusal(conf, _option(conf, DEFAULT, "log_file"), problem)


def _metrics_address(conf: cfg.ConfigOpts, port: int | None) -> None:
    """Bind a socket to [metrics] listen's address (and to ``port``, or to
    one the kernel picks), then close it: the test the server's own bind
    would make, without serving."""
    listen = conf.metrics.listen
    host, listen_port = parse_listen(listen)
    option = _option(conf, "metrics", "listen")
    try:
        family, kind, _, _, address = socket.getaddrinfo(
            host, listen_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise refusal(conf, option, f"the host name does not resolve ({e})") from None
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address[0], listen_port if port is None else port, *address[2:]))
        except OSError as e:
            reason = {errno.EADDRNOTAVAIL: "not an address of this host",
                      errno.EADDRINUSE: "address already in use"}.get(e.errno, e.strerror)
            raise refusal(conf, option, f"cannot serve metrics there: {reason}") from None


def metrics_address_local(conf: cfg.ConfigOpts) -> None:
    """[metrics] listen names an address of this host (every command: it
    is a mistake whoever reads it). Its port is the daemon's to test
    (metrics_port_free): beside a running agent it is rightly in use."""
    if conf.metrics.listen:
        _metrics_address(conf, port=0)


def metrics_port_free(conf: cfg.ConfigOpts) -> None:
    """For the daemon that will serve [metrics] listen, before it writes
    anything: the address and port can be bound now."""
    if conf.metrics.listen:
        _metrics_address(conf, port=None)


def config_sources(conf: cfg.ConfigOpts) -> None:
    """Each [DEFAULT] config_source names a section of the files."""
    files = _read_files(conf)
    for section in conf.config_source or []:
        if not files.has_section(section):
            raise refusal(conf, _option(conf, DEFAULT, "config_source"),
                          f"no section [{section}] in the config files")


def policy_rules(conf: cfg.ConfigOpts) -> None:
    """The operator's policy parses (agent/tree/policy.py: CPU sets, the PCI
    allowlist, mdev types and classes, pmem labels, the owner trait); its
    errors name the option and the value. The root's UUID plays no part."""
    tree_policy_from_conf(conf, str(uuid.UUID(int=0)))


# How oslo.config reports a bad file value of a command-line option (such
# as oslo.log's debug): on stderr, then SystemExit(1).
# The message is stripped, so an empty value leaves "value:" at its end.
_CLI_FILE_VALUE = re.compile(r"argument --(?P<dest>[\w-]+): (?P<reason>Invalid .*) "
                             r"value:(?: (?P<value>.*))?")


def cli_file_value_refusal(conf: cfg.ConfigOpts, message: str) -> ConfigError | None:
    """The one line for a command-line option's bad value in a config file,
    from what oslo.config wrote; None for any other message."""
    match = _CLI_FILE_VALUE.fullmatch(message.strip())
    if not match:
        return None
    for opt, group in conf._all_cli_opts():
        if opt.dest == match["dest"].replace("-", "_"):
            section = group.name if group is not None else DEFAULT
            return ConfigError(f"[{section}] {opt.dest}: {match['reason']} "
                               f"(value: {shown(match['value'] or '')})")
    return None


def check_config(conf: cfg.ConfigOpts, placement_required: bool) -> None:
    """Raise ConfigError, one line, for the first bad value. Writes
    nothing. ``placement_required``: the command talks to Placement, so
    [placement] auth_type must be set."""
    auth_section(conf)
    check_names(conf)
    auth_plugin(conf, placement_required)
    for option in registered_options(conf):
        check_option(conf, option)
    for rule in (auth_plugin_options, adapter_versions, auth_plugin_loads,
                 compute_driver_needs, log_destination, config_sources,
                 metrics_address_local, policy_rules):
        rule(conf)
