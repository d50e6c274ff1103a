"""The agent's one RPC server on the bus: both of its topics (the API's,
``compute-agent.HOST``, and the heartbeat's, ``compute-agent-heartbeat.HOST``)
consumed on one connection, its replies sent on another, the driver's pool.

oslo.messaging's rabbit driver gives each RPC server a connection of its
own and declares four queues for it: the shared topic queue, the host's,
and a fanout queue named at random (deleted when it closes, a new name at
each start). Two servers made 4 queues of a host's own, 3 to 4 connections
with the broker probe, and every restart with quorum queues left Raft
groups to delete. Nothing sends the agent a fanout or a call without a
server: here only the two queues named after the host are declared, names
that survive a restart.

The heartbeat stays apart where it matters: its calls are dispatched by
threads of their own (HEARTBEAT_THREADS), never queued behind the API's,
so a host busy with 64 rebuilds still answers in milliseconds.

A request must come through the control exchange (``openstack``), where the
broker checks the publisher's topic permissions (compute-agent-manage
bus-permissions): one published to the default exchange, which every agent
may write to for its replies and which routes by queue name, is dropped
with a warning. So one host's credentials cannot call another host's
agent.

Deaf: a listener that is connected and given nothing (its queues'
bindings gone, its consumers lost on the broker's side without a word,
its node hung with its socket still open) is seen by the update loop's
watch (ServerWatch), which has the listener's own thread drop its
connection: the driver makes it again, to the next node, and declares
the queues, their bindings and consumers, as after a node lost.
oslo.messaging mends a queue deleted under it itself: the broker
cancels its consumer, and the driver makes its connection again.

Stopping: oslo.messaging's listener sees a stop only between two waits on
the broker's socket, each up to 5 s (its ACK_REQUEUE_EVERY_SECONDS_MAX)
while idle. The listener here wakes itself with a cast of report_alive to
its own heartbeat queue: a stop takes milliseconds, with no frames spent
while idle on shorter waits.

This reaches into the rabbit driver beyond its public API (its listener
and connection classes): tests/functional/test_host_server.py runs it on a
real broker.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeGuard

from oslo_config import cfg
from oslo_messaging._drivers import amqpdriver
from oslo_messaging._drivers import base as driver_base
from oslo_messaging._drivers import common as driver_common
from oslo_messaging.rpc import server as rpc_server

from compute_agent.dependencies import Dependency, Probe, Unknown
from compute_agent.exception import ConfigError
from compute_agent.messaging import TOPIC, allow_deep_messages, messaging, server_queue, transport
from compute_agent.rpc import broker, heartbeat
from compute_agent.rpc.heartbeat import HeartbeatEndpoint
from compute_agent.rpc.in_flight import CallsInFlight, call_of
from compute_agent.rpc.sending import SEND_RETRIES
from compute_agent.rpc.served import HostAgent
from compute_agent.rpc.server import ComputeAgentEndpoint, warn_of_unserved_calls

LOG = logging.getLogger(__name__)
# The heartbeat's calls are answered from memory: two threads keep them
# apart from the API's without a pool of their own to size.
HEARTBEAT_THREADS = 2
# The methods served on the heartbeat's threads.
HEARTBEAT_METHODS = frozenset({"report_alive"})


def host_queues(host: str) -> tuple[str, str]:
    """The two queues of a host's own: the API's and the heartbeat's."""
    return server_queue(TOPIC, host), server_queue(heartbeat.TOPIC, host)


def through_control_exchange(exchange: str | None, control_exchange: str) -> bool:
    """Whether a request came through the control exchange, where the
    broker checked its publisher's topic permissions."""
    return exchange == control_exchange


class HostListener(amqpdriver.RpcAMQPListener):  # type: ignore[misc]
    """``queues`` (the host's) consumed on one connection; requests that
    did not come through ``exchange`` dropped. ``wake`` casts to the
    host's own heartbeat queue: once a stop is asked, so that the wait on
    the socket ends, and once connected again (connect_again), so that the
    watch finds the listener served."""

    def __init__(self, driver: Any, conn: Any, exchange: str, queues: tuple[str, ...],
                 wake: Callable[[], None], in_flight: CallsInFlight):
        super().__init__(driver, conn)
        self._exchange = exchange
        self._queues = queues
        self._wake = wake
        self._in_flight = in_flight
        self._connect_again = threading.Event()

    def declare(self) -> None:
        """Each queue, its binding to the exchange and its consumer."""
        for queue in self._queues:
            self.conn.declare_topic_consumer(exchange_name=self._exchange, topic=queue,
                                             callback=self)

    def connect_again(self) -> None:
        """Drop the connection and make it again, to the next host of
        transport_url, with the queues, their bindings and consumers
        declared anew (the driver's way after a node is lost), then
        ``wake``: in the thread that polls the connection (the driver's
        connection is not for two threads), at its next look at the broker,
        within ACK_REQUEUE_EVERY_SECONDS_MAX while idle. Asked again before
        that, once."""
        if not self._connect_again.is_set():
            self._connect_again.set()
            self._message_operations_handler.do(self._connect_anew)

    def _connect_anew(self) -> None:
        self._connect_again.clear()
        # The driver's connection (the pool's context holds it) and kombu's
        # in it, closed without a word to the broker: a node that hangs
        # would not answer one.
        driver_connection = self.conn.connection
        with driver_connection._connection_lock:
            driver_connection.connection.collect()
        try:
            # The driver finds its connection closed, makes it again, and
            # declares its consumers on it.
            self.conn.consume(timeout=amqpdriver.ACK_REQUEUE_EVERY_SECONDS_MIN)
        except driver_common.Timeout:
            pass  # connected again, and nothing came in that short wait
        except Exception as e:  # noqa: BLE001 - the watch's next look asks again
            LOG.warning("The RPC server's connection could not be made again: %s",
                        broker.problem(e))
            return
        self._wake()

    def __call__(self, message: Any) -> None:
        delivered_by = message._raw_message.delivery_info.get("exchange")
        if not through_control_exchange(delivered_by, self._exchange):
            try:
                message.acknowledge()
            finally:
                LOG.warning("Dropped a request for %s published to exchange %r, not %r: "
                            "only the control exchange checks who may call this host",
                            message._raw_message.delivery_info.get("routing_key"),
                            delivered_by, self._exchange)
            return
        if message.get("method") in HEARTBEAT_METHODS:
            super().__call__(message)
            return
        # Taken here, before oslo.messaging acknowledges the request (in
        # super().__call__): one the stop closed the door on is left
        # unacknowledged, and the broker gives it back to the host's queue
        # when this connection closes, for the next start.
        ticket = self._in_flight.take(call_of(message))
        if ticket is None:
            LOG.debug("Stopping: request %s left for the next start", message.get("method"))
            return
        taken = len(self.incoming)
        try:
            super().__call__(message)
        finally:
            if len(self.incoming) > taken:
                self.incoming[-1].in_flight_ticket = ticket
            else:  # not handed on: a duplicate, or its acknowledgement failed
                self._in_flight.done(ticket)

    def stop(self) -> None:
        self._shutdown.set()
        self.conn.stop_consuming()
        try:
            self._wake()
        except Exception as e:  # noqa: BLE001 - the stop goes on without it
            LOG.debug("The listener's wake-up was not sent: %s", e)
        super().stop()


class HostListenerAdapter(driver_base.PollStyleListenerAdapter):  # type: ignore[misc]
    """oslo.messaging's thread that polls the listener; its cleanup, once
    the server's calls are done (the server's wait()), also ends the
    heartbeat's threads."""

    def __init__(self, listener: HostListener, heartbeats: ThreadPoolExecutor) -> None:
        super().__init__(listener, 1, None)
        self._heartbeats = heartbeats

    def cleanup(self) -> None:
        self._heartbeats.shutdown(wait=True)
        super().cleanup()


class HostServer(rpc_server.RPCServer):  # type: ignore[misc]
    """oslo.messaging's RPC server with HostListener as its listener and a
    pool of its own for the heartbeat's calls. ``in_flight``: the API
    calls being served, from the listener's hand-over to their reply;
    ``heartbeat``: the heartbeat's endpoint.

    Once the daemon's stop closes ``in_flight``, an API call is not
    served: its request is left unacknowledged by the listener, and the
    broker gives it back to the host's queue when the listener's
    connection closes at the exit, for the next start. The heartbeat is still served while the
    calls taken finish: a host that drains is up (docs/operations.md)."""

    def __init__(self, transport: Any, target: Any, dispatcher: Any, executor: Any = None):
        super().__init__(transport, target, dispatcher, executor)
        self.in_flight = CallsInFlight()
        [self.heartbeat] = [e for e in dispatcher.endpoints if isinstance(e, HeartbeatEndpoint)]
        self._heartbeats: ThreadPoolExecutor | None = None
        self._connection: Any = None  # the listener's, once started
        self._listener: HostListener | None = None
        # The client of its own heartbeat's casts, made once.
        self._own_heartbeat = messaging.get_rpc_client(
            transport, messaging.Target(topic=heartbeat.TOPIC, version=heartbeat.VERSION,
                                        server=target.server),
            retry=SEND_RETRIES)

    def _create_listener(self) -> Any:
        driver = self.transport._driver
        if not isinstance(driver, amqpdriver.AMQPDriverBase):
            raise ConfigError(f"[DEFAULT] transport_url: the agent serves RPC over rabbit "
                              f"only (value: {type(driver).__name__})")
        conn = driver._get_connection(driver_common.PURPOSE_LISTEN)
        exchange = driver._get_exchange(self._target)
        listener = HostListener(driver, conn, exchange, host_queues(self._target.server),
                                self.cast_own_heartbeat, self.in_flight)
        listener.declare()
        self._listener = listener
        self._connection = conn
        self._heartbeats = ThreadPoolExecutor(HEARTBEAT_THREADS,
                                              thread_name_prefix="heartbeat-call")
        return HostListenerAdapter(listener, self._heartbeats)

    def _on_incoming(self, incoming: list[Any]) -> None:
        if incoming[0].message.get("method") in HEARTBEAT_METHODS and self._heartbeats:
            self._heartbeats.submit(self._process_incoming, incoming)
            return
        # Taken by the listener (HostListener.__call__) before its thread
        # starts: the stop never finds none in flight while one is being
        # handed on.
        self._work_executor.submit(self._process_and_count, incoming,
                                   incoming[0].in_flight_ticket)

    def _process_and_count(self, incoming: list[Any], ticket: int) -> None:
        try:
            self._process_incoming(incoming)  # its reply sent
        finally:
            self.in_flight.done(ticket)

    def connected_to(self) -> str | None:
        """The broker the listener's connection is up to now, as a URL
        without credentials; None while it is down (what the driver last
        found: no round trip), and once the server has stopped."""
        if self._connection is None:
            return None
        # The driver's pooled connection, its Connection (None once the
        # stopped listener gave it back), and kombu's.
        driver_connection = self._connection.connection
        if driver_connection is None:
            return None
        kombu_connection = driver_connection.connection
        if not kombu_connection.connected:
            return None
        return f"rabbit://{kombu_connection.hostname}:{kombu_connection.port}/"

    def connect_again(self) -> None:
        """The listener's connection made again, its queues, bindings and
        consumers declared anew (HostListener.connect_again), for a
        listener found deaf."""
        if self._listener is not None:
            self._listener.connect_again()

    def cast_own_heartbeat(self) -> None:
        """A cast of report_alive to this host's heartbeat queue: it wakes
        the listener that is being stopped, and shows the loop's watch
        that RPC reaches this agent. Sent once, never retried (a broker
        that is away cannot deliver it); raises what the send raised."""
        self._own_heartbeat.cast({}, "report_alive")


def make_server(conf: cfg.ConfigOpts, agent: HostAgent) -> HostServer:
    """The agent's server: the API's endpoint and the heartbeat's, for
    ``conf.host``; ``start()`` it beside the update loop, ``stop()`` and
    ``wait()`` on the way out."""
    allow_deep_messages()
    warn_of_unserved_calls()
    endpoints = [ComputeAgentEndpoint(agent, heartbeat.SourceFence(conf)),
                 HeartbeatEndpoint(agent, time.time(), conf.state_path)]
    server: HostServer = messaging.get_rpc_server(
        transport(conf), messaging.Target(topic=TOPIC, server=conf.host), endpoints,
        access_policy=messaging.ExplicitRPCAccessPolicy, server_cls=HostServer)
    return server


class ServerWatch:
    """The update loop's look at the broker, once a cycle, with no
    connection of its own (a kept one was an agent's third connection and
    its frames): the host server's listener connection as the driver last
    found it, and the server's own heartbeat, cast to itself at the look
    before, served since (any heartbeat served counts). A listener that is
    connected and given nothing (its queues' bindings gone, its consumers
    lost, its node hung) is deaf, said to be, and connected again. While
    the listener's connection is down, a login says why (the broker's own
    finding, as the commands get it); a broker that takes the login while
    the listener stays down for a second look is said so, a shorter gap (a
    connection cut and made again) is not an outage, nor the broker's
    return before the listener's. Nothing is looked at before the server
    serves (the start says it waits for the broker). ``timeout``: the
    login's."""

    def __init__(self, conf: cfg.ConfigOpts, timeout: float) -> None:
        self._conf = conf
        self._timeout = timeout
        self._server: HostServer | None = None
        self._served_at_cast: int | None = None
        self._down_looks = 0

    def serving(self, server: HostServer) -> None:
        """The server started: look at it from now on."""
        self._server, self._served_at_cast, self._down_looks = server, None, 0

    def probe(self) -> Probe | Unknown:
        server = self._server
        if server is None:
            return Unknown("not serving RPC yet")
        url = server.connected_to()
        if url is None:
            return self._listener_down()
        self._down_looks = 0
        served = server.heartbeat.served
        deaf = self._served_at_cast is not None and served == self._served_at_cast
        self._served_at_cast = served
        failure = self._cast(server)
        if failure is not None:
            self._served_at_cast = None
            # The listener may not have seen its connection end yet: a
            # broker that is gone is said as a login finds it, the same
            # line whichever the watch saw first.
            found = broker.probe(self._conf, self._timeout)
            if not login_taken(found):
                return found
            return Probe(Dependency.BROKER, url,
                         f"did not take a message ({broker.problem(failure)})")
        if deaf:
            server.connect_again()
        return Probe(Dependency.BROKER, url, DEAF if deaf else None)

    @staticmethod
    def _cast(server: HostServer) -> Exception | None:
        """The cast, sent again once: the first send after the broker's
        return meets the connection it closed, which the driver then
        makes again. The second failure, or None."""
        failure: Exception | None = None
        for _ in range(CAST_ATTEMPTS):
            try:
                with broker.driver_lines_quiet():
                    server.cast_own_heartbeat()
                return None
            except Exception as e:  # noqa: BLE001 - the broker's finding
                failure = e
        return failure

    def _listener_down(self) -> Probe | Unknown:
        self._served_at_cast = None
        found = broker.probe(self._conf, self._timeout)
        if login_taken(found):
            self._down_looks += 1
            if self._down_looks < LOOKS_BEFORE_LISTENER_DOWN:
                # Neither up nor down: a broker back from an outage is
                # back once the listener is, said once, not before it.
                return Unknown("the RPC server's connection is being made again")
            return Probe(Dependency.BROKER, found.url, LISTENER_DOWN)
        self._down_looks = 0
        return found

    def close(self) -> None:
        self._server = None


def login_taken(found: Probe | Unknown) -> TypeGuard[Probe]:
    """Whether a login to the broker (broker.probe) was taken: not
    refused, not unanswered, and tried (the transport can be asked)."""
    return isinstance(found, Probe) and found.problem is None


# Sends of the watch's cast before it says the broker did not take it.
CAST_ATTEMPTS = 2
# Looks in a row at a listener whose connection is down, the broker taking
# logins, before the watch says so: a cut connection is made again within
# a second or two.
LOOKS_BEFORE_LISTENER_DOWN = 2
LISTENER_DOWN = ("takes logins, but the RPC server's connection has been down since "
                 "the last cycle: calls do not reach this agent")
DEAF = ("delivered this agent nothing since the last cycle, not even its own heartbeat: "
        "connecting again")
