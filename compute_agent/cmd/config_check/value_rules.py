"""Rules on one value, each taking the value oslo.config converted and
raising BadValue; bounds for the libraries' numbers; FREE_FORM, why a
string no rule checks takes any value; and the one line of a refusal."""
from __future__ import annotations

import functools
import logging
import logging.handlers
import math
import os
import re
import ssl
import syslog
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from keystoneauth1 import discover
from keystoneauth1 import exceptions as ks_exc
from oslo_config import cfg
from oslo_context import context as request_context
from oslo_log import formatters as log_formatters
from oslo_log import log as oslo_log

from compute_agent.cmd.config_check.options import DEFAULT, Option, masked_url, written_as
from compute_agent.cmd.errors import BadValue
from compute_agent.config import PLACEMENT_GROUP
from compute_agent.exception import ConfigError, shown
from compute_agent.messaging import messaging
from compute_agent.metrics import parse_listen
from compute_agent.rpc import versions as rpc_versions

# A refusal's longest: with the command's name and "error: " before it,
# the line stays within 300 characters (compute_agent.cmd.common.ERROR_LINE_LIMIT).
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


def certificate_authorities(value: str) -> None:
    """A CA file: readable, and holding a PEM certificate OpenSSL loads."""
    readable_file(value)
    if value == "":
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=value)
    except ssl.SSLError as e:
        raise BadValue(f"no CA certificate OpenSSL can read ({e.reason or e})") from None


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
        kombu.compression.get_encoder(value)  # type: ignore[no-untyped-call]  # kombu leaves it unannotated
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
    """host:port for a server of ours (compute_agent/metrics.py parses it)."""
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
    (DEFAULT, "boot_id_file"): readable_file,
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
    ("oslo_messaging_rabbit", "ssl_ca_file"): certificate_authorities,
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

# Options the operator's policy reads (compute_agent/tree/policy.py); policy_rules
# checks them as the agent will read them.
POLICY_OPTIONS = frozenset({
    (DEFAULT, "owner_trait"),
    ("compute", "cpu_dedicated_set"),
    ("compute", "cpu_shared_set"),
    ("pci", "device_spec"),
    ("pci", "vf_counts"),
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
# minimum): (min, max), inclusive. Ours declare theirs (compute_agent/config.py).
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
