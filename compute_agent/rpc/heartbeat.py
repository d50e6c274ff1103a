"""Service heartbeat: whether a host's agent is up.

A host is **up** when its agent answers a heartbeat request within
``[DEFAULT] service_down_time`` seconds, and **down** when it has not
answered for that long. The request is an RPC call to the host on a topic
of its own (``compute-agent-heartbeat``): its own queue and its own
threads in the host's server (compute_agent/rpc/host_server.py), never
behind claims, rebuilds or Placement calls on the main topic, and it
touches neither the store nor Placement. So a host that is merely slow (busy with 64 rebuilds, its
Placement far away) still answers in milliseconds, while a dead agent's
request waits in its queue until the deadline passes.

Why a call, not a periodic report: we have no database for a report to
land in. Placement could hold one only by changing a provider (a trait,
an aggregate) every few seconds, which moves its generation and makes
every scheduler's claim on that host retry. A fanout of periodic reports
would reach every agent from every agent. A call costs nothing while
nobody asks, and the two who ask (a conductor or compute-agent-ctl before
an evacuation, and the evacuation's destination before it accepts) ask
right when they need the answer.
"""
from __future__ import annotations

import enum
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from oslo_config import cfg

from compute_agent.dependencies import Unknown
from compute_agent.exception import BrokerUnavailable, SourceHostUp
from compute_agent.messaging import messaging, server_queue, transport
from compute_agent.rpc import broker
from compute_agent.rpc.errors import BrokerUnreachable
from compute_agent.rpc.outstanding import OutstandingCalls
from compute_agent.rpc.replies import ReplyQueue
from compute_agent.rpc.sending import SEND_RETRIES, BoundedSender, Notice
from compute_agent.rpc.served import HeartbeatAgent

TOPIC = "compute-agent-heartbeat"
# How long the destination trusts a source found down. Short: the source
# checks for evacuated instances only when it starts, so a source back
# within this window could miss one that a later rebuild takes.
DOWN_VERDICT_SECONDS = 60.0
VERSION = "1.3"  # compute_agent/rpc/versions.py: report_alive appeared in 1.3
# What a call that gets no answer takes beyond its timeout: oslo.messaging's
# wait for the reply overruns it by up to about 50 ms (measured against
# RabbitMQ 3.10).
CALL_OVERRUN_SECONDS = 0.1
# A conductor's checks of many hosts in flight together, each a thread
# waiting on its answer.
CHECKS_AT_ONCE = 32


class HostState(str, enum.Enum):
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class Liveness:
    """One host, as one heartbeat request found it."""

    host: str
    state: HostState
    checked_at: float  # epoch seconds
    # What the agent answered (report_alive), None when it did not.
    report: dict | None = None

    @property
    def up(self) -> bool:
        return self.state is HostState.UP


def judge(host: str, answer: dict | None, checked_at: float) -> Liveness:
    """An answer, whatever it says, is a live agent; no answer within the
    deadline is a down one."""
    return Liveness(host, HostState.UP if answer is not None else HostState.DOWN,
                    checked_at, answer)


class HeartbeatEndpoint:
    """Served on TOPIC by every agent."""

    target = messaging.Target(version=VERSION)

    def __init__(self, agent: HeartbeatAgent, started_at: float, state_path: str):
        self._agent = agent
        self._started_at = started_at
        self._state_path = state_path
        self._machine = socket.gethostname()
        # Heartbeats served: the loop's watch of the server counts them.
        self.served = 0

    @messaging.expose
    def report_alive(self, ctxt) -> dict:
        """Since 1.3. This agent is alive: its host, its clock, since when
        it runs, and how many instances it holds (in memory: no store).
        Also, for an agent that finds this one serving its host at start
        (compute_agent/daemon/one_agent.py): its root provider, state path and
        machine (older agents leave them out)."""
        self.served += 1
        return {"host": self._agent.policy.host, "time": time.time(),
                "started_at": self._started_at,
                "instances": self._agent.manager.tracker.instance_count(),
                "root_uuid": self._agent.policy.root_uuid, "state_path": self._state_path,
                "machine": self._machine}


def agent_serving(conf: cfg.ConfigOpts, host: str, deadline: float) -> dict | Unknown | None:
    """What an agent serving ``host`` now answers to report_alive, None
    when none answers, Unknown when the broker cannot be asked: at most
    ``deadline`` seconds in all. The broker says first how many consumers
    the host's heartbeat queue has: with none (or no queue) nobody can
    answer, which is known at once. Otherwise the question is asked for
    real, and a consumer that does not answer in time is nobody: what the
    broker keeps of an agent whose machine died, until it finds its
    connection gone. An error answered is an agent all the same."""
    started = time.monotonic()
    listening = broker.consumers(conf, server_queue(TOPIC, host), deadline)
    if isinstance(listening, Unknown):
        return listening
    if listening == 0:
        return None
    left = max(deadline - (time.monotonic() - started) - CALL_OVERRUN_SECONDS, 0.1)
    client = messaging.get_rpc_client(
        transport(conf), messaging.Target(topic=TOPIC, version=VERSION, server=host),
        timeout=left, retry=0)
    try:
        return client.call({}, "report_alive")
    except messaging.MessagingTimeout:
        return None
    except messaging.RemoteError:
        return {}
    except messaging.MessagingException as e:
        return Unknown(f"the broker did not take the question ({type(e).__name__}: {e})")
    finally:
        # Closing waits out the reply listener's poll (40 to 200 ms): not
        # on the start's path.
        threading.Thread(target=broker.close_client, args=(conf, client),
                         name="heartbeat-probe-close", daemon=True).start()


class Heartbeat:
    """Asks hosts whether they are alive; ``down_after`` is
    service_down_time. A check ends within ``down_after`` whatever the
    broker does (rpc/sending.py): when the broker did not take the question
    in that time, it raises BrokerUnreachable, for nothing was asked and
    nothing is known of the host."""

    def __init__(self, conf, down_after: float | None = None,
                 outstanding: OutstandingCalls | None = None,
                 on_wait: Notice | None = None):
        """``outstanding``: a watchdog's, which then sees these calls too;
        ``on_wait``: told what a long check waits for."""
        self._conf = conf
        self.down_after = float(down_after or conf.service_down_time)
        self.outstanding = outstanding or OutstandingCalls()
        self._sender = BoundedSender(conf, on_wait)
        self._client = messaging.get_rpc_client(
            transport(conf), messaging.Target(topic=TOPIC, version=VERSION),
            timeout=self.down_after, retry=SEND_RETRIES)
        self._replies = ReplyQueue(conf, self._client)

    def close(self) -> None:
        """Close the connection; delete the reply queue, if it called."""
        self._replies.close()

    def answers_lost(self) -> bool:
        """Whether answers to this client's questions are dropped now (its
        reply queue lost: compute_agent/rpc/replies.py): silence is then
        no verdict."""
        return self._replies.lost()

    def check(self, host: str) -> Liveness:
        """Raises BrokerUnreachable when the question was not asked."""
        checked_at = time.time()

        def ask(seconds: float) -> dict | None:
            try:
                answer: dict = self._client.prepare(server=host, timeout=seconds).call(
                    {}, "report_alive")
                return answer
            except messaging.MessagingTimeout:
                return None

        with self.outstanding.one(self.down_after):
            answer = self._sender.call(host, "report_alive", self.down_after, ask)
        return judge(host, answer, checked_at)

    def check_many(self, hosts: list[str]) -> dict[str, Liveness]:
        """Every host, CHECKS_AT_ONCE at a time: one deadline for each
        CHECKS_AT_ONCE hosts that do not answer."""
        if not hosts:
            return {}
        with ThreadPoolExecutor(max_workers=min(CHECKS_AT_ONCE, len(hosts))) as pool:
            return dict(zip(hosts, pool.map(self.check, hosts)))


class SourceFence:
    """The evacuation destination's check that the source is down, asked
    once per source however many rebuilds arrive together: the first asks,
    the others wait for its answer. A down verdict stands for
    DOWN_VERDICT_SECONDS, so that an evacuation's hundred rebuilds wait
    out the deadline once, not once per ``down_after``; an up one is never
    reused. Each check has a client of its own (a connection to the broker
    and a reply queue), closed after it, its reply queue deleted: a
    destination keeps none between evacuations. ``heartbeats``: makes
    that client (a test's own)."""

    def __init__(self, conf: cfg.ConfigOpts,
                 heartbeats: Callable[[], Heartbeat] | None = None) -> None:
        self._heartbeats = heartbeats or (lambda: Heartbeat(conf))
        self._lock = threading.Lock()
        self._asking: dict[str, threading.Lock] = {}
        self._down_at: dict[str, float] = {}

    def require_down(self, host: str) -> None:
        """Return when ``host`` is down; raise SourceHostUp when it answers,
        BrokerUnavailable when the question could not be asked, or its
        answer could not come back (Heartbeat.answers_lost)."""
        with self._lock:
            asking = self._asking.setdefault(host, threading.Lock())
        with asking:
            seen = self._down_at.get(host)
            if seen is not None and time.monotonic() - seen < DOWN_VERDICT_SECONDS:
                return
            heartbeat = self._heartbeats()
            try:
                found = heartbeat.check(host)
                # Asked before the client closes, which deletes the queue.
                deaf = not found.up and heartbeat.answers_lost()
            except BrokerUnreachable:
                raise BrokerUnavailable("", f"did not take the heartbeat question to {host} "
                                        f"within {heartbeat.down_after:g}s: whether it is "
                                        "down is unknown") from None
            finally:
                # Closing waits out the reply listener's poll: not on the
                # rebuild's path.
                threading.Thread(target=heartbeat.close, name="fence-close",
                                 daemon=True).start()
            if found.up:
                self._down_at.pop(host, None)
                raise SourceHostUp(host, heartbeat.down_after)
            if deaf:
                raise BrokerUnavailable("", f"dropped the answers to the heartbeat question "
                                        f"to {host} (its reply queue lost): whether it is "
                                        "down is unknown")
            self._down_at[host] = time.monotonic()
