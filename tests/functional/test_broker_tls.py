"""TLS to the broker, against a RabbitMQ node of the module's own that
listens for TLS only with a certificate a test CA signed for ``localhost``,
and asks each client for a certificate of that CA. The agent and
compute-agent-ctl connect with ``[oslo_messaging_rabbit] ssl``; a CA that
does not verify the broker, or a name in transport_url its certificate does
not hold, stops either at start with one line and exit 2, before anything
is written."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.functional.helpers import assert_refused, providers_named, wait_serving, write_conf
from tests.functional.private_services import BrokerTls, PrivateRabbitMQ
from tests.tls import Authority, KeyPair

BIN = Path(sys.executable).parent
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}
# The name the broker's certificate holds, and another way to reach it
# that the certificate does not name.
BROKER_NAME = "localhost"
UNNAMED_ADDRESS = "127.0.0.1"


@dataclass(frozen=True)
class TlsBroker:
    node: PrivateRabbitMQ
    authority: Authority
    other_authority: Authority
    client: KeyPair


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory) -> Iterator[TlsBroker]:
    material = tmp_path_factory.mktemp("tls")
    authority = Authority.make(material, "test-ca")
    node = PrivateRabbitMQ(BrokerTls(authority.issue(material, "broker", [BROKER_NAME]),
                                     authority.certificate, client_certificates=True))
    try:
        yield TlsBroker(node.start(), authority, Authority.make(material, "other-ca"),
                        authority.issue(material, "agent"))
    finally:
        node.close()


def tls_conf(directory: Path, placement_url: str, host: str, broker: TlsBroker,
             broker_host: str = BROKER_NAME, ca: Path | None = None) -> Path:
    return write_conf(directory, placement_url, host, HOST,
                      DEFAULT={"transport_url": broker.node.tls_url(broker_host)},
                      oslo_messaging_rabbit={
                          "ssl": "true",
                          "ssl_ca_file": ca or broker.authority.certificate,
                          "ssl_cert_file": broker.client.certificate,
                          "ssl_key_file": broker.client.key})


def tls_connections(node: PrivateRabbitMQ) -> list[list[str]]:
    """Each client connection of the node: whether it is TLS, and the
    subject of the client's certificate."""
    out = subprocess.run(["rabbitmqctl", "-q", "-n", node.node, "list_connections",
                          "ssl", "peer_cert_subject", "--no-table-headers"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return [line.split("\t") for line in out.splitlines() if line.strip()]


def run(command: str, conf: Path, *args: str) -> subprocess.CompletedProcess:
    """A console script to its end; a retry loop in place of the refusal
    fails the test by its timeout."""
    return subprocess.run([str(BIN / command), "--config-file", str(conf), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_agent_serves_over_tls_and_answers_ctl(tls_broker, placement, tmp_path):
    host = f"tls-{uuid.uuid4().hex[:8]}"
    conf = tls_conf(tmp_path, placement.url, host, tls_broker)
    log = tmp_path / "agent.log"
    with open(log, "w") as out:
        agent = subprocess.Popen([str(BIN / "compute-agent"), "--config-file", str(conf)],
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_serving(conf, host, agent, log)
        done = run("compute-agent-ctl", conf, "host-info", host, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["host"] == host
        # The update loop's own probe of the broker (BrokerWatch), asked
        # before the first cycle, found it up: no line about it.
        assert "message broker" not in log.read_text()
        # Every connection to the node, the agent's own and its driver's, is
        # TLS with the agent's certificate: the node has no other listener.
        connections = tls_connections(tls_broker.node)
        assert len(connections) >= 2
        assert all(c == ["true", "CN=agent"] for c in connections), connections
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(60)
    assert code == 0, log.read_text()


# The line each refusal is, after the command's name.
WRONG = {
    "ca": ("[oslo_messaging_rabbit] ssl_ca_file: the message broker at "
           "rabbit://localhost:{port}/ presented a certificate this CA file does not verify "
           "(self-signed certificate in certificate chain): give the CA that signed it "
           "(value: '{other_ca}')"),
    "name": ("[DEFAULT] transport_url: the message broker "
             "at rabbit://127.0.0.1:{port}/ presented a certificate for another name "
             "(IP address mismatch, certificate is not valid for '127.0.0.1'): reach the "
             "broker by a name its certificate holds"),
}
COMMANDS = {"daemon": ("compute-agent",), "ctl": ("compute-agent-ctl", "host-info")}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("wrong", WRONG)
def test_a_wrong_ca_or_name_is_one_line_and_exit_2_with_nothing_written(
        tls_broker, placement, tmp_path, wrong, command):
    host = f"tls-{uuid.uuid4().hex[:8]}"
    conf = (tls_conf(tmp_path, placement.url, host, tls_broker,
                     ca=tls_broker.other_authority.certificate) if wrong == "ca"
            else tls_conf(tmp_path, placement.url, host, tls_broker,
                          broker_host=UNNAMED_ADDRESS))
    script, *args = COMMANDS[command]
    done = run(script, conf, *args, *([host] if args else []))
    expected = WRONG[wrong].format(port=tls_broker.node.tls_port,
                           other_ca=tls_broker.other_authority.certificate)
    assert_refused(done, tmp_path / "state", f"{script}: error: {expected}")
    assert done.stdout == ""
    assert providers_named(placement.url, host) == []
