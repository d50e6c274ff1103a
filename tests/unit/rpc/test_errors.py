"""The RPC client's own errors (compute_agent/rpc/errors.py): what each
says, and which a caller catches as oslo.messaging's timeout (asked again,
or reported as no answer) rather than as an answer."""
from __future__ import annotations

import pytest

from compute_agent.exception import AgentError
from compute_agent.messaging import messaging
from compute_agent.rpc.errors import BrokerDown, BrokerUnreachable, NoAnswer


@pytest.mark.parametrize("timeout, said", [(30, "30s"), (60.0, "60s"), (0.5, "0.5s"),
                                           (2.25, "2.25s")])
def test_no_answer_names_the_method_the_host_and_the_timeout_as_written(timeout, said):
    error = NoAnswer("compute-7", "rebuild_instance", timeout)
    assert str(error) == f"rebuild_instance to compute-7: no answer within {said}"
    assert error.host == "compute-7"


def caught_as(error: Exception) -> str:
    """Which handler of a conductor's catches ``error``: a timeout is
    caught before any AgentError, which stands for an answer."""
    try:
        raise error
    except messaging.MessagingTimeout:
        return "timeout"
    except AgentError:
        return "answer"


@pytest.mark.parametrize("error, caught", [
    (NoAnswer("h1", "get_instance", 30), "timeout"),
    (BrokerUnreachable("get_instance to h1: the message broker did not take it"),
     "timeout"),
    # Before any call: nothing was sent, and the client says so; no retry
    # of a timeout would help.
    (BrokerDown("the message broker at rabbit://h did not answer"), "answer"),
])
def test_only_the_errors_of_a_call_without_answer_are_timeouts(error, caught):
    assert caught_as(error) == caught
    assert isinstance(error, AgentError)
