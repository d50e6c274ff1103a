"""A caller's reply queue deleted on a RabbitMQ node of the test's own, its
cancel missed by the driver (as when oslo.messaging's heartbeat thread
reads it, and drops it): the caller finds the queue lost after a call that
got no answer, and has it declared again (compute_agent/rpc/replies.py).
Was: every later call unanswered, for good."""
from __future__ import annotations

import time

from amqp.channel import Channel

from compute_agent.cmd.common import load_config
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.errors import NoAnswer
from tests.functional.test_host_server import start_agent
from tests.waiting import wait_for


def answered(api: ComputeAgentAPI, host: str) -> bool:
    try:
        return bool(api.get_host_info(host))
    except NoAnswer:
        return False


def test_a_caller_that_missed_its_reply_queues_deletion_declares_it_again(
        tmp_path, placement, private_rabbitmq, monkeypatch):
    # The answer to the call sent while the queue was gone waits in the
    # agent's reply sending (oslo.messaging tries a missing reply queue for
    # up to 60 s), and a stop waits for it up to graceful_shutdown_timeout:
    # a short one, so that the stop below is within its wait.
    host, conf, log, agent = start_agent(tmp_path, placement.url, private_rabbitmq.url,
                                         graceful_shutdown_timeout=5)
    # The driver's connections in this process read a consumer's cancel,
    # and drop it.
    monkeypatch.setattr(Channel, "_on_basic_cancel", lambda self, tag: self._remove_tag(tag))
    api = ComputeAgentAPI(load_config(["--config-file", str(conf)]), timeout=5)
    try:
        assert answered(api, host)
        private_rabbitmq.delete_queue(api.client.transport._driver._reply_q)
        assert not answered(api, host)
        started = time.monotonic()
        wait_for(lambda: answered(api, host), timeout=60, interval=0)
        print(f"\nreply queue declared again, answered after {time.monotonic() - started:.1f} s")
    finally:
        api.close()
        agent.terminate()
        agent.wait(30)
