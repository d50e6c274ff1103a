"""Rules on several options at once, and ``check_config``: the whole check
every command runs after reading its config files."""
from __future__ import annotations

import errno
import os
import re
import socket
import ssl
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from keystoneauth1.plugin import BaseAuthPlugin
from oslo_config import cfg

from compute_agent.cmd.config_check.names import check_names, misspelling_of
from compute_agent.cmd.config_check.options import (
    DEFAULT,
    Option,
    auth_group,
    read_config_files,
    registered_options,
)
from compute_agent.cmd.config_check.value_rules import check_option, path_lengths, refusal
from compute_agent.cmd.errors import BadValue
from compute_agent.config import PLACEMENT_GROUP
from compute_agent.exception import ConfigError, shown
from compute_agent.metrics import parse_listen
from compute_agent.tree.policy import tree_policy_from_conf


def _option(conf: cfg.ConfigOpts, section: str, name: str) -> Option:
    return Option(section, conf._get_opt_info(
        name, None if section == DEFAULT else section)["opt"])


def auth_section(conf: cfg.ConfigOpts) -> None:
    """An auth_section must name a section the files have."""
    section = conf[PLACEMENT_GROUP].auth_section
    if section is None:
        return
    if not read_config_files(conf).has_section(section):
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
    # keystoneauth's return type names a type variable it never binds.
    loader: ks_loading.BaseLoader[BaseAuthPlugin] = ks_loading.get_plugin_loader(name)
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


def _password_options(values: dict[str, Any], missing: Callable[[str, str], ConfigError]) -> None:
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


RABBIT = "oslo_messaging_rabbit"


def rabbit_queue_kinds(conf: cfg.ConfigOpts) -> None:
    """The queue options oslo.messaging or RabbitMQ refuse together, found
    here rather than at the first connection: oslo.messaging's refusals
    there (RuntimeError) come from a thread that retries; RabbitMQ's
    (PRECONDITION_FAILED) from the declaration of a queue."""
    rabbit = conf[RABBIT]

    def refused(name: str, reason: str) -> ConfigError:
        return refusal(conf, _option(conf, RABBIT, name), reason, rabbit[name])

    if rabbit.rabbit_stream_fanout:
        # oslo.messaging's own two conditions for stream fanout.
        if rabbit.rabbit_qos_prefetch_count <= 0:
            raise refused("rabbit_qos_prefetch_count", "must be more than 0 with "
                          "rabbit_stream_fanout = true (a stream's consumer needs a prefetch)")
        if not rabbit.rabbit_transient_quorum_queue:
            raise refused("rabbit_transient_quorum_queue",
                          "must be true with rabbit_stream_fanout = true")
    quorum = [name for name in ("rabbit_quorum_queue", "rabbit_transient_quorum_queue")
              if rabbit[name]]
    if quorum and rabbit.rabbit_ha_queues:
        raise refused("rabbit_ha_queues", f"must be false with {quorum[0]} = true: a queue "
                      "is quorum or mirrored (HA), not both")
    if rabbit.rabbit_quorum_queue and rabbit.amqp_auto_delete:
        raise refused("amqp_auto_delete", "must be false with rabbit_quorum_queue = true: "
                      "RabbitMQ refuses a quorum queue that deletes itself")
    if rabbit.rpc_conn_pool_size < rabbit.conn_pool_min_size:
        raise refused("rpc_conn_pool_size", "must be at least conn_pool_min_size "
                      f"({rabbit.conn_pool_min_size})")


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
            reasons: dict[int | None, str | None] = {
                errno.EADDRNOTAVAIL: "not an address of this host",
                errno.EADDRINUSE: "address already in use"}
            reason = reasons.get(e.errno, e.strerror)
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


def no_key_password() -> bytes:
    """What OpenSSL asks for an encrypted key: oslo.messaging has none to
    give, and without this OpenSSL would prompt on the terminal."""
    raise BadValue("an encrypted key: oslo.messaging gives no password for it")


def rabbit_client_certificate(conf: cfg.ConfigOpts) -> None:
    """With ``ssl``, the client certificate and its key load as a pair, as
    the driver loads them at each connection: a pair that does not load
    failed every connection, and the driver tried again for ever. A key
    without its certificate is never used."""
    rabbit = conf.oslo_messaging_rabbit
    if not rabbit.ssl or not (rabbit.ssl_cert_file or rabbit.ssl_key_file):
        return
    group = "oslo_messaging_rabbit"
    if not rabbit.ssl_cert_file:
        raise refusal(conf, _option(conf, group, "ssl_key_file"),
                      "a key without ssl_cert_file, its certificate, is not used")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
            rabbit.ssl_cert_file, rabbit.ssl_key_file or None, password=no_key_password)
    except BadValue as e:
        raise refusal(conf, _option(conf, group, "ssl_key_file"), str(e)) from None
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise refusal(conf, _option(conf, group, "ssl_key_file"),
                          "not the key of ssl_cert_file's certificate") from None
        raise refusal(conf, _option(conf, group, "ssl_cert_file"),
                      "no certificate and key OpenSSL can read here and in ssl_key_file "
                      f"({e.reason or e})") from None


def config_sources(conf: cfg.ConfigOpts) -> None:
    """Each [DEFAULT] config_source names a section of the files."""
    files = read_config_files(conf)
    for section in conf.config_source or []:
        if not files.has_section(section):
            raise refusal(conf, _option(conf, DEFAULT, "config_source"),
                          f"no section [{section}] in the config files")


def policy_rules(conf: cfg.ConfigOpts) -> None:
    """The operator's policy parses (compute_agent/tree/policy.py: CPU sets, the PCI
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
                 compute_driver_needs, rabbit_queue_kinds, log_destination, config_sources,
                 metrics_address_local, rabbit_client_certificate, policy_rules):
        rule(conf)
