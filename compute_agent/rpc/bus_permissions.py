"""The RabbitMQ permissions of one host's agent: what it needs to serve its
own queues, answer its callers, ask its own and other hosts' heartbeat, and
nothing more (``compute-agent-manage bus-permissions HOST`` prints them).
No I/O: names in, regular expressions out.

RabbitMQ checks a user's action against three regular expressions on
resource names (queues and exchanges alike) and, on a topic exchange,
two on routing keys:

- configure: declare or delete a queue or an exchange;
- write: publish to an exchange, bind a queue (the queue's name);
- read: consume from a queue, bind from an exchange (the exchange's name);
- topic write: publish to that exchange with a routing key;
- topic read: bind a queue to that exchange with a routing key.

Each expression is searched for in the name (``re:run``, unanchored), so
each here is anchored, ``^(...)$``, and every literal part escaped.

What the agent does on the bus, after oslo.messaging's rabbit driver
(oslo_messaging/_drivers/amqpdriver.py ``listen``, ``_send``,
``_get_reply_q``; impl_rabbit.py ``declare_*_consumer``, ``direct_send``,
``topic_send``, ``RabbitDriver._get_reply_queue_name``):

- Its one RPC server (compute_agent/rpc/host_server.py) declares the
  control exchange (a topic exchange, ``[DEFAULT] control_exchange``) and
  the host's two queues, ``<topic>.<host>`` for topics messaging.TOPIC and
  heartbeat.TOPIC, each bound to the control exchange by its own name.
  (oslo.messaging's own servers also declared the topic's shared queue and
  a fanout exchange and queue: the agent's does not.)
- It answers a call on the default exchange (``amq.default`` to
  permissions) with the caller's reply queue as routing key.
- It calls a host's heartbeat (the evacuation's fence, another host's; the
  check that no other agent serves its host, its own) and its own agent
  (``compute-agent-manage device`` on the host): a publish to the control
  exchange with routing key ``<topic>.<host>``, the answer on a reply
  queue of its own, ``reply_<uuid>``, or ``reply_<hostname>:<process>:<n>``
  with ``use_queue_manager``.
- Passive declares (the count of a
  heartbeat queue's consumers): RabbitMQ checks no permission for them.

The default exchange, which the agent must write to for its answers,
routes to any queue by its name: the agent drops a request that did not
come through the control exchange (host_server.py). What such permissions
cannot refuse is in docs/install.md, "A broker user per host".
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from oslo_config import cfg

from compute_agent.messaging import TOPIC as AGENT_TOPIC
from compute_agent.messaging import server_queue
from compute_agent.rpc.heartbeat import TOPIC as HEARTBEAT_TOPIC

# The topics the agent serves.
SERVED_TOPICS = (AGENT_TOPIC, HEARTBEAT_TOPIC)
# What permissions call the default exchange (AMQP's nameless one).
DEFAULT_EXCHANGE = "amq.default"
# uuid.uuid4().hex, which names reply queues by default.
UUID_HEX = "[0-9a-f]{32}"
# What the queue manager (use_queue_manager) appends to its hostname: the
# process's name ([oslo_messaging_rabbit] processname, by default the
# command's) and a counter.
PROCESS_AND_COUNTER = ":[^:]+:[0-9]+"
# The characters a PCRE (RabbitMQ's) and Python's re give a meaning outside
# a character class.
_METACHARACTERS = re.compile(r"([\\^$.|?*+()\[\]{}])")


def escape(text: str) -> str:
    """``text`` as a regular expression that matches it and only it."""
    return _METACHARACTERS.sub(r"\\\1", text)


@dataclass(frozen=True)
class Names:
    """Names a permission covers: one name, or a family of them."""

    pattern: str  # a regular expression that matches exactly these names
    shown: str  # the same for a reader: <uuid>, <any host>

    @classmethod
    def exactly(cls, name: str) -> Names:
        return cls(escape(name), name)

    @classmethod
    def prefixed(cls, prefix: str, rest: str, rest_shown: str) -> Names:
        """``prefix`` as it is, then what the regular expression ``rest`` matches."""
        return cls(escape(prefix) + rest, prefix + rest_shown)


def anchored(names: Iterable[Names]) -> str:
    """One regular expression that matches a whole name of ``names``, and
    nothing else."""
    return "^(" + "|".join(n.pattern for n in names) + ")$"


@dataclass(frozen=True)
class QueueNaming:
    """The settings oslo.messaging's rabbit driver names queues and
    exchanges by."""

    control_exchange: str
    use_queue_manager: bool = False  # [oslo_messaging_rabbit] use_queue_manager


def queue_naming(conf: cfg.ConfigOpts) -> QueueNaming:
    return QueueNaming(conf.control_exchange, conf.oslo_messaging_rabbit.use_queue_manager)


@dataclass(frozen=True)
class TopicPermission:
    """Routing keys on one topic exchange."""

    exchange: str
    write: tuple[Names, ...]  # publish with
    read: tuple[Names, ...]  # bind a queue with

    def as_dict(self) -> dict[str, str]:
        return {"exchange": self.exchange, "write": anchored(self.write),
                "read": anchored(self.read)}


@dataclass(frozen=True)
class BusPermissions:
    configure: tuple[Names, ...]
    write: tuple[Names, ...]
    read: tuple[Names, ...]
    topic: tuple[TopicPermission, ...]

    def as_dict(self) -> dict[str, object]:
        """As ``rabbitmqctl set_permissions`` and ``set_topic_permissions``
        take them."""
        return {"configure": anchored(self.configure), "write": anchored(self.write),
                "read": anchored(self.read),
                "topic": [t.as_dict() for t in self.topic]}


def _reply_queue(host: str, naming: QueueNaming) -> Names:
    if naming.use_queue_manager:
        return Names.prefixed(f"reply_{host}", PROCESS_AND_COUNTER, ":<process>:<n>")
    return Names.prefixed("reply_", UUID_HEX, "<uuid>")


def bus_permissions(host: str, naming: QueueNaming) -> BusPermissions:
    """What ``host``'s agent may do on the bus: serve and bind its two
    queues, declare the control exchange they are bound to, publish its
    answers and its calls of heartbeats (any host's) and of its own agent,
    read its answers. With ``use_queue_manager`` its queue manager's
    hostname ([oslo_messaging_rabbit] hostname) is ``host``."""
    own = tuple(Names.exactly(server_queue(t, host)) for t in SERVED_TOPICS)
    reply = (_reply_queue(host, naming),)
    control = (Names.exactly(naming.control_exchange),)
    # The heartbeat's server queue of any host (its name but the host's).
    calls = (Names.prefixed(server_queue(HEARTBEAT_TOPIC, ""), ".+", "<any host>"),
             Names.exactly(server_queue(AGENT_TOPIC, host)))
    return BusPermissions(
        configure=own + reply + control,
        write=own + control + (Names.exactly(DEFAULT_EXCHANGE),),
        read=own + reply + control,
        topic=(TopicPermission(naming.control_exchange, write=calls, read=own),))
