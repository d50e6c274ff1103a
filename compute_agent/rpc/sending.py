"""One RPC call that ends within its timeout whatever the broker does, for
every client of the agent's (the API conductors call, the heartbeat).

oslo.messaging retries a send for ever by default, blocking the caller
for as long as the broker is away, its timeout not yet started. A call
here sends once (no reconnection attempts: the driver's back-off would
sleep a second or more between them), and again after a pause, while its
timeout lasts. A client's first call opens the connection its answers
come back on, with no bound on its attempts: until then each call asks
the broker first (compute_agent/rpc/broker.py). A send is waited for to
its end, even past the call's timeout (a connection made again to a
broker that takes TCP but not yet AMQP waits out kombu's 5 s connect
timeout): a send given up could reach the agent after the caller's retry
and what followed it (a build after its delete). A call that waits longer
than WAIT_NOTICE_SECONDS says what it waits for, once, to whoever asked
(``on_wait``: compute-agent-ctl's stderr)."""
from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from kombu.exceptions import OperationalError
from oslo_config import cfg

from compute_agent.dependencies import Probe, describe
from compute_agent.messaging import messaging
from compute_agent.rpc import broker
from compute_agent.rpc.errors import BrokerDown, BrokerUnreachable

# The retries oslo.messaging makes of one send: none (see above).
SEND_RETRIES = 0
RESEND_PAUSE_SECONDS = 0.5
# A wait this long is told while it lasts.
WAIT_NOTICE_SECONDS = 3.0

# What a send that did not reach the broker raises: oslo.messaging's error
# once its attempts are spent, kombu's when the driver had no connection to
# the broker yet (the rabbit driver lets it through), or ours.
NOT_SENT = (messaging.MessageDeliveryFailure, OperationalError, BrokerDown)

Answer = TypeVar("Answer")


class WaitingFor(enum.Enum):
    BROKER = "broker"
    ANSWER = "answer"


@dataclass(frozen=True)
class Waiting:
    """What a call has waited for, for longer than WAIT_NOTICE_SECONDS."""

    what: WaitingFor
    host: str
    method: str
    left: float  # seconds until the call gives up
    problem: str = ""  # the broker's, as the probe or the send found it

    @property
    def line(self) -> str:
        gives_up = f"giving up in {math.ceil(self.left)}s"
        if self.what is WaitingFor.BROKER:
            return f"waiting for the message broker ({self.problem}); {gives_up}"
        return f"waiting for {self.host}'s answer to {self.method}; {gives_up}"


Notice = Callable[[Waiting], None]


class BoundedSender:
    """Sends the calls of one client. ``on_wait`` is told, once per call,
    what a call waits for once it has waited WAIT_NOTICE_SECONDS."""

    def __init__(self, conf: cfg.ConfigOpts, on_wait: Notice | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``clock`` and ``sleep``: a test's own."""
        self._conf = conf
        self._on_wait = on_wait
        self._clock = clock
        self._sleep = sleep
        self._answers_connected = False

    def call(self, host: str, method: str, timeout: float,
             send: Callable[[float], Answer]) -> Answer:
        """``send(seconds)``: the call, waiting at most that long for its
        answer once the broker took it. Raises BrokerUnreachable when no
        send reached the broker within ``timeout``."""
        started = self._clock()
        deadline = started + timeout
        notice = OneNotice(self._on_wait)
        while True:
            left = deadline - self._clock()
            try:
                if not self._answers_connected:
                    self._broker_answers(max(left, RESEND_PAUSE_SECONDS))
                waited = self._clock() - started
                with notice.unless_done_within(
                        max(WAIT_NOTICE_SECONDS - waited, 0),
                        lambda: Waiting(WaitingFor.ANSWER, host, method,
                                        deadline - self._clock())):
                    try:
                        return send(max(deadline - self._clock(), RESEND_PAUSE_SECONDS))
                    finally:
                        self._answers_connected = True
            except NOT_SENT as e:
                left = deadline - self._clock()
                if left <= 0:
                    raise BrokerUnreachable(
                        f"{method} to {host}: the message broker did not take it "
                        f"within {timeout:g}s ({e})") from None
                if self._clock() - started >= WAIT_NOTICE_SECONDS:
                    notice.tell(Waiting(WaitingFor.BROKER, host, method, left, str(e)))
            self._sleep(min(RESEND_PAUSE_SECONDS, max(left, 0)))

    def _broker_answers(self, timeout: float) -> None:
        answer = broker.probe(self._conf, timeout)
        if isinstance(answer, Probe) and answer.problem is not None:
            raise BrokerDown(describe(answer.dependency, answer.url, answer.problem))


class OneNotice:
    """What one call waits for, told at most once (to ``on_wait``)."""

    def __init__(self, on_wait: Notice | None) -> None:
        self._on_wait = on_wait
        self._lock = threading.Lock()
        self.told = False

    def tell(self, waiting: Waiting) -> None:
        with self._lock:
            if self.told or self._on_wait is None:
                return
            self.told = True
        self._on_wait(waiting)

    @contextmanager
    def unless_done_within(self, seconds: float, waiting: Callable[[], Waiting]
                           ) -> Iterator[None]:
        """Tells ``waiting()`` if the block still runs ``seconds`` from now."""
        if self.told or self._on_wait is None:
            yield
            return
        timer = threading.Timer(seconds, lambda: self.tell(waiting()))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
