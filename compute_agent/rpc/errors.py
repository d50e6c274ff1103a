"""The RPC client's errors, raised in the caller's process: none is sent
back over RPC (those are compute_agent.exception's)."""
from __future__ import annotations

from compute_agent.exception import AgentError
from compute_agent.messaging import messaging


class BrokerDown(AgentError):
    """Before a client's first call: the broker did not take a connection."""


# The two below are also oslo.messaging's MessagingTimeout: callers catch
# them as the timeout they are (ask again, or report no answer), before any
# AgentError, which stands for an answer.
class BrokerUnreachable(AgentError, messaging.MessagingTimeout):
    """The request could not be handed to the broker within the call's
    timeout: a timeout like any other to a caller, which retries."""


class NoAnswer(AgentError, messaging.MessagingTimeout):
    """The call was sent and no answer came within its timeout: the agent
    may or may not have done it. Names the host and the method."""

    def __init__(self, host: str, method: str, timeout: float):
        super().__init__(f"{method} to {host}: no answer within {timeout:g}s")
        self.host = host
