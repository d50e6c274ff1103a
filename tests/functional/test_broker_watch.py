"""The update loop's probe of the broker (compute_agent/rpc/broker.py BrokerWatch) on
a RabbitMQ node of the test's own: one connection kept across cycles, not
a login per cycle, and the same findings as a login when the broker goes
away and comes back."""
from __future__ import annotations

import subprocess

from oslo_config import cfg

from compute_agent.config import register_opts
from compute_agent.dependencies import Dependency, Probe
from compute_agent.rpc.broker import BrokerWatch


def connections(node) -> int:
    """The node's client connections, as the broker lists them."""
    out = subprocess.run(["rabbitmqctl", "-q", "-n", node.node, "list_connections",
                          "--no-table-headers"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return len([line for line in out.splitlines() if line.strip()])


def test_bug_the_loops_probe_logged_in_to_the_broker_every_cycle(private_rabbitmq):
    """Each cycle's probe was a new TCP connection and AMQP login: 17 new
    connections a second on the broker at 1,000 hosts and 60 s cycles."""
    conf = cfg.ConfigOpts()
    register_opts(conf)
    conf([], project="compute-agent", default_config_files=[])
    conf.set_override("transport_url", private_rabbitmq.url)
    url = f"rabbit://127.0.0.1:{private_rabbitmq.port}/"
    watch = BrokerWatch(conf, 5)
    try:
        assert [watch.probe() for _ in range(5)] == [Probe(Dependency.BROKER, url)] * 5
        assert connections(private_rabbitmq) == 1

        private_rabbitmq.stop_app()
        try:
            assert watch.probe() == Probe(Dependency.BROKER, url,
                                          "did not answer (connection refused)")
        finally:
            private_rabbitmq.start_app()
        assert [watch.probe() for _ in range(3)] == [Probe(Dependency.BROKER, url)] * 3
        assert connections(private_rabbitmq) == 1
    finally:
        watch.close()
    assert connections(private_rabbitmq) == 0
