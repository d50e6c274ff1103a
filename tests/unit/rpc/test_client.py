"""The client conductors import: each call sent at the version it appeared
in, and refused before it is sent when the version cap is lower; a call
not answered NoAnswer; a call outstanding while it waits. (Its sends,
bounded: test_sending.py; through the real RabbitMQ:
tests/functional/test_rpc.py.)"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.exception import VersionCapped
from compute_agent.messaging import messaging
from compute_agent.rpc import versions as rpc_versions
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.errors import NoAnswer
from compute_agent.rpc.outstanding import OutstandingCalls, Overdue
from tests.unit.clocks import FakeClock
from tests.unit.rpc.calls import ALLOCATIONS, INSTANCE, MIGRATION, SPEC, endpoint, exposed

# --- the version cap --------------------------------------------------------

class RecordingClient:
    """Stands in for oslo's RPCClient: records what would be sent."""

    def __init__(self, real):
        self.real = real
        self.version_cap = real.version_cap
        self.sent: list[tuple[str, str]] = []

    def can_send_version(self, version):
        return self.real.can_send_version(version)

    def prepare(self, version, **_):
        client = self

        class Prepared:
            def call(self, ctxt, method, **payload):
                client.sent.append((method, version))
                return {}
        return Prepared()


def client(cap: str | None) -> ComputeAgentAPI:
    conf = load_config([])
    conf.set_override("transport_url", "fake:/")
    conf.set_override("compute_agent", cap, group="upgrade_levels")
    api = ComputeAgentAPI(conf)
    api.client = RecordingClient(api.client)
    return api


def test_the_client_sends_each_call_at_the_version_it_appeared_in():
    api = client(None)
    calls = exposed(endpoint().endpoint)
    for name in calls:
        method = getattr(api, name)
        # The arguments the call appeared with; optional ones came later.
        required = method.__code__.co_argcount - 1 - len(method.__defaults__ or ())
        method(*["x"] * required)
    assert dict(api.client.sent) == calls


def test_a_rebuild_that_names_its_source_is_sent_at_1_3_and_capped_below():
    api = client(None)
    api.rebuild_instance("h", MIGRATION, INSTANCE, SPEC, ALLOCATIONS, source_host="s")
    assert api.client.sent == [("rebuild_instance", "1.3")]
    capped = client("1.1")
    with pytest.raises(VersionCapped, match="rebuild_instance needs RPC API 1.3"):
        capped.rebuild_instance("h", MIGRATION, INSTANCE, SPEC, ALLOCATIONS,
                                source_host="s")
    assert capped.client.sent == []


def test_a_client_capped_below_a_call_refuses_it_before_sending():
    api = client(rpc_versions.OLDEST)
    with pytest.raises(VersionCapped) as caught:
        api.list_instances("host-1")
    assert str(caught.value) == ("list_instances needs RPC API 1.1, but [upgrade_levels] "
                                 "compute_agent caps this client at 1.0")
    api.get_host_info("host-1")
    assert api.client.sent == [("get_host_info", "1.0")]




# --- an answer, or none ----------------------------------------------------------

class ScriptedClient:
    """Stands in for oslo's RPCClient: each call meets the next of
    ``outcomes`` (an error raised, or the answer returned)."""

    version_cap = None

    def __init__(self, *outcomes: object):
        self.outcomes = list(outcomes)
        self.sent: list[tuple[str, str, str, float]] = []  # method, server, version, timeout

    def can_send_version(self, version: str) -> bool:
        return True

    def prepare(self, server: str, version: str, timeout: float) -> SimpleNamespace:
        def call(ctxt: dict, method: str, **payload: object) -> object:
            self.sent.append((method, server, version, timeout))
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return SimpleNamespace(call=call)


def scripted(*outcomes: object, timeout: float = 60,
             outstanding: OutstandingCalls | None = None) -> ComputeAgentAPI:
    """A client whose calls meet ``outcomes``; its broker (fake:/) is not
    asked anything (tests/unit/rpc/test_sending.py asks one)."""
    conf = load_config([])
    conf.set_override("transport_url", "fake:/")
    api = ComputeAgentAPI(conf, timeout=timeout, outstanding=outstanding)
    api.client = ScriptedClient(*outcomes)
    return api


def test_a_call_is_sent_to_its_host_at_its_version_within_its_timeout():
    api = scripted({"uuid": INSTANCE})
    assert api.get_instance("h1", INSTANCE) == {"uuid": INSTANCE}
    [(method, server, version, timeout)] = api.client.sent
    assert (method, server, version) == ("get_instance", "h1", "1.0")
    assert 59 < timeout <= 60


def test_a_call_sent_and_not_answered_is_no_answer_naming_the_host_and_not_sent_again():
    api = scripted(messaging.MessagingTimeout("timed out"), timeout=60)
    with pytest.raises(NoAnswer) as raised:
        api.delete_instance("h1", INSTANCE)
    assert str(raised.value) == "delete_instance to h1: no answer within 60s"
    assert raised.value.host == "h1" and isinstance(raised.value, messaging.MessagingTimeout)
    assert len(api.client.sent) == 1


def test_a_call_is_outstanding_while_it_waits_and_not_after():
    watch_clock = FakeClock()
    outstanding = OutstandingCalls(clock=watch_clock)
    seen: list[Overdue | None] = []

    class Slow(ScriptedClient):
        def prepare(self, server: str, version: str, timeout: float) -> SimpleNamespace:
            def call(ctxt: dict, method: str, **payload: object) -> dict:
                watch_clock.advance(30 + 11)
                seen.append(outstanding.overdue(grace=10, between_calls=3600))
                return {}
            return SimpleNamespace(call=call)

    api = scripted(timeout=30, outstanding=outstanding)
    api.client = Slow()
    api.get_host_info("h1")
    assert seen == [Overdue(40, call=True)]
    assert outstanding.overdue(grace=10, between_calls=3600) is None
