"""compute_agent/rpc/broker.py: the broker's state from the loop's probe, one line each
way; the rabbit driver's reconnection lines demoted to DEBUG, its other
lines left alone; py-amqp's warning about the cancel of our own fanout
consumer as a server closes demoted too; the probe's findings in a few
words; TLS: the agent's own connections as the driver's, and a TLS
failure that no retry changes stopping the start in one line naming the
option."""
from __future__ import annotations

import logging
import ssl
import threading

import pytest
from amqp.exceptions import AccessRefused, PreconditionFailed
from oslo_config import cfg

from compute_agent.dependencies import Dependencies, Dependency, Health, Probe, Unknown
from compute_agent.exception import ConfigError
from compute_agent.messaging import messaging
from compute_agent.rpc import broker
from tests.unit.test_messaging import rabbit_conf

URL = "rabbit://127.0.0.1:5672/"
DOWN = Probe(Dependency.BROKER, URL, "did not answer (connection refused)")
UP = Probe(Dependency.BROKER, URL)


def test_an_outage_over_many_probes_is_one_line_each_way_and_a_counter(caplog):
    board = Dependencies(clock=iter(range(100, 200, 10)).__next__)
    caplog.set_level(logging.DEBUG, logger="compute_agent.dependencies")
    for answer in [UP, DOWN, DOWN, DOWN, DOWN, UP, UP]:
        broker.observe(board, answer)
        if answer is DOWN:
            failures = board.snapshot()[Dependency.BROKER].failures
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]
    assert said == [
        ("WARNING", f"the message broker at {URL} did not answer (connection refused)"),
        ("INFO", f"the message broker at {URL} is back after 4 failed cycles, 40 s")]
    assert failures == 4
    assert board.snapshot()[Dependency.BROKER].total_failures == 4


def test_a_transport_the_probe_cannot_ask_is_not_observed():
    board = Dependencies()
    broker.observe(board, Unknown("not checked: the kafka transport"))
    assert board.snapshot()[Dependency.BROKER].health is Health.UNKNOWN


# The rabbit driver's format strings (oslo.messaging 18): its reconnection
# loop, and lines that are not about it.
RECONNECT = [
    ("ERROR", "[%(connection_id)s] AMQP server on %(hostname)s:%(port)s is unreachable: "
              "%(err_str)s. Trying again in %(sleep_time)d seconds."),
    ("ERROR", "[%(connection_id)s] AMQP server %(hostname)s:%(port)s closed the "
              "connection. Check login credentials: %(err_str)s"),
    ("ERROR", "Connection failed: %s (retrying in %s seconds)"),
    ("INFO", "A recoverable connection/channel error occurred, trying to reconnect: %s"),
    ("INFO", "[%(connection_id)s] Reconnected to AMQP server on %(hostname)s:%(port)s via "
             "[%(transport)s] client with port %(client_port)s."),
    ("WARNING", "Unexpected error during heartbeat thread processing, retrying..."),
]
OTHERS = [
    ("ERROR", "Failed to publish message to topic '%(topic)s': %(err_str)s"),
    ("ERROR", "Unable to connect to AMQP server on %(hostname)s:%(port)s after "
              "%(retry)s tries: %(err_str)s"),
    ("ERROR", "The broker has blocked the connection: %s"),
]


@pytest.fixture
def driver_log(caplog):
    logger = logging.getLogger(broker.DRIVER_LOGGER)
    level = logger.level
    broker.quiet_reconnect_lines()
    broker.quiet_reconnect_lines()  # installed once only
    assert len([f for f in logger.filters
                if isinstance(f, broker.ReconnectLinesToDebug)]) == 1
    yield logger
    logger.setLevel(level)
    for f in [f for f in logger.filters
              if isinstance(f, (broker.ReconnectLinesToDebug, broker.QuietedLinesToDebug))]:
        logger.removeFilter(f)


def emit(logger: logging.Logger, level: str, template: str) -> None:
    args = ({"connection_id": "c", "hostname": "h", "port": 1, "err_str": "e",
             "sleep_time": 1, "transport": "amqp", "client_port": 2, "topic": "t",
             "retry": 1},) if "%(" in template else ("e", 1)[:template.count("%s")]
    logger.log(logging.getLevelName(level), template, *args)


def test_the_drivers_reconnection_lines_are_dropped_at_info(driver_log, caplog):
    driver_log.setLevel(logging.INFO)
    for level, template in RECONNECT + OTHERS:
        emit(driver_log, level, template)
    assert [(r.levelname, r.msg) for r in caplog.records] == OTHERS


def test_the_drivers_lines_are_dropped_in_a_quieted_thread_only(driver_log, caplog):
    """The update loop's cast of its own heartbeat says its failure itself:
    the driver's lines about that send go, others' stay."""
    driver_log.setLevel(logging.INFO)
    elsewhere = threading.Thread(target=lambda: [emit(driver_log, *o) for o in OTHERS])
    with broker.driver_lines_quiet():
        for level, template in OTHERS:
            emit(driver_log, level, template)
        elsewhere.start()
        elsewhere.join()
    emit(driver_log, *OTHERS[0])
    assert [(r.levelname, r.msg) for r in caplog.records] == OTHERS + OTHERS[:1]


def test_the_drivers_reconnection_lines_are_debug_when_its_logger_is(driver_log, caplog):
    driver_log.setLevel(logging.DEBUG)
    for level, template in RECONNECT:
        emit(driver_log, level, template)
    assert [(r.levelname, r.msg) for r in caplog.records] == [
        ("DEBUG", template) for _, template in RECONNECT]


@pytest.mark.parametrize("error, said", [
    (ConnectionRefusedError(111, "Connection refused"), "did not answer (connection refused)"),
    (TimeoutError("timed out"), "did not answer (timed out)"),
    (AccessRefused("(403) ACCESS_REFUSED - Login was refused"),
     "refused the credentials in transport_url"),
    (OSError(113, "No route to host"), "did not answer (OSError: [Errno 113] No route to host)"),
])
def test_the_probes_findings_in_a_few_words(error, said):
    assert broker.problem(error) == said


# --- TLS ----------------------------------------------------------------------

def tls_conf(transport_url: str, **rabbit) -> cfg.ConfigOpts:
    conf = rabbit_conf(**rabbit)
    conf.set_override("transport_url", transport_url)
    return conf


def drivers_ssl(conf: cfg.ConfigOpts, monkeypatch) -> object:
    """The ``ssl`` oslo.messaging's rabbit driver gives kombu for a
    connection of its own: the driver's connection, made without
    connecting."""
    from oslo_messaging._drivers import common as rpc_common
    from oslo_messaging._drivers import impl_rabbit
    monkeypatch.setattr(impl_rabbit.Connection, "ensure_connection", lambda self: None)
    url = messaging.TransportURL.parse(conf, conf.transport_url)
    return impl_rabbit.Connection(conf, url, rpc_common.PURPOSE_LISTEN).connection.ssl


ONE_HOST = "rabbit://agent:pw@broker.example.org:5671/"
CA = {"ca_certs": "/etc/ca.pem", "cert_reqs": ssl.CERT_REQUIRED,
      "server_hostname": "broker.example.org"}


@pytest.mark.parametrize("rabbit, kombu_ssl", [
    ({}, False),
    ({"ssl_ca_file": "/etc/ca.pem"}, False),
    ({"ssl": True}, True),
    ({"ssl": True, "ssl_ca_file": "/etc/ca.pem"}, CA),
    ({"ssl": True, "ssl_ca_file": "/etc/ca.pem", "ssl_cert_file": "/etc/agent.pem",
      "ssl_key_file": "/etc/agent.key", "ssl_version": "tlsv1_2"},
     {**CA, "certfile": "/etc/agent.pem", "keyfile": "/etc/agent.key",
      "ssl_version": ssl.PROTOCOL_TLSv1_2}),
    ({"ssl": True, "ssl_cert_file": "/etc/agent.pem"}, {"certfile": "/etc/agent.pem"}),
])
def test_the_agents_own_connections_have_the_drivers_tls(rabbit, kombu_ssl, monkeypatch):
    """The probes' and the watch's connections are TLS as the driver's are,
    the name in transport_url verified whenever a CA file is given."""
    conf = tls_conf(ONE_HOST, **rabbit)
    [host] = broker.rabbit_hosts(conf)
    ours = host.connection(5).ssl
    assert ours == kombu_ssl
    assert ours == drivers_ssl(conf, monkeypatch)


def test_each_host_of_transport_url_is_verified_by_its_own_name(monkeypatch):
    """With several hosts the driver leaves the name to kombu, which takes
    the host it connects to."""
    conf = tls_conf("rabbit://a:pw@b1.example.org:5671,a:pw@b2.example.org:5671/",
                    ssl=True, ssl_ca_file="/etc/ca.pem")
    ours = [host.connection(5).ssl for host in broker.rabbit_hosts(conf)]
    assert ours == [{**CA, "server_hostname": name}
                    for name in ("b1.example.org", "b2.example.org")]
    assert drivers_ssl(conf, monkeypatch) == {**CA, "server_hostname": None}


def ssl_error(kind: type[ssl.SSLError], number: int, text: str, reason: str | None,
              verify: tuple[int, str] | None = None) -> ssl.SSLError:
    """An error as CPython's ssl module raises it (_ssl.c,
    fill_and_set_sslerror): OpenSSL's error number and the text, then
    OpenSSL's reason and library (None when OpenSSL gave none), and for a
    certificate that does not verify, OpenSSL's X509_V_ERR code and its
    text."""
    error = kind(number, text)
    error.reason, error.library = reason, "SSL" if reason else None
    if verify is not None:
        error.verify_code, error.verify_message = verify
    return error


def verify_failed(code: int, why: str) -> ssl.SSLError:
    return ssl_error(ssl.SSLCertVerificationError, 1, "[SSL: CERTIFICATE_VERIFY_FAILED] "
                     f"certificate verify failed: {why} (_ssl.c:1006)",
                     "CERTIFICATE_VERIFY_FAILED", (code, why))


# Each as seen against a RabbitMQ node whose certificate a test CA signed
# for localhost (tests/functional/test_broker_tls.py).
WRONG_CA = verify_failed(19, "self-signed certificate in certificate chain")
WRONG_ADDRESS = verify_failed(64, "IP address mismatch, certificate is not valid for "
                                  "'127.0.0.1'.")
WRONG_NAME = verify_failed(62, "Hostname mismatch, certificate is not valid for 'rabbit'.")
# ssl = true against the node's plain AMQP port.
NOT_TLS = ssl_error(ssl.SSLError, 1, "[SSL: WRONG_VERSION_NUMBER] wrong version number "
                    "(_ssl.c:1006)", "WRONG_VERSION_NUMBER")
# The node closing the handshake: it asked for a client certificate and got
# none (TLS 1.3), or it went away; a retry may meet another outcome.
CLOSED = ssl_error(ssl.SSLEOFError, 8, "EOF occurred in violation of protocol (_ssl.c:2427)",
                   None)


@pytest.mark.parametrize("error, said, for_good", [
    (WRONG_CA, "presented a certificate that ssl_ca_file does not verify (self-signed "
     "certificate in certificate chain)", True),
    (WRONG_ADDRESS, "presented a certificate for another name (IP address mismatch, "
     "certificate is not valid for '127.0.0.1')", True),
    (WRONG_NAME, "presented a certificate for another name (Hostname mismatch, "
     "certificate is not valid for 'rabbit')", True),
    (NOT_TLS, "does not speak TLS on that port", True),
    (CLOSED, "did not answer (SSLEOFError: EOF occurred in violation of protocol "
     "(_ssl.c:2427))", False),
    (ConnectionResetError(104, "Connection reset by peer"),
     "did not answer (ConnectionResetError: [Errno 104] Connection reset by peer)", False),
])
def test_a_tls_failure_in_a_few_words_and_whether_it_is_for_good(error, said, for_good):
    assert broker.problem(error) == said
    assert broker.refuses_tls(error) is for_good


def refused_login(conf: cfg.ConfigOpts, monkeypatch, errors: dict[str, Exception | None]
                  ) -> str | None:
    """refuse_rejected_login's line when each host (by name) answers a
    login with its error, None when it lets the start go on."""
    monkeypatch.setattr(broker, "login", lambda host, timeout: errors[host.hostname])
    try:
        broker.refuse_rejected_login(conf, 5)
    except ConfigError as e:
        return str(e)
    return None


REFUSED = AccessRefused("(403) ACCESS_REFUSED - Login was refused")
TWO_HOSTS = "rabbit://a:pw@b1:5671,a:pw@b2:5671/"


@pytest.mark.parametrize("rabbit, errors, line", [
    ({"ssl_ca_file": "/etc/ca.pem"}, {"broker.example.org": WRONG_CA},
     "[oslo_messaging_rabbit] ssl_ca_file: the message broker at "
     "rabbit://broker.example.org:5671/ presented a certificate this CA file does not "
     "verify (self-signed certificate in certificate chain): give the CA that signed it "
     "(value: '/etc/ca.pem')"),
    ({}, {"broker.example.org": WRONG_CA},
     "[oslo_messaging_rabbit] ssl_ca_file: the message broker at "
     "rabbit://broker.example.org:5671/ presented a certificate this CA file does not "
     "verify (self-signed certificate in certificate chain): give the CA that signed it "
     "(value: unset: the system's CAs)"),
    ({"ssl_ca_file": "/etc/ca.pem"}, {"broker.example.org": WRONG_ADDRESS},
     "[DEFAULT] transport_url: the message broker at rabbit://broker.example.org:5671/ "
     "presented a certificate for another name (IP address mismatch, certificate is not "
     "valid for '127.0.0.1'): reach the broker by a name its certificate holds"),
    ({}, {"broker.example.org": NOT_TLS},
     "[oslo_messaging_rabbit] ssl: the message broker at rabbit://broker.example.org:5671/ "
     "does not speak TLS on port 5671: give its TLS listener's port in transport_url, or "
     "set ssl = false (value: True)"),
    ({}, {"broker.example.org": CLOSED}, None),
])
def test_a_broker_refusing_tls_stops_the_start_naming_the_option(rabbit, errors, line,
                                                                monkeypatch):
    conf = tls_conf(ONE_HOST, ssl=True, **rabbit)
    assert refused_login(conf, monkeypatch, errors) == line


@pytest.mark.parametrize("errors, line", [
    # The TLS refusal (the handshake) before the credentials (the login after).
    ({"b1": REFUSED, "b2": WRONG_NAME}, "[DEFAULT] transport_url: the message broker at "
     "rabbit://b2:5671/ presented a certificate for another name (Hostname mismatch, "
     "certificate is not valid for 'rabbit'): reach the broker by a name its certificate "
     "holds"),
    ({"b1": REFUSED, "b2": CLOSED}, "[DEFAULT] transport_url: the message broker at "
     "rabbit://b1:5671,b2:5671/ refused the credentials of user 'a': correct the user or "
     "password in transport_url, or the broker's users"),
    # A host that takes the login: the driver fails over to it.
    ({"b1": WRONG_CA, "b2": None}, None),
    ({"b1": ConnectionRefusedError(111, "Connection refused"), "b2": CLOSED}, None),
])
def test_of_several_hosts_one_that_takes_the_login_lets_the_start_go_on(errors, line,
                                                                         monkeypatch):
    conf = tls_conf(TWO_HOSTS, ssl=True, ssl_ca_file="/etc/ca.pem")
    assert refused_login(conf, monkeypatch, errors) == line


# --- a queue the broker holds otherwise than the config asks -------------------

DELETE = (". A stopped agent's queues hold nothing of value: delete its two (rabbitmqctl "
          "delete_queue), then start it")
QUORUM = "the value 'quorum' of type 'longstr'"


def refused(argument: str, received: str, current: str, kind: str = "queue",
            name: str = "compute-agent.h1") -> PreconditionFailed:
    """RabbitMQ's refusal (3.10) of a declare, as py-amqp raises it."""
    method = "Queue.declare" if kind == "queue" else "Exchange.declare"
    return PreconditionFailed(f"{method}: (406) PRECONDITION_FAILED - inequivalent arg "
                              f"'{argument}' for {kind} '{name}' in vhost '/': received "
                              f"{received} but current is {current}")


def given_up(*errors: Exception) -> Exception:
    """oslo.messaging's error once it gave a declare up, raised while
    handling ``errors[0]``, raised while handling ``errors[1]``..."""
    outer = messaging.MessageDeliveryFailure(
        f"Unable to connect to AMQP server on h:1 after inf tries: {errors[0]}")
    for error, inner in zip((outer, *errors), errors):
        error.__context__ = inner
    return outer


@pytest.mark.parametrize("rabbit, error, said", [
    # A classic queue left from before rabbit_quorum_queue, durable or not.
    ({"rabbit_quorum_queue": True}, refused("x-queue-type", QUORUM, "none"),
     "[oslo_messaging_rabbit] rabbit_quorum_queue: the broker has queue 'compute-agent.h1' "
     "as classic; this config asks for quorum (value: True)"),
    ({"rabbit_quorum_queue": True}, refused("durable", "'true'", "'false'"),
     "[oslo_messaging_rabbit] rabbit_quorum_queue: the broker has queue 'compute-agent.h1' "
     "as classic, not durable; this config asks for quorum (value: True)"),
    # rabbit_quorum_queue turned off again.
    ({"amqp_durable_queues": True}, refused("x-queue-type", "none", QUORUM),
     "[oslo_messaging_rabbit] rabbit_quorum_queue: the broker has queue 'compute-agent.h1' "
     "as quorum; this config asks for classic, durable (value: False)"),
    ({}, refused("durable", "'false'", "'true'"),
     "[oslo_messaging_rabbit] amqp_durable_queues: the broker has queue 'compute-agent.h1' "
     "as durable (quorum or classic); this config asks for classic, not durable "
     "(value: False)"),
    ({"rabbit_quorum_queue": True},
     refused("x-delivery-limit", "none", "the value '5' of type 'signedint'"),
     "[oslo_messaging_rabbit] rabbit_quorum_delivery_limit: the broker has queue "
     "'compute-agent.h1' with x-delivery-limit 5; this config asks for x-delivery-limit "
     "unset (value: 0)"),
])
def test_a_queue_held_otherwise_is_one_line_naming_it_its_type_and_the_type_asked(
        rabbit, error, said):
    assert str(broker.declare_refusal(rabbit_conf(**rabbit), given_up(error))) == (
        said + DELETE)


def test_the_queues_refusal_is_said_not_the_exchanges_the_driver_met_after_it():
    """Refused a durable queue, oslo.messaging declares it again not
    durable, its exchange first, which the broker refuses in turn."""
    error = given_up(refused("durable", "'false'", "'true'", "exchange", "openstack"),
                     refused("durable", "'true'", "'false'"))
    line = broker.declare_refusal(rabbit_conf(rabbit_quorum_queue=True), error)
    assert "has queue 'compute-agent.h1' as classic, not durable;" in str(line)


@pytest.mark.parametrize("rabbit, held, said", [
    # rabbit_quorum_queue turned on where every service declared it not durable.
    ({"rabbit_quorum_queue": True}, "'false'",
     "[oslo_messaging_rabbit] rabbit_quorum_queue: the broker has exchange 'openstack' not "
     "durable; this config asks for it durable (value: True). "),
    # And turned off again.
    ({}, "'true'",
     "[oslo_messaging_rabbit] amqp_durable_queues: the broker has exchange 'openstack' "
     "durable; this config asks for it not durable (value: False). "),
])
def test_the_control_exchange_held_otherwise_is_every_services_to_change(rabbit, held, said):
    asked = "'true'" if held == "'false'" else "'false'"
    error = given_up(*[refused("durable", asked, held, "exchange", "openstack")] * 2)
    assert str(broker.declare_refusal(rabbit_conf(**rabbit), error)) == (
        said + "Every agent and conductor shares it: set them all alike; to change it, "
        "delete it (rabbitmqadmin) with all of them stopped")


def test_other_failures_to_start_are_no_declare_refusal():
    error = messaging.MessageDeliveryFailure("Unable to connect to AMQP server on h:1 after "
                                             "inf tries: [Errno 111] Connection refused")
    assert broker.declare_refusal(rabbit_conf(), error) is None


def test_the_drivers_lines_named_are_dropped_in_a_quieted_thread_the_others_kept(
        driver_log, caplog):
    """The RPC server's start: the lines of a declare the driver gives up,
    whose error the start says itself."""
    driver_log.setLevel(logging.INFO)
    declare_given_up = [("ERROR", "Failed to declare consumer for topic '%(topic)s': "
                                  "%(err_str)s"), OTHERS[1]]
    kept = [OTHERS[0], OTHERS[2]]
    with broker.driver_lines_quiet(*broker.GIVE_UP_LINES):
        for level, template in declare_given_up + kept:
            emit(driver_log, level, template)
    assert [(r.levelname, r.msg) for r in caplog.records] == kept
