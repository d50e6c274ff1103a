"""The message broker as a dependency: a cheap probe of ``transport_url``,
and quiet for oslo.messaging's rabbit driver while it reconnects and as it
closes.

The driver reconnects on its own, each of its connections in a loop that
logs every attempt (ERROR, every 1 to 30 s, for as long as the broker is
away) and each success. The agent's update loop looks at its RPC server's
connection once a cycle (compute_agent/rpc/host_server.py ServerWatch) and
says the one line each way (compute_agent/dependencies.py); the commands
ask once, with a login (probe); the driver's lines about its reconnection
loop are demoted to DEBUG by a filter on its logger, matched on their
format strings. Should a release of the driver change those strings, its
lines come back as they were: noise, never a missed outage, since the
outage is seen by the watch.
"""
from __future__ import annotations

import logging
import re
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard

import kombu
from amqp import exceptions as amqp_exceptions
from oslo_config import cfg

from compute_agent.dependencies import Dependencies, Dependency, Probe, Unknown
from compute_agent.exception import ConfigError, shown
from compute_agent.messaging import messaging

# oslo.messaging's rabbit driver reaches these when the URL names no host.
RABBIT_DEFAULT = ("localhost", 5672)
# AMQP's reply code to a passive declare of a queue that does not exist.
NOT_FOUND = 404
DRIVER_LOGGER = "oslo.messaging._drivers.impl_rabbit"
# Pieces of the format strings (record.msg, before interpolation) of the
# driver's lines about its reconnection loop: an attempt failed ("is
# unreachable", "closed the connection", "Connection failed"), a
# heartbeat found the connection broken, a connection's heartbeat thread
# found it gone, and a connection is back.
RECONNECT_LINES = (
    "is unreachable: %(err_str)s",
    "closed the connection. Check login credentials",
    "Connection failed: %s (retrying in",
    "A recoverable connection/channel error occurred, trying to reconnect",
    "Reconnected to AMQP server on",
    "Unexpected error during heartbeat thread processing, retrying",
)
# OpenSSL's verification results (X509_V_ERR_HOSTNAME_MISMATCH,
# X509_V_ERR_IP_ADDRESS_MISMATCH) for a certificate that is not valid for
# the name, or the address, the client asked for.
NAME_MISMATCH = (62, 64)
# OpenSSL's reason when a TLS client's hello is answered by a server that
# does not speak TLS on that port (RabbitMQ's plain listener answers with
# its AMQP protocol header).
NOT_TLS = "WRONG_VERSION_NUMBER"


@dataclass(frozen=True)
class BrokerTls:
    """``[oslo_messaging_rabbit] ssl*``, read once, for the connections the
    agent makes itself (the probes, the consumer counts): the TLS of
    oslo.messaging's rabbit driver's own connections, the same files,
    version and name check (its Connection._fetch_ssl_params), so that a
    probe says what the driver will meet."""

    ca_file: str
    cert_file: str
    key_file: str
    version: str

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> BrokerTls | None:
        """None when ``ssl`` is off."""
        rabbit = conf.oslo_messaging_rabbit
        if not rabbit.ssl:
            return None
        return cls(rabbit.ssl_ca_file, rabbit.ssl_cert_file, rabbit.ssl_key_file,
                   rabbit.ssl_version)

    def kombu_ssl(self, hostname: str) -> dict[str, Any] | bool:
        """kombu's ``ssl`` for a connection to ``hostname``, a host of
        transport_url. With a CA file, the broker's certificate must be
        signed by it and valid for ``hostname``; without one, the
        SSL library's defaults (the system's CAs, no name check)."""
        # Imported once compute_agent.messaging has imported oslo.messaging
        # its way (quiet, without eventlet's DNS).
        from oslo_messaging._drivers.impl_rabbit import Connection
        options: dict[str, Any] = {}
        if self.version:
            options["ssl_version"] = Connection.validate_ssl_version(self.version)
        if self.key_file:
            options["keyfile"] = self.key_file
        if self.cert_file:
            options["certfile"] = self.cert_file
        if self.ca_file:
            options.update(ca_certs=self.ca_file, cert_reqs=ssl.CERT_REQUIRED,
                           server_hostname=hostname)
        return options or True


@dataclass(frozen=True)
class RabbitHost:
    """One host of ``transport_url``."""

    hostname: str
    port: int
    username: str | None
    password: str | None
    virtual_host: str
    tls: BrokerTls | None = None

    @property
    def shown(self) -> str:
        return f"{self.hostname}:{self.port}"

    def connection(self, timeout: float) -> kombu.Connection:
        """A connection whose login, and every answer awaited on it, takes
        at most ``timeout`` seconds; without heartbeats (the broker never
        drops it for being idle); over TLS as the driver's are."""
        return kombu.Connection(hostname=self.hostname, port=self.port,
                                userid=self.username or "guest",
                                password=self.password or "guest",
                                virtual_host=self.virtual_host, connect_timeout=timeout,
                                ssl=self.tls.kombu_ssl(self.hostname) if self.tls else False,
                                transport_options={"read_timeout": timeout,
                                                   "write_timeout": timeout})


def rabbit_hosts(conf: cfg.ConfigOpts) -> list[RabbitHost] | Unknown:
    """The hosts of ``transport_url``, in its order; Unknown for a
    transport other than rabbit."""
    url = messaging.TransportURL.parse(conf, conf.transport_url)
    if url.transport != "rabbit":
        return Unknown(f"not checked: the {url.transport} transport")
    tls = BrokerTls.from_conf(conf)
    return [RabbitHost(h.hostname, h.port or RABBIT_DEFAULT[1], h.username, h.password,
                       url.virtual_host or "/", tls) for h in url.hosts] or [
        RabbitHost(*RABBIT_DEFAULT, None, None, url.virtual_host or "/", tls)]


def shown_hosts(conf: cfg.ConfigOpts) -> str:
    """transport_url without its credentials, as the logs show it."""
    hosts = rabbit_hosts(conf)
    if isinstance(hosts, Unknown):
        return f"{str(conf.transport_url or '').partition(':')[0]}://"
    return "rabbit://" + ",".join(h.shown for h in hosts) + "/"


def connect(connection: kombu.Connection) -> None:
    """One attempt (kombu's connect() tries again after 2 s), with the
    socket's own errors."""
    connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                 interval_max=0, reraise_as_library_errors=False)


def login(host: RabbitHost, timeout: float) -> Exception | None:
    """One connection, logged in and closed; the error, or None."""
    connection = host.connection(timeout)
    try:
        connect(connection)
    except Exception as e:  # noqa: BLE001 - any failure is this probe's finding
        return e
    finally:
        connection.release()
    return None


def probe(conf: cfg.ConfigOpts, timeout: float) -> Probe | Unknown:
    """A connection to each host of ``transport_url`` in turn, logged in
    and closed: answered when one accepts it. The URL is shown without its
    credentials."""
    hosts = rabbit_hosts(conf)
    if isinstance(hosts, Unknown):
        return hosts
    return first_login(hosts, lambda host: login(host, timeout))


def first_login(hosts: list[RabbitHost],
                login_to: Callable[[RabbitHost], Exception | None]) -> Probe:
    """``login_to`` each host in turn: answered by the first that accepts
    (None), failed with every host's problem otherwise."""
    problems = []
    for host in hosts:
        error = login_to(host)
        if error is not None:
            problems.append(problem(error))
            continue
        return Probe(Dependency.BROKER, f"rabbit://{host.shown}/")
    shown = ",".join(h.shown for h in hosts)
    if len(hosts) == 1:
        return Probe(Dependency.BROKER, f"rabbit://{shown}/", problems[0])
    return Probe(Dependency.BROKER, f"rabbit://{shown}/", "no host answered: " + "; ".join(
        f"{h.shown} {why}" for h, why in zip(hosts, problems)))


def consumers(conf: cfg.ConfigOpts, queue: str, timeout: float) -> int | Unknown:
    """How many consumers ``queue`` has now, 0 when it does not exist
    (a passive declare), asked of the first host of ``transport_url`` that
    accepts a connection; Unknown when none does."""
    hosts = rabbit_hosts(conf)
    if isinstance(hosts, Unknown):
        return hosts
    problems = []
    for host in hosts:
        connection = host.connection(timeout)
        try:
            connect(connection)
            try:
                _, _, count = connection.channel().queue_declare(queue=queue, passive=True)
            except connection.channel_errors as e:
                if getattr(e, "reply_code", None) != NOT_FOUND:
                    raise
                count = 0
        except Exception as e:  # noqa: BLE001 - any failure is this question's finding
            problems.append(f"{host.shown} {problem(e)}")
            continue
        finally:
            connection.release()
        return count
    return Unknown("the broker " + "; ".join(problems))


def close_client(conf: cfg.ConfigOpts, client: Any, timeout: float = 1.0) -> None:
    """Close an RPC client's transport, and delete the reply queue it
    declared, if it called: oslo.messaging leaves it to expire
    (rabbit_transient_queues_ttl, 30 minutes), a queue of the caller's
    for each command run, each check at an agent's start, and with
    quorum transient queues a Raft group on every node. Deleted as the
    caller's own user (it declared it); a broker that does not answer
    leaves it to expire."""
    driver = client.transport._driver
    reply_queue = getattr(driver, "_reply_q", None)  # oslo.messaging's, once it called
    client.transport.cleanup()
    if reply_queue is None:
        return
    hosts = rabbit_hosts(conf)
    if isinstance(hosts, Unknown):
        return
    for host in hosts:
        connection = host.connection(timeout)
        try:
            connect(connection)
            connection.channel().queue_delete(queue=reply_queue)
            return
        except Exception:  # noqa: BLE001 - the next host, or the queue expires
            continue
        finally:
            connection.release()


def observe(board: Dependencies, answer: Probe | Unknown) -> None:
    """The probe's answer on the board (one line each way); a transport the
    probe cannot ask is left unobserved."""
    if isinstance(answer, Unknown):
        return
    if answer.problem is None:
        board.answered(Dependency.BROKER, answer.url)
    else:
        board.failed(Dependency.BROKER, answer.url, answer.problem)


def refuses_credentials(error: BaseException) -> bool:
    """The broker answered, and refused transport_url's user or password
    (AMQP's 403 ACCESS_REFUSED): no retry makes it accept them."""
    return isinstance(error, amqp_exceptions.AccessRefused) or "ACCESS_REFUSED" in str(error)


def refuses_tls(error: BaseException) -> bool:
    """TLS to the broker failed in a way no retry changes: its certificate
    does not verify (not signed by the CA file, not valid for the name in
    transport_url, expired), or the port does not speak TLS."""
    # getattr: an SSLError raised by other code than the ssl module's may
    # have no reason.
    return isinstance(error, ssl.SSLCertVerificationError) or (
        isinstance(error, ssl.SSLError) and getattr(error, "reason", None) == NOT_TLS)


def names_another_host(error: BaseException) -> TypeGuard[ssl.SSLCertVerificationError]:
    """The broker's certificate verifies, but not for the name (or the
    address) transport_url reaches it by."""
    return (isinstance(error, ssl.SSLCertVerificationError)
            and error.verify_code in NAME_MISMATCH)


def verify_message(error: ssl.SSLCertVerificationError) -> str:
    """OpenSSL's reason, without its full stop."""
    return str(error.verify_message).rstrip(".")


def problem(error: Exception) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "did not answer (connection refused)"
    if isinstance(error, TimeoutError):
        return "did not answer (timed out)"
    if refuses_credentials(error):
        return "refused the credentials in transport_url"
    if names_another_host(error):
        return f"presented a certificate for another name ({verify_message(error)})"
    if isinstance(error, ssl.SSLCertVerificationError):
        return ("presented a certificate that ssl_ca_file does not verify "
                f"({verify_message(error)})")
    if refuses_tls(error):
        return "does not speak TLS on that port"
    return f"did not answer ({type(error).__name__}: {error})"


def credentials_refusal(conf: cfg.ConfigOpts) -> ConfigError:
    """The one line for a broker that refuses transport_url's credentials
    (its hosts and users, never a password)."""
    hosts = rabbit_hosts(conf)
    if isinstance(hosts, Unknown):
        raise ValueError("only a rabbit transport_url has credentials to refuse")
    where = ",".join(h.shown for h in hosts)
    users = ", ".join(sorted({repr(h.username or "guest") for h in hosts}))
    return ConfigError(f"[DEFAULT] transport_url: the message broker at rabbit://{where}/ "
                       f"refused the credentials of user {users}: correct the user or "
                       "password in transport_url, or the broker's users")


def tls_refusal(conf: cfg.ConfigOpts, host: RabbitHost, error: Exception) -> ConfigError:
    """The one line for a host of transport_url whose TLS ``refuses_tls``,
    naming the option to correct: transport_url for a name the certificate
    does not hold, ssl_ca_file for a certificate it does not verify, ssl
    for a port without TLS."""
    where = f"the message broker at rabbit://{host.shown}/"
    if names_another_host(error):
        return ConfigError(
            f"[DEFAULT] transport_url: {where} presented a certificate for another name "
            f"({verify_message(error)}): reach the broker by a name its certificate holds")
    if isinstance(error, ssl.SSLCertVerificationError):
        ca_file = conf.oslo_messaging_rabbit.ssl_ca_file
        return ConfigError(
            f"[oslo_messaging_rabbit] ssl_ca_file: {where} presented a certificate this "
            f"CA file does not verify ({verify_message(error)}): give the CA that signed "
            "it (value: " + (shown(ca_file) if ca_file else "unset: the system's CAs") + ")")
    return ConfigError(
        f"[oslo_messaging_rabbit] ssl: {where} does not speak TLS on port {host.port}: "
        "give its TLS listener's port in transport_url, or set ssl = false (value: True)")


def refuse_rejected_login(conf: cfg.ConfigOpts, timeout: float) -> None:
    """At the start of the daemon and of a compute-agent-ctl command,
    before either writes or sends anything: raise ConfigError when no host
    of transport_url takes a login and one refused it for good, by its TLS
    (``refuses_tls``; the first such host's line) or transport_url's
    credentials. A broker that does not answer is the driver's to wait
    for, as at any time."""
    hosts = rabbit_hosts(conf)
    if isinstance(hosts, Unknown):
        return
    tls_refusals: list[ConfigError] = []
    credentials_refused = False
    for host in hosts:
        error = login(host, timeout)
        if error is None:
            return
        if refuses_tls(error):
            tls_refusals.append(tls_refusal(conf, host, error))
        credentials_refused = credentials_refused or refuses_credentials(error)
    if tls_refusals:
        raise tls_refusals[0]
    if credentials_refused:
        raise credentials_refusal(conf)


# RabbitMQ's refusal of a declare that differs from what it holds (its
# rabbit_misc:assert_args_equivalence, worded so since RabbitMQ 2): the
# argument, the queue or exchange, then each side's value: 'true', none, or
# "the value 'quorum' of type 'longstr'".
INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']*)' "
    r"in vhost '[^']*': received (?P<asked>.+?) but current is (?P<held>.+?)\s*$")
ARGUMENT_VALUE = re.compile(r"(?:the value )?'(?P<value>[^']*)'(?: of type '\w+')?")
# The [oslo_messaging_rabbit] option that asks each argument of a quorum
# queue (durable and x-queue-type: inequivalent_queue_option).
QUORUM_ARGUMENT_OPTIONS = {"x-delivery-limit": "rabbit_quorum_delivery_limit",
                           "x-max-in-memory-length": "rabbit_quorum_max_memory_length",
                           "x-max-in-memory-bytes": "rabbit_quorum_max_memory_bytes"}


@dataclass(frozen=True)
class Inequivalent:
    """A queue or exchange the broker holds with another value of
    ``argument`` than a declare asked; None for an argument not set."""

    kind: str  # "queue" or "exchange"
    name: str
    argument: str
    held: str | None
    asked: str | None


def argument_value(text: str) -> str | None:
    """A value as RabbitMQ's refusal words it; None for none."""
    found = ARGUMENT_VALUE.fullmatch(text.strip())
    return found.group("value") if found else None


def inequivalent(error: BaseException) -> Inequivalent | None:
    """The refusal among ``error`` and the errors it was raised from:
    of a queue rather than an exchange (oslo.messaging, refused a durable
    queue, declares its exchange again not durable, which the broker
    refuses in turn); None when there is none."""
    found: list[Inequivalent] = []
    seen: BaseException | None = error
    while seen is not None and len(found) < 10:
        match = INEQUIVALENT.search(str(seen))
        if match:
            found.append(Inequivalent(match["kind"], match["name"], match["argument"],
                                      argument_value(match["held"]),
                                      argument_value(match["asked"])))
        seen = seen.__cause__ or seen.__context__
    queues = [f for f in found if f.kind == "queue"]
    return next(iter(queues or found), None)


def queue_held(found: Inequivalent) -> str:
    """What the broker holds, as its refusal tells it."""
    if found.argument == "x-queue-type":
        return f"as {found.held or 'classic'}"
    if found.argument == "durable":
        # A quorum queue is always durable.
        return ("as classic, not durable" if found.held == "false" else
                "as durable (quorum or classic)")
    return f"with {found.argument} {found.held or 'unset'}"


def queue_asked(conf: cfg.ConfigOpts, found: Inequivalent) -> str:
    rabbit = conf.oslo_messaging_rabbit
    if found.argument not in ("x-queue-type", "durable"):
        return f"{found.argument} {found.asked or 'unset'}"
    if rabbit.rabbit_quorum_queue:
        return "quorum"
    return f"classic, {'durable' if rabbit.amqp_durable_queues else 'not durable'}"


def inequivalent_queue_option(conf: cfg.ConfigOpts, argument: str) -> str:
    """The option that asks ``argument`` of the agent's queues, or none."""
    rabbit = conf.oslo_messaging_rabbit
    if argument == "x-queue-type" or (argument == "durable" and rabbit.rabbit_quorum_queue):
        return "rabbit_quorum_queue"
    if argument == "durable":
        return "amqp_durable_queues"
    return QUORUM_ARGUMENT_OPTIONS.get(argument, "")


def exchange_refusal(conf: cfg.ConfigOpts, found: Inequivalent) -> ConfigError:
    """The control exchange held durable and asked not, or the reverse:
    rabbit_quorum_queue or amqp_durable_queues make it durable."""
    rabbit = conf.oslo_messaging_rabbit
    asked_durable = found.asked == "true"
    option = ("rabbit_quorum_queue" if rabbit.rabbit_quorum_queue
              else "amqp_durable_queues")
    durable = {True: "durable", False: "not durable"}
    return ConfigError(
        f"[oslo_messaging_rabbit] {option}: the broker has exchange {found.name!r} "
        f"{durable[not asked_durable]}; this config asks for it {durable[asked_durable]} "
        f"(value: {getattr(rabbit, option)}). Every agent and conductor shares it: set them "
        "all alike; to change it, delete it (rabbitmqadmin) with all of them stopped")


def declare_refusal(conf: cfg.ConfigOpts, error: BaseException) -> ConfigError | None:
    """The one line for a broker that refused to declare the agent's
    queues (compute-agent.HOST, compute-agent-heartbeat.HOST) or the
    control exchange as the config asks, for it holds them otherwise;
    None for another error. A queue's type and arguments never change
    once declared: the remedy is to delete it, and a stopped agent's
    queues hold nothing of value (the calls in them have their callers'
    timeouts). The exchange is every agent's and conductor's: the remedy
    is to ask it as they do, or to change it for them all."""
    found = inequivalent(error)
    if found is None:
        return None
    rabbit = conf.oslo_messaging_rabbit
    if found.kind == "exchange":
        return exchange_refusal(conf, found)
    option = inequivalent_queue_option(conf, found.argument)
    value = f" (value: {getattr(rabbit, option)})" if option else ""
    return ConfigError(
        f"[oslo_messaging_rabbit]{' ' + option if option else ''}: the broker has queue "
        f"{found.name!r} {queue_held(found)}; this config asks for {queue_asked(conf, found)}"
        f"{value}. A stopped agent's queues hold nothing of value: delete its two "
        "(rabbitmqctl delete_queue), then start it")


def is_reconnect_line(record: logging.LogRecord) -> bool:
    return isinstance(record.msg, str) and any(p in record.msg for p in RECONNECT_LINES)


class LinesToDebug(logging.Filter):
    """Demotes the lines ``matches`` picks to DEBUG, shown only when their
    logger is at DEBUG (oslo.log's ``default_log_levels``, e.g.
    ``oslo.messaging=DEBUG``)."""

    matches: Callable[[logging.LogRecord], bool]

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.matches(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install_once(logger_name: str, lines: type[LinesToDebug]) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, lines) for f in logger.filters):
        logger.addFilter(lines())


class ReconnectLinesToDebug(LinesToDebug):
    """The driver's reconnection-loop lines."""
    matches = staticmethod(is_reconnect_line)


_QUIET = threading.local()


# The driver's lines as it gives up a declare, whose error it raises:
# the consumer's, and its retry loop's (a message formatted beforehand).
GIVE_UP_LINES = ("Failed to declare consumer for topic", "Unable to connect to AMQP server on")


@contextmanager
def driver_lines_quiet(*pieces: str) -> Iterator[None]:
    """The driver's lines, in this thread and for as long as this lasts,
    at DEBUG: those whose format string holds one of ``pieces``, or all.
    For a send whose failure the caller says itself (the update loop's
    cast of its own heartbeat), and for the RPC server's start, whose
    declare refused is said once (GIVE_UP_LINES)."""
    _QUIET.pieces = pieces
    try:
        yield
    finally:
        _QUIET.pieces = None


def is_quieted_here(record: logging.LogRecord) -> bool:
    pieces = getattr(_QUIET, "pieces", None)
    if pieces is None:
        return False
    return not pieces or (isinstance(record.msg, str) and any(p in record.msg for p in pieces))


class QuietedLinesToDebug(LinesToDebug):
    matches = staticmethod(is_quieted_here)


def quiet_reconnect_lines() -> None:
    """Install the filters (once) on the driver's logger."""
    install_once(DRIVER_LOGGER, ReconnectLinesToDebug)
    install_once(DRIVER_LOGGER, QuietedLinesToDebug)
