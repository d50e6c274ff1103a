"""One host's RabbitMQ permissions (compute_agent/rpc/bus_permissions.py),
held to what oslo.messaging's rabbit driver really does for the agent:
its RPC server, its calls of a heartbeat and of its own agent, and its
answers, run on kombu's in-memory transport, each AMQP method it sends
taken as RabbitMQ checks it. Then the names of other hosts, which the
permissions must refuse. (On a real broker, with real users:
tests/functional/test_bus_permissions.py.)"""
from __future__ import annotations

import functools
import inspect
import os
import re
import string
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from kombu.transport import virtual
from oslo_concurrency import lockutils
from oslo_config import cfg
from oslo_messaging._drivers import amqpdriver

from compute_agent import config
from compute_agent.messaging import TOPIC
from compute_agent.rpc import heartbeat, host_server
from compute_agent.rpc.bus_permissions import (
    DEFAULT_EXCHANGE,
    QueueNaming,
    bus_permissions,
    escape,
    queue_naming,
)
from compute_agent.rpc.client import ComputeAgentAPI

HOST = "h.1"  # a dot: a regular expression's metacharacter in a host name
NAMINGS = {"default": QueueNaming("openstack"),
           "queue manager": QueueNaming("openstack", use_queue_manager=True),
           "own exchange": QueueNaming("cloud.rpc")}


@dataclass(frozen=True)
class Check:
    """One check RabbitMQ makes of a user: ``permission`` (configure,
    write, read; or topic write, topic read on ``exchange``) on ``name``
    (a queue or exchange, or a routing key)."""

    permission: str
    name: str
    exchange: str = ""


def allows(permissions: dict, check: Check) -> bool:
    """As RabbitMQ judges: the expression searched for in the name, not
    matched whole; on an exchange with no topic permission, every key."""
    if not check.permission.startswith("topic "):
        return re.search(permissions[check.permission], check.name) is not None
    on = [t for t in permissions["topic"] if t["exchange"] == check.exchange]
    kind = check.permission.removeprefix("topic ")
    return not on or re.search(on[0][kind], check.name) is not None


class Recorder:
    """The checks the AMQP methods sent on kombu's virtual channels call
    for: passive declares call for none; publishing to the nameless
    default exchange is a write on amq.default."""

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.types: dict[str, str] = {}  # exchange -> its type, as declared

    def exchange_declare(self, exchange: str, type: str = "direct", passive: bool = False,
                         **_) -> None:
        if not passive:
            self.types[exchange] = type
            self.checks.append(Check("configure", exchange))

    def queue_declare(self, queue: str, passive: bool = False, **_) -> None:
        if not passive:
            self.checks.append(Check("configure", queue))

    def queue_bind(self, queue: str, exchange: str, routing_key: str = "", **_) -> None:
        self.checks += [Check("write", queue), Check("read", exchange)]
        if self.types.get(exchange) == "topic":
            self.checks.append(Check("topic read", routing_key, exchange))

    def basic_publish(self, message, exchange: str, routing_key: str, **_) -> None:
        self.checks.append(Check("write", exchange or DEFAULT_EXCHANGE))
        if self.types.get(exchange) == "topic":
            self.checks.append(Check("topic write", routing_key, exchange))

    def basic_consume(self, queue: str, **_) -> None:
        self.checks.append(Check("read", queue))

    def queue_delete(self, queue: str, **_) -> None:
        self.checks.append(Check("configure", queue))

    def install(self, monkeypatch) -> None:
        for method in ("exchange_declare", "queue_declare", "queue_bind", "basic_publish",
                       "basic_consume", "queue_delete"):
            sent = getattr(virtual.Channel, method)
            monkeypatch.setattr(virtual.Channel, method, self._recording(sent, method))

    def _recording(self, sent, method: str):
        signature = inspect.signature(sent)
        record = getattr(self, method)

        @functools.wraps(sent)
        def recorded(channel, *args, **kwargs):
            bound = signature.bind(channel, *args, **kwargs)
            bound.apply_defaults()
            record(**{k: v for k, v in bound.arguments.items()
                      if k not in ("self", "kwargs")}, **bound.arguments.get("kwargs", {}))
            return sent(channel, *args, **kwargs)
        return recorded


@pytest.fixture
def recorder(monkeypatch, tmp_path, memory_broker):
    """An empty in-memory broker whose every check is recorded. The queue
    manager's counter is kept under an oslo.concurrency lock, whose
    directory is oslo.concurrency's own global option."""
    lockutils.CONF.set_override("lock_path", str(tmp_path), group="oslo_concurrency")
    # The queue manager tells a restart by its process group leader's
    # start time, in /proc: a test worker's leader may be gone.
    monkeypatch.setattr(amqpdriver.QManager, "_service_identity",
                        staticmethod(lambda: (os.getpid(), 0)))
    found = Recorder()
    found.install(monkeypatch)
    yield found
    lockutils.CONF.clear_override("lock_path", group="oslo_concurrency")
    queue_manager_counter(tmp_path.name).unlink(missing_ok=True)


def queue_manager_counter(processname: str) -> Path:
    """Where the queue manager counts the names it gave (amqpdriver.QManager)."""
    return Path(f"/dev/shm/{HOST}_{processname}_qmanager")


def agent_conf(naming: QueueNaming, processname: str) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf([])
    conf.set_override("host", HOST)
    conf.set_override("transport_url", "kombu+memory:////")
    conf.set_override("control_exchange", naming.control_exchange)
    # With the queue manager's counter a file of the test's own.
    rabbit = {"use_queue_manager": naming.use_queue_manager,
              "hostname": HOST, "processname": processname}
    for name, value in rabbit.items():
        conf.set_override(name, value, group="oslo_messaging_rabbit")
    return conf


def served_agent() -> types.SimpleNamespace:
    """What the two endpoints read of the agent, for the calls made here."""
    return types.SimpleNamespace(
        policy=types.SimpleNamespace(host=HOST, root_uuid="root"),
        sync=types.SimpleNamespace(root_uuid="root"), last_tree={},
        manager=types.SimpleNamespace(tracker=types.SimpleNamespace(
            instance_count=lambda: 0, snapshot=lambda: ({}, [], None))))


def agent_on_the_bus(conf: cfg.ConfigOpts) -> None:
    """What an agent does on the bus: its two servers start; it asks its
    own heartbeat (at start, that no other agent serves its host) and
    its own agent (compute-agent-manage device on the host), and answers
    both; it asks another host's heartbeat (the evacuation's fence),
    which nobody answers; it stops."""
    server = host_server.make_server(conf, served_agent())
    server.start()
    beat = heartbeat.Heartbeat(conf, down_after=5)
    api = ComputeAgentAPI(conf, timeout=5)
    try:
        assert beat.check(HOST).up
        assert api.get_host_info(HOST)["host"] == HOST
        assert not heartbeat.Heartbeat(conf, down_after=0.05).check("other-host").up
    finally:
        api.close()
        beat.close()
        server.stop()
        server.wait()


@pytest.mark.parametrize("naming", NAMINGS.values(), ids=NAMINGS.keys())
def test_every_check_of_what_the_agent_does_on_the_bus_passes(recorder, naming, tmp_path):
    agent_on_the_bus(agent_conf(naming, tmp_path.name))
    permissions = bus_permissions(HOST, naming).as_dict()
    refused = [c for c in recorder.checks if not allows(permissions, c)]
    assert refused == []
    # What it did, in brief: the run above did all it says.
    made = {(c.permission, c.name) for c in recorder.checks}
    assert {("write", DEFAULT_EXCHANGE), ("topic write", "compute-agent-heartbeat.other-host"),
            ("topic write", f"{TOPIC}.{HOST}"), ("topic read", f"{TOPIC}.{HOST}"),
            ("read", f"{TOPIC}.{HOST}"), ("configure", naming.control_exchange)} <= made
    assert any(p == "read" and n.startswith("reply_") for p, n in made)
    assert not any(n.startswith(f"{TOPIC}_fanout") for _, n in made)  # none declared


def test_the_names_follow_the_config():
    conf = agent_conf(NAMINGS["queue manager"], "compute-agent")
    assert queue_naming(conf) == NAMINGS["queue manager"]
    conf.set_override("control_exchange", "cloud.rpc")
    assert queue_naming(conf) == QueueNaming("cloud.rpc", True)


# Hosts whose names are HOST's but for one character, or HOST's with more
# before or after: each is another host.
OTHERS = ["h.2", "hx1", "h.10", "h.1.x", "xh.1", "h", "h.1-x"]


def another_hosts_own(other: str, exchange: str) -> list[Check]:
    """What only ``other``'s agent may do: declare, bind and read its
    server queues, declare and read its reply queue as the queue manager
    names it; call its agent, and bind its server queues."""
    bound = [f"{TOPIC}.{other}", f"compute-agent-heartbeat.{other}"]
    return ([Check(p, q) for q in bound for p in ("configure", "write", "read")]
            + [Check(p, f"reply_{other}:compute-agent:1") for p in ("configure", "read")]
            + [Check("topic write", f"{TOPIC}.{other}", exchange)]
            + [Check("topic read", q, exchange) for q in bound])


@pytest.mark.parametrize("naming", NAMINGS.values(), ids=NAMINGS.keys())
@pytest.mark.parametrize("other", OTHERS)
def test_nothing_of_another_hosts_own_is_allowed(naming, other):
    permissions = bus_permissions(HOST, naming).as_dict()
    allowed = [c for c in another_hosts_own(other, naming.control_exchange)
               if allows(permissions, c)]
    assert allowed == []


@pytest.mark.parametrize("naming", NAMINGS.values(), ids=NAMINGS.keys())
def test_its_own_are_allowed_as_another_host_is_refused_them(naming):
    """The test above can fail: HOST's own names, the same checks, pass."""
    permissions = bus_permissions(HOST, naming).as_dict()
    own = [c for c in another_hosts_own(HOST, naming.control_exchange)
           if naming.use_queue_manager or ":" not in c.name]
    assert own and all(allows(permissions, c) for c in own)


@pytest.mark.parametrize("naming", NAMINGS.values(), ids=NAMINGS.keys())
def test_it_calls_no_agent_but_its_own_and_no_topic_every_agent_shares(naming):
    """A call to the shared topic, or a fanout, reaches any agent or every
    one."""
    permissions = bus_permissions(HOST, naming).as_dict()
    exchange = naming.control_exchange
    assert not allows(permissions, Check("topic write", TOPIC, exchange))
    assert not allows(permissions, Check("topic write", "compute-agent-heartbeat", exchange))
    assert not allows(permissions, Check("write", f"{TOPIC}_fanout"))
    assert not allows(permissions, Check("write", "openstack")) or exchange == "openstack"
    assert allows(permissions, Check("topic write", "compute-agent-heartbeat.h.2", exchange))


def test_each_character_escaped_matches_itself_and_nothing_else():
    for char in string.printable:
        assert re.fullmatch(escape(char), char), char
        assert [c for c in string.printable if re.fullmatch(escape(char), c)] == [char]
    assert escape("compute-agent.h_1") == r"compute-agent\.h_1"
