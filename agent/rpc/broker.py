"""The message broker as a dependency: a cheap probe of ``transport_url``,
and quiet for oslo.messaging's rabbit driver while it reconnects.

The driver reconnects on its own, each of its connections in a loop that
logs every attempt (ERROR, every 1 to 30 s, for as long as the broker is
away) and each success. oslo.messaging has no public hook for a
connection's state: its callbacks are its consumers' own. So the agent's
update loop asks the broker itself, once a cycle, with the probe below
(one TCP connection and AMQP login, a few milliseconds), and says the
one line each way (agent/dependencies.py); the driver's lines about its
reconnection loop are demoted to DEBUG by a filter on its logger, matched
on their format strings. Should a release of the driver change those
strings, its lines come back as they were: noise, never a missed outage,
since the outage is seen by the probe.
"""
from __future__ import annotations

import logging
from typing import Any

import kombu
from amqp import exceptions as amqp_exceptions
from oslo_config import cfg

from agent.dependencies import Dependencies, Dependency, Probe, Unknown
from agent.exception import ConfigError
from agent.messaging import messaging

# oslo.messaging's rabbit driver reaches these when the URL names no host.
RABBIT_DEFAULT = ("localhost", 5672)
DRIVER_LOGGER = "oslo.messaging._drivers.impl_rabbit"
# Pieces of the format strings (record.msg, before interpolation) of the
# driver's lines about its reconnection loop: an attempt failed ("is
# unreachable", "closed the connection", "Connection failed"), a
# heartbeat found the connection broken, and a connection is back.
RECONNECT_LINES = (
    "is unreachable: %(err_str)s",
    "closed the connection. Check login credentials",
    "Connection failed: %s (retrying in",
    "A recoverable connection/channel error occurred, trying to reconnect",
    "Reconnected to AMQP server on",
)


def _hosts(conf: cfg.ConfigOpts) -> tuple[Any, list[tuple[str, int, str | None, str | None]]]:
    """transport_url parsed, and its hosts as (name, port, user, password):
    the driver's default host when it names none."""
    url = messaging.TransportURL.parse(conf, conf.transport_url)
    hosts = [(h.hostname, h.port or RABBIT_DEFAULT[1], h.username, h.password)
             for h in url.hosts] or [(*RABBIT_DEFAULT, None, None)]
    return url, hosts


def _login(url, hostname: str, port: int, user: str | None, password: str | None,
           timeout: float) -> Exception | None:
    """One connection, logged in and closed; the error, or None."""
    connection = kombu.Connection(hostname=hostname, port=port, userid=user or "guest",
                                  password=password or "guest",
                                  virtual_host=url.virtual_host or "/",
                                  connect_timeout=timeout)
    try:
        # One attempt (kombu's connect() tries again after 2 s), with
        # the socket's own errors.
        connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                     interval_max=0, reraise_as_library_errors=False)
    except Exception as e:  # noqa: BLE001 - any failure is this probe's finding
        return e
    finally:
        connection.release()
    return None


def probe(conf: cfg.ConfigOpts, timeout: float) -> Probe | Unknown:
    """A connection to each host of ``transport_url`` in turn, logged in
    and closed: answered when one accepts it. The URL is shown without its
    credentials."""
    url, hosts = _hosts(conf)
    if url.transport != "rabbit":
        return Unknown(f"not checked: the {url.transport} transport")
    problems = []
    for hostname, port, user, password in hosts:
        error = _login(url, hostname, port, user, password, timeout)
        if error is not None:
            problems.append(problem(error))
            continue
        return Probe(Dependency.BROKER, f"rabbit://{hostname}:{port}/")
    shown = ",".join(f"{h}:{p}" for h, p, _, _ in hosts)
    if len(hosts) == 1:
        return Probe(Dependency.BROKER, f"rabbit://{shown}/", problems[0])
    return Probe(Dependency.BROKER, f"rabbit://{shown}/", "no host answered: " + "; ".join(
        f"{h}:{p} {why}" for (h, p, _, _), why in zip(hosts, problems)))


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


def problem(error: Exception) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "did not answer (connection refused)"
    if isinstance(error, TimeoutError):
        return "did not answer (timed out)"
    if refuses_credentials(error):
        return "refused the credentials in transport_url"
    return f"did not answer ({type(error).__name__}: {error})"


def credentials_refusal(conf: cfg.ConfigOpts) -> ConfigError:
    """The one line for a broker that refuses transport_url's credentials
    (its hosts and users, never a password)."""
    _, hosts = _hosts(conf)
    where = ",".join(f"{h}:{p}" for h, p, _, _ in hosts)
    users = ", ".join(sorted({repr(u or "guest") for _, _, u, _ in hosts}))
    return ConfigError(f"[DEFAULT] transport_url: the message broker at rabbit://{where}/ "
                       f"refused the credentials of user {users}: correct the user or "
                       "password in transport_url, or the broker's users")


def refuse_rejected_credentials(conf: cfg.ConfigOpts, timeout: float) -> None:
    """At the daemon's start, before it writes anything: raise ConfigError
    when no host of transport_url takes a login and one refused its
    credentials. A broker that does not answer is the driver's to wait
    for, as at any time."""
    url, hosts = _hosts(conf)
    if url.transport != "rabbit":
        return
    refused = False
    for hostname, port, user, password in hosts:
        error = _login(url, hostname, port, user, password, timeout)
        if error is None:
            return
        refused = refused or refuses_credentials(error)
    if refused:
        raise credentials_refusal(conf)


def is_reconnect_line(record: logging.LogRecord) -> bool:
    return isinstance(record.msg, str) and any(p in record.msg for p in RECONNECT_LINES)


class ReconnectLinesToDebug(logging.Filter):
    """Demotes the driver's reconnection-loop lines to DEBUG, shown only
    when the driver's logger is at DEBUG (oslo.log's
    ``default_log_levels``: ``oslo.messaging=DEBUG``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not is_reconnect_line(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_reconnect_lines() -> None:
    """Install the filter (once) on the driver's logger."""
    logger = logging.getLogger(DRIVER_LOGGER)
    if not any(isinstance(f, ReconnectLinesToDebug) for f in logger.filters):
        logger.addFilter(ReconnectLinesToDebug())
