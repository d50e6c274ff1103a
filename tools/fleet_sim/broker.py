"""The fleet's RabbitMQ: one private node, or three in a cluster with the
queue settings operators use (tests/functional/private_services.py), and
what the agents hold on it.

The agents' share is the broker's whole less the run's own callers (its
BusClients, in the run's process): the connections oslo.messaging opened
in that process, told by the name it gives each connection
(COMMAND:PID:UUID, its client property ``connection_name``), and the
queues consumed on them (the callers' reply queues). Anything else on the
broker counts as the agents'.

Every list of ``rabbitmqctl`` used here (queues, connections, channels,
consumers) is the whole cluster's on any of its nodes (RabbitMQ 3.10,
seen on this machine's three-node clusters), so each is read once, from
the first node that answers, and a connection on any node is counted
once."""
from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from tests.functional.private_services import (
    CLUSTER_RABBIT_OPTIONS,
    PrivateRabbitCluster,
    PrivateRabbitMQ,
)

# The sizes a run's broker can have: one node, or PrivateRabbitCluster's.
BROKER_NODES = (1, PrivateRabbitCluster.SIZE)
# The client property in rabbitmqctl's text: {"connection_name","NAME"}.
CONNECTION_NAME = re.compile(r'\{"connection_name","([^"]*)"\}')


@dataclass(frozen=True)
class Connection:
    """One AMQP connection as the broker lists it."""

    pid: str  # the broker's process serving it, named with its node
    frames_received: int  # recv_cnt: an idle connection's are its heartbeats
    name: str | None  # the client's connection_name, if it gave one

    def opened_by(self, pid: int) -> bool:
        """Opened by oslo.messaging in process ``pid``."""
        parts = (self.name or "").rsplit(":", 2)
        return len(parts) == 3 and parts[1] == str(pid)


def parse_connections(rows: list[str]) -> list[Connection]:
    """``list_connections pid recv_cnt client_properties`` rows."""
    connections = []
    for row in rows:
        pid, received, properties = row.split("\t", 2)
        name = CONNECTION_NAME.search(properties)
        connections.append(Connection(pid, int(received), name and name.group(1)))
    return connections


def pairs(rows: list[str]) -> list[tuple[str, str]]:
    """Rows of two tab-separated columns."""
    return [(first, second) for first, second in (row.split("\t", 1) for row in rows)]


@dataclass(frozen=True)
class BrokerCounts:
    """The broker's queues and connections, and the agents' share of each."""

    queues: int
    connections: int
    agents_queues: int
    agents_connections: int

    def as_dict(self, hosts: int) -> dict:
        return {"broker_queues": self.queues, "broker_connections": self.connections,
                "broker_queues_per_host": round(self.agents_queues / hosts, 2),
                "broker_connections_per_host": round(self.agents_connections / hosts, 2)}


def broker_counts(queues: list[str], connections: list[Connection],
                  channels: list[tuple[str, str]], consumers: list[tuple[str, str]],
                  run_pid: int) -> BrokerCounts:
    """From the broker's lists: every queue's name; every connection;
    each channel's pid and its connection's; each consumer's queue and
    channel pid. The run's own are the connections process ``run_pid``
    opened and the queues consumed on them."""
    runs = {c.pid for c in connections if c.opened_by(run_pid)}
    run_channels = {channel for channel, connection in channels if connection in runs}
    run_queues = {queue for queue, channel in consumers if channel in run_channels}
    return BrokerCounts(len(queues), len(connections),
                        len([q for q in queues if q not in run_queues]),
                        len(connections) - len(runs))


def agents_frames_received(connections: list[Connection], run_pid: int) -> dict[str, int]:
    """The frames the broker has received on each of the agents' open
    connections (those process ``run_pid`` did not open), by the
    connection's pid."""
    return {c.pid: c.frames_received for c in connections if not c.opened_by(run_pid)}


@dataclass(frozen=True)
class FramesInWindow:
    """The agents' frames between two looks at the broker."""

    frames: int
    # Connections of the first look gone at the second: their frames after
    # the first look are not counted (the broker no longer lists them).
    connections_lost: int


def frames_in_window(before: dict[str, int], after: dict[str, int]) -> FramesInWindow:
    """A connection's count is since it opened: one open at both looks
    counts its difference, one opened between counts all of its own. The
    sum of the two looks' totals went negative (-0.14 a host and second)
    when connections closed and opened again in the window."""
    frames = sum(count - before.get(pid, 0) for pid, count in after.items())
    return FramesInWindow(frames, len(before.keys() - after.keys()))


class FleetBroker:
    """The run's RabbitMQ: one private node, or a cluster of three whose
    agents and callers take CLUSTER_RABBIT_OPTIONS (quorum queues, stream
    fanout, the queue manager's names, a 15 s heartbeat threshold).
    ``url`` names every node, as an operator's transport_url does."""

    def __init__(self, nodes: int):
        if nodes not in BROKER_NODES:
            raise ValueError(f"a broker of {nodes} nodes: one of {BROKER_NODES}")
        self._cluster = PrivateRabbitCluster() if nodes > 1 else None
        self.nodes: list[PrivateRabbitMQ] = (self._cluster.nodes if self._cluster
                                             else [PrivateRabbitMQ()])
        self.url = self._cluster.url if self._cluster else self.nodes[0].url
        self.rabbit_options: Mapping[str, str] = (CLUSTER_RABBIT_OPTIONS if self._cluster
                                                  else {})

    def start(self) -> FleetBroker:
        if self._cluster:
            self._cluster.start_all()
        else:
            self.nodes[0].start()
        return self

    def restart(self) -> None:
        """Each node's broker stopped and started again, in turn (on a
        cluster, the rolling restart of an upgrade)."""
        for node in self.nodes:
            node.stop_app()
            node.start_app()

    def _rows(self, *what: str) -> list[str]:
        """``rabbitmqctl`` ``what``'s rows, from the first node that answers."""
        for node in self.nodes:
            done = subprocess.run(["rabbitmqctl", "-q", "-n", node.node, *what,
                                   "--no-table-headers"],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                return [line for line in done.stdout.splitlines() if line.strip()]
        raise RuntimeError(f"no node of the broker answers {' '.join(what)}")

    def connections(self) -> list[Connection]:
        return parse_connections(self._rows("list_connections", "pid", "recv_cnt",
                                            "client_properties"))

    def counts(self, run_pid: int) -> BrokerCounts:
        return broker_counts(self._rows("list_queues", "name"), self.connections(),
                             pairs(self._rows("list_channels", "pid", "connection")),
                             pairs(self._rows("list_consumers", "queue_name", "channel_pid")),
                             run_pid)

    def close(self) -> None:
        if self._cluster:
            self._cluster.close()
        else:
            self.nodes[0].close()
