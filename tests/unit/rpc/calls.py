"""The RPC calls as the unit tests make them: valid payloads, and the
endpoint (compute_agent/rpc/server.py) over a manager that records each
call, called as oslo.messaging's dispatcher calls it. Used by the
endpoint's, the payloads', the client's and the conductor's tests."""
from __future__ import annotations

import threading

from compute_agent.messaging import messaging
from compute_agent.rpc.server import ComputeAgentEndpoint

SPEC = {"name": "guest", "vcpus": 2, "memory_mb": 1024}
INSTANCE = "3f1c2a44-5b6d-4e7f-8a9b-0c1d2e3f4a5b"
MIGRATION = "9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4"
PROVIDER = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"
# What SPEC's vcpus and memory_mb are allocated as.
RESOURCES = {"VCPU": 2, "MEMORY_MB": 1024}
ALLOCATIONS = {PROVIDER: {"resources": RESOURCES}}


class RecordingManager:
    """Records each call; raises ``error`` when one is set."""

    def __init__(self, error: BaseException | None = None):
        self.calls: list[tuple] = []
        self.error = error
        # Notified at each call: a call made in another thread is waited for.
        self.called = threading.Condition()

    def __getattr__(self, name):
        def call(*args):
            with self.called:
                self.calls.append((name, *args))
                self.called.notify_all()
            if self.error is not None:
                raise self.error
            return {"called": name}
        return call


class AgentWith:
    def __init__(self, manager):
        self.manager = manager


class Served:
    """An endpoint's calls as the dispatcher makes them: an error marked
    expected is unwrapped, as it is before it is sent to the caller."""

    def __init__(self, error: BaseException | None = None):
        self.endpoint = ComputeAgentEndpoint(AgentWith(RecordingManager(error)))
        self.calls = self.endpoint._agent.manager.calls

    def __getattr__(self, name):
        def call(*args, **kwargs):
            try:
                return getattr(self.endpoint, name)(*args, **kwargs)
            except messaging.ExpectedException as e:
                raise e.exc_info[1] from None
        return call


def endpoint(error: BaseException | None = None) -> Served:
    return Served(error)



def exposed(e: ComputeAgentEndpoint) -> dict[str, str]:
    """The calls the server serves, each with its version."""
    policy = messaging.ExplicitRPCAccessPolicy()
    return {name: getattr(e, name).since for name in dir(e) if policy.is_allowed(e, name)}
