"""A caller's reply queue, found lost and mended.

oslo.messaging's rabbit driver declares a caller's reply queue with the
caller's first call, and again whenever it makes the connection the
answers come on again. A reply queue deleted under a caller (by hand, by
a policy, with a node) makes the broker cancel its consumer, and the
driver, reading that cancel, makes its connection again: the queue is
back within about a second. Unless the driver's heartbeat thread reads
the cancel: it reads every connection every few seconds, and drops
whatever it does not expect there (impl_rabbit's _heartbeat_thread_job,
oslo.messaging 18). The queue is then never declared again, every answer
to the caller is dropped, and the caller is deaf for good (seen in
tests/cluster, in one run of four). The same befalls an RPC server's
queues; the agent's watch mends those (compute_agent/rpc/host_server.py).

So after a call that got no answer, a caller asks the broker whether its
reply queue still has its consumer (ReplyQueue.lost), and when not, cuts
the connection its answers come on, which the driver makes again with the
queue declared anew (ReplyQueue.mend): the next call is answered.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from oslo_config import cfg

from compute_agent.dependencies import Unknown
from compute_agent.rpc import broker

LOG = logging.getLogger(__name__)
# How long the broker is given to say whether the reply queue has its
# consumer: a broker that does not answer by then leaves it as it is.
PROBE_SECONDS = 2.0
# How long a mend waits for the connection to be made again (a connection
# and a declare, after the driver's reconnect delay), and how often it asks
# the broker meanwhile.
MADE_AGAIN_SECONDS = 30.0
MADE_AGAIN_LOOK_SECONDS = 0.5


def cut(context: Any) -> None:
    """The driver's connection that ``context`` holds cut, as a network
    cuts it, from any thread: its socket shut down both ways. The thread
    that polls it (which holds the driver's lock while it waits, so that
    another thread waits long for it) reads the end, makes the connection
    again and declares its consumers on it. A connection with no socket
    (kombu's in-memory transport, a connection not made yet) is left."""
    transport = getattr(context.connection.connection.connection, "transport", None)
    sock = getattr(transport, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed meanwhile: cut already
            pass


class ReplyQueue:
    """The reply queue of ``client`` (an oslo.messaging RPC client), once
    it has called."""

    def __init__(self, conf: cfg.ConfigOpts, client: Any,
                 timeout: float = PROBE_SECONDS) -> None:
        self._conf = conf
        self._client = client
        self._timeout = timeout
        self._mending = threading.Lock()
        self._closed = threading.Event()

    @property
    def _driver(self) -> Any:
        return self._client.transport._driver

    def lost(self) -> bool:
        """Whether the broker says the reply queue has no consumer (or is
        gone): answers sent to it do not reach the client. False before
        the first call, and when the broker cannot be asked."""
        name = getattr(self._driver, "_reply_q", None)  # oslo.messaging's, once it called
        if name is None:
            return False
        count = broker.consumers(self._conf, name, self._timeout)
        return not isinstance(count, Unknown) and count == 0

    def mend(self) -> None:
        """After a call that got no answer: the reply connection dropped,
        to be made again with its queue, when the queue is ``lost``; then
        the wait until it is made again. One mend at a time, and none
        while the connection is made again: a call that timed out then
        would find the queue still without its consumer, and drop the
        connection once more, and the answers to the calls in flight."""
        if not self._mending.acquire(blocking=False):
            return
        try:
            name = getattr(self._driver, "_reply_q", None)
            connection = getattr(self._driver, "_reply_q_conn", None)
            if name is None or connection is None or not self.lost() or self._closed.is_set():
                return
            LOG.warning("The reply queue %s has no consumer: answers to this client are "
                        "dropped; connecting again, which declares it anew", name)
            cut(connection)
            deadline = time.monotonic() + MADE_AGAIN_SECONDS
            while (not self._closed.is_set() and self.lost()
                   and time.monotonic() < deadline):
                time.sleep(MADE_AGAIN_LOOK_SECONDS)
        finally:
            self._mending.release()

    def close(self) -> None:
        """The client closed, and its reply queue deleted
        (broker.close_client): no mend goes on after, which would take the
        deleted queue for lost (a ctl command that timed out said so, and
        a mend's thread failed on the closed driver's connection)."""
        self._closed.set()
        broker.close_client(self._conf, self._client)

    def mend_in_background(self) -> None:
        """``mend`` in a thread of its own: the caller's timeout is not
        made longer by the broker's answer."""
        threading.Thread(target=self.mend, name="reply-queue-mend", daemon=True).start()
