"""oslo.messaging, set up once for the RPC server and for its client."""
from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
import types
import warnings

from oslo_config import cfg

from compute_agent import exception

LOG = logging.getLogger(__name__)

# oslo.messaging imports oslo.service, which imports eventlet, whose green
# DNS resolver (dnspython) only serves eventlet's green threads: the agent
# never runs one. Left out, every command starts in 0.4 s less CPU (1.31 s
# against 1.71 s to import the daemon, medians of 8 on the 2-vCPU machine).
os.environ.setdefault("EVENTLET_NO_GREENDNS", "yes")

with warnings.catch_warnings():
    # oslo.messaging imports oslo.service, whose eventlet backend warns when
    # imported. We never run it: the agent uses native threads.
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated",
                            module=r"oslo_service\.")
    import oslo_messaging as messaging
    from oslo_messaging import opts as _messaging_opts
    from oslo_messaging._metrics import client as _metrics
    from oslo_messaging._tracing import client as _tracing

TOPIC = "compute-agent"


def server_queue(topic: str, server: str) -> str:
    """The queue, and its routing key on the control exchange, of an RPC
    server of ``topic`` on ``server``: oslo.messaging's rabbit driver's
    name for it, which the agent's server keeps (rpc/host_server.py)."""
    return f"{topic}.{server}"

# The module our typed errors are named by on the wire. 0.3.0 and earlier
# installed them as agent.exception, and their callers rebuild only that
# name: for one release every agent sends that name (sent_as_before), and
# every caller takes both, the old one through accept_errors_sent_as_before.
# So an error keeps its type whichever side of a rolling upgrade is newer.
# The release after sends compute_agent.exception.
ERRORS_MODULE = "compute_agent.exception"
ERRORS_MODULE_BEFORE = "agent.exception"
ALLOWED_EXMODS = [ERRORS_MODULE, ERRORS_MODULE_BEFORE]
# oslo.messaging decodes a message recursively, in the thread that receives
# it, before any endpoint sees it. At Python's default recursion limit
# (1000) a message about as deep as a client at that same limit can send
# fails to decode and is dropped unanswered: its caller waits out its
# timeout. With this much room such a message is decoded, and the endpoint
# refuses its depth with an answer. A thread's stack (8 MiB) holds that
# depth of decoding several times over.
DECODE_DEPTH = 10_000
# Where, under the state directory, oslo.messaging's queue manager keeps
# its lock (lock_queue_names_in_state_path).
QUEUE_MANAGER_LOCKS = "oslo-locks"

upgrade_opts = [
    cfg.StrOpt(
        "compute_agent",
        help="Highest RPC API version this host's client sends, during a "
        "rolling upgrade: set it to the oldest agent's version (say 1.0) "
        "until every agent runs the new code.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    for group, opts in _messaging_opts.list_opts():
        conf.register_opts(opts, group=group)
    # The transport reads these groups on every call; oslo.messaging only
    # registers them on its global config, and we use private ones.
    conf.register_opts(_metrics.oslo_messaging_metrics, group="oslo_messaging_metrics")
    conf.register_opts(_tracing.oslo_messaging_tracing, group="oslo_messaging_tracing")
    conf.register_opts(upgrade_opts, group="upgrade_levels")


def allow_deep_messages() -> None:
    """Let the server decode any message nested up to DECODE_DEPTH."""
    if sys.getrecursionlimit() < DECODE_DEPTH:
        sys.setrecursionlimit(DECODE_DEPTH)


def bound_broker_waits(conf: cfg.ConfigOpts, seconds: float) -> None:
    """Every wait of this process on the broker's socket lasts at most
    ``seconds``, so a listener stops, and a transport closes, within that
    long of being asked. oslo.messaging's listener sees that it is stopped
    only between two such waits, each up to heartbeat_timeout_threshold /
    heartbeat_rate / 2 seconds (10 s by default, 5 s once idle): a stop
    waited that long for each listener. The price: a heartbeat frame (8
    bytes) every ``seconds`` * 2 on each connection. With heartbeats off,
    oslo.messaging waits 1 s at a time and that stays."""
    rabbit = conf.oslo_messaging_rabbit
    if rabbit.heartbeat_timeout_threshold > 0:
        conf.set_override("heartbeat_rate", max(rabbit.heartbeat_rate, math.ceil(
            rabbit.heartbeat_timeout_threshold / (2 * seconds))),
            group="oslo_messaging_rabbit")


def sent_as_before(error: Exception) -> Exception:
    """``error``, one of compute_agent.exception's, as 0.3.0's callers can
    rebuild it: oslo.messaging names an error on the wire by its class's
    module and name, so its class becomes a subclass named alike in
    ERRORS_MODULE_BEFORE (created once per class). Other errors as they
    are."""
    cls = type(error)
    if cls.__module__ != ERRORS_MODULE:
        return error
    error.__class__ = _before(cls)
    return error


_SENT_AS_BEFORE: dict[type, type] = {}


def _before(cls: type) -> type:
    if cls not in _SENT_AS_BEFORE:
        _SENT_AS_BEFORE[cls] = type(cls.__name__, (cls,), {"__module__": ERRORS_MODULE_BEFORE,
                                                           "__qualname__": cls.__qualname__})
    return _SENT_AS_BEFORE[cls]


def accept_errors_sent_as_before() -> None:
    """Let oslo.messaging rebuild an error named ERRORS_MODULE_BEFORE as
    ours: it imports the module the wire names, and nothing installs
    ``agent`` any more, so that name is bound to compute_agent.exception in
    this process. Not where a package of that name is installed (another
    distribution's): its errors stay RemoteError."""
    top = ERRORS_MODULE_BEFORE.partition(".")[0]
    if ERRORS_MODULE_BEFORE in sys.modules or _installed(top):
        return
    stand_in = types.ModuleType(top, "0.3.0's module path of compute_agent.exception, "
                                     "for errors sent by its agents")
    stand_in.exception = exception  # type: ignore[attr-defined]
    sys.modules[top] = stand_in
    sys.modules[ERRORS_MODULE_BEFORE] = exception


def _installed(top: str) -> bool:
    """A module or regular package of that name is importable (a bare
    directory of that name on the path, a namespace package, is not one)."""
    if top in sys.modules:
        return True
    spec = importlib.util.find_spec(top)
    return spec is not None and spec.origin is not None


def lock_queue_names_in_state_path(conf: cfg.ConfigOpts) -> None:
    """With use_queue_manager, oslo.messaging numbers a process's reply and
    fanout queues with a counter in /dev/shm/<hostname>_<processname>_qmanager,
    under an external lock of oslo.concurrency's. That lock's directory is
    read from oslo's global config only, which the agent (a config of its
    own) never fills: every start failed, RequiredOptError for
    [oslo_concurrency] lock_path. [oslo_messaging_rabbit] hostname is this
    host's name (compute_agent/config.py), so the one process sharing that
    counter is this host's agent: its lock goes in the state directory,
    unless the process's global config names a lock_path (a conductor's own
    service, say)."""
    if conf.oslo_messaging_rabbit.use_queue_manager:
        cfg.CONF.set_default("lock_path", os.path.join(conf.state_path, QUEUE_MANAGER_LOCKS),
                             group="oslo_concurrency")


def lead_a_process_group_when_its_leader_is_gone(conf: cfg.ConfigOpts) -> None:
    """With use_queue_manager, oslo.messaging reads the start time of the
    process group's leader (/proc/PGID/stat) each time it names a queue:
    in a process whose leader has exited (started with ``nohup ... &``
    from a script that has ended) every call failed, FileNotFoundError.
    Such a process has no terminal to share signals with: it leads a
    group of its own. One under systemd, or in a shell's foreground, is
    left as it is."""
    if not conf.oslo_messaging_rabbit.use_queue_manager:
        return
    leader = os.getpgrp()
    if leader and not os.path.exists(f"/proc/{leader}"):
        os.setpgid(0, 0)
        LOG.info("Process group %d's leader has exited: this process leads a group of its "
                 "own, for oslo.messaging's queue manager reads its leader", leader)


def name_reply_queues_at_random(conf: cfg.ConfigOpts) -> None:
    """For compute-agent-ctl, which runs once and calls as the conductors
    do: its reply queues take oslo.messaging's random names, whatever
    use_queue_manager says. The queue manager numbers names afresh in each
    process group, so two commands run from two shells both read their
    answers from reply_<host>:compute-agent-ctl:1 and took each other's.
    (compute-agent-manage device keeps the queue manager's names: it runs
    on the host, as the host's broker user, whose permissions allow those
    (compute_agent/rpc/bus_permissions.py).)"""
    conf.set_override("use_queue_manager", False, group="oslo_messaging_rabbit")


def transport(conf: cfg.ConfigOpts):
    accept_errors_sent_as_before()
    lock_queue_names_in_state_path(conf)
    lead_a_process_group_when_its_leader_is_gone(conf)
    return messaging.get_rpc_transport(conf, allowed_remote_exmods=ALLOWED_EXMODS)
