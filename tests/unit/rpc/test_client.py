"""The client conductors import: each call sent at the version it appeared
in, and refused before it is sent when the version cap is lower. (Through
the real RabbitMQ: tests/functional/test_rpc.py.)"""
from __future__ import annotations

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.exception import VersionCapped
from compute_agent.rpc import versions as rpc_versions
from compute_agent.rpc.client import ComputeAgentAPI
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


