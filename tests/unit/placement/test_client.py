"""The Placement client: the requests each method sends, the microversion
negotiated once and sent with every request, every failure turned into one
of its typed errors (and none retried here: a failed request is the
cycle's), each request counted. Through a fake keystoneauth adapter, and
once through a real one to a small HTTP server of the test's own.
(Against a real Placement: tests/functional/test_update_provider_tree.py.)"""
from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import session as ks_session

from compute_agent.exception import (
    GenerationConflict,
    KeystoneUnavailable,
    PlacementError,
    PlacementUnavailable,
)
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import (
    MAX_VERSION,
    PlacementClient,
    connection_problem,
    keystone_problem,
    keystone_url,
)

URL = "http://127.0.0.1:8778"
KEYSTONE = "http://127.0.0.1:5000/v3"
NEWEST = f"{MAX_VERSION[0]}.{MAX_VERSION[1]}"
# What urllib3 says, inside keystoneauth's ConnectFailure, for a port that
# refuses.
REFUSED = ("Unable to establish connection to http://127.0.0.1:1/: HTTPConnectionPool("
           "host='127.0.0.1', port=1): Max retries exceeded with url: / (Caused by "
           "NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=1): Failed to "
           "establish a new connection: [Errno 111] Connection refused\"))")


def versions(max_version: str) -> dict:
    """Placement's answer to GET /, as it gives it."""
    return {"versions": [{"id": "v1.0", "min_version": "1.0", "max_version": max_version,
                          "status": "CURRENT", "links": []}]}


def error_body(status: int, code: str, detail: str) -> dict:
    """Placement's error document."""
    return {"errors": [{"status": status, "title": "x", "code": code, "detail": detail,
                        "request_id": "req-1"}]}


@dataclass
class Response:
    """requests' Response as the client reads it."""

    status_code: int
    body: Any = None  # JSON, or text when a str
    raw: str | None = None

    @property
    def text(self) -> str:
        if self.raw is not None:
            return self.raw
        return "" if self.body is None else json.dumps(self.body)

    @property
    def content(self) -> bytes:
        return self.text.encode()

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Sent:
    method: str
    url: str
    microversion: str | None
    body: Any


class Adapter:
    """keystoneauth's Adapter as the client uses it: GET / answers
    ``versions(server_max)``; every other request the next of ``answers``
    (200 with no body once they run out). ``endpoint_error`` and
    ``request_error`` are raised by the step they name."""

    def __init__(self, *answers: Response, server_max: str = NEWEST,
                 endpoint: str | None = URL + "/",
                 endpoint_error: Exception | None = None,
                 request_error: Exception | None = None):
        self.auth = SimpleNamespace(auth_url=KEYSTONE)
        self.session = SimpleNamespace(auth=None)
        self.endpoint_override = None
        self.answers = list(answers)
        self.server_max = server_max
        self.endpoint = endpoint
        self.endpoint_error = endpoint_error
        self.request_error = request_error
        self.sent: list[Sent] = []

    def get_endpoint(self) -> str | None:
        if self.endpoint_error:
            raise self.endpoint_error
        return self.endpoint

    def request(self, url: str, method: str, **kwargs: Any) -> Response:
        assert kwargs.pop("raise_exc") is False  # the client reads every status itself
        self.sent.append(Sent(method, url, kwargs.pop("microversion", None),
                              kwargs.pop("json", None)))
        assert not kwargs
        if self.request_error:
            raise self.request_error
        if url == "/":
            return Response(200, versions(self.server_max))
        return self.answers.pop(0) if self.answers else Response(200)

    def requests(self) -> list[Sent]:
        """What was sent after the negotiation."""
        return [s for s in self.sent if s.url != "/"]


def client_of(*answers: Response, **kwargs: Any) -> tuple[PlacementClient, Adapter]:
    adapter = Adapter(*answers, **kwargs)
    return PlacementClient(adapter), adapter  # type: ignore[arg-type]


# --- the microversion --------------------------------------------------------

def test_the_microversion_is_negotiated_once_and_sent_with_every_request():
    client, adapter = client_of(Response(200, {"resource_providers": []}),
                                Response(200, {"resource_providers": []}))
    client.get_tree("root")
    client.get_tree("root")
    assert [(s.method, s.url, s.microversion) for s in adapter.sent] == [
        ("GET", "/", None),
        ("GET", "/resource_providers?in_tree=root", NEWEST),
        ("GET", "/resource_providers?in_tree=root", NEWEST)]
    assert client.version == NEWEST


@pytest.mark.parametrize("server_max, chosen", [("1.37", "1.37"), ("1.38", "1.38"),
                                                 (NEWEST, NEWEST), ("1.45", NEWEST),
                                                 ("2.0", NEWEST)])
def test_the_newest_microversion_both_sides_know_is_chosen(server_max, chosen):
    client, _ = client_of(server_max=server_max)
    assert client.negotiate() == chosen


def test_a_placement_older_than_the_agent_needs_is_refused_naming_both_versions():
    client, adapter = client_of(server_max="1.36")
    with pytest.raises(PlacementError) as raised:
        client.get_tree("root")
    assert str(raised.value) == ("Placement's newest microversion is 1.36; the agent "
                                 "needs 1.37")
    assert client.version is None and adapter.requests() == []


# --- what each method sends ----------------------------------------------------

def bodies(adapter: Adapter) -> list[tuple[str, str, Any]]:
    return [(s.method, s.url, s.body) for s in adapter.requests()]


def test_a_root_is_created_without_a_parent_and_a_child_with_its_own():
    client, adapter = client_of(Response(200, {"generation": 0}),
                                Response(200, {"generation": 0}))
    assert client.create_provider("r", "host", None) == 0
    client.create_provider("c", "host_numa_0", "r")
    assert bodies(adapter) == [
        ("POST", "/resource_providers", {"uuid": "r", "name": "host"}),
        ("POST", "/resource_providers", {"uuid": "c", "name": "host_numa_0",
                                         "parent_provider_uuid": "r"})]


def test_an_update_sends_a_parent_of_none_as_null_to_make_a_root():
    client, adapter = client_of(Response(200, {"generation": 4}))
    assert client.update_provider("c", "host_numa_0", None) == 4
    assert bodies(adapter) == [("PUT", "/resource_providers/c",
                                {"name": "host_numa_0", "parent_provider_uuid": None})]


def test_writes_carry_the_generation_and_return_the_new_one():
    moved = {"resource_provider_generation": 8}
    client, adapter = client_of(Response(200, moved), Response(200, moved),
                                Response(200, moved))
    inventories = {"VCPU": {"total": 8}}
    assert client.set_inventories("p", 7, inventories) == 8
    assert client.set_traits("p", None, {"CUSTOM_B", "CUSTOM_A"}) == 8
    assert client.set_aggregates("p", 7, ["b", "a"]) == 8
    assert bodies(adapter) == [
        ("PUT", "/resource_providers/p/inventories",
         {"resource_provider_generation": 7, "inventories": inventories}),
        # Sets in a stable order, so one change is one same request.
        ("PUT", "/resource_providers/p/traits",
         {"resource_provider_generation": None, "traits": ["CUSTOM_A", "CUSTOM_B"]}),
        ("PUT", "/resource_providers/p/aggregates",
         {"resource_provider_generation": 7, "aggregates": ["a", "b"]})]


def test_reads_return_the_generation_with_what_they_read():
    client, _ = client_of(
        Response(200, {"resource_provider_generation": 3,
                       "inventories": {"VCPU": {"total": 8}}}),
        Response(200, {"resource_provider_generation": 3, "traits": ["B", "A"]}))
    assert client.get_inventories("p") == (3, {"VCPU": {"total": 8}})
    assert client.get_traits("p") == (3, frozenset({"A", "B"}))


def test_a_reshape_sends_every_providers_inventories_and_the_allocations_in_one_post():
    client, adapter = client_of(Response(204))
    client.reshape({"a": (1, {"VCPU": {"total": 4}}), "b": (None, {})})
    assert bodies(adapter) == [("POST", "/reshaper", {
        "inventories": {"a": {"resource_provider_generation": 1,
                              "inventories": {"VCPU": {"total": 4}}},
                        "b": {"resource_provider_generation": None, "inventories": {}}},
        "allocations": {}})]


def test_roots_are_looked_up_by_their_name_quoted_and_children_left_out():
    rows = [{"uuid": "r", "root_provider_uuid": "r"},
            {"uuid": "c", "root_provider_uuid": "r"}]
    client, adapter = client_of(Response(200, {"resource_providers": rows}))
    assert client.get_roots_named("host 1/a&b") == ["r"]
    assert adapter.requests()[0].url == "/resource_providers?name=host%201%2Fa%26b"


def test_provider_queries_are_sent_in_a_stable_order_and_candidates_in_the_callers():
    client, adapter = client_of(Response(200, {"resource_providers": []}),
                                Response(200, {"resource_providers": []}),
                                Response(200, {"allocation_requests": []}))
    assert client.get_providers(required="HW_NUMA_ROOT", name="x") == []
    client.get_providers()
    client.get_allocation_candidates([("resources", "VCPU:1"), ("limit", "5")])
    assert [s.url for s in adapter.requests()] == [
        "/resource_providers?name=x&required=HW_NUMA_ROOT",
        "/resource_providers",
        "/allocation_candidates?resources=VCPU:1&limit=5"]


@pytest.mark.parametrize("status", [201, 204])
def test_a_name_made_now_or_made_before_is_there(status):
    client, adapter = client_of(Response(status), Response(status))
    client.ensure_resource_class("CUSTOM_X")
    client.ensure_trait("CUSTOM_T")
    assert [(s.method, s.url) for s in adapter.requests()] == [
        ("PUT", "/resource_classes/CUSTOM_X"), ("PUT", "/traits/CUSTOM_T")]


def test_a_204_is_an_answer_without_a_body():
    client, adapter = client_of(Response(204))
    assert client.delete_provider("p") is None
    assert [(s.method, s.url) for s in adapter.requests()] == [
        ("DELETE", "/resource_providers/p")]


def test_deleting_allocations_a_consumer_does_not_have_is_no_error():
    client, adapter = client_of(Response(404, error_body(404, "placement.undefined_code",
                                                         "no allocations")))
    assert client.delete_consumer_allocations("c") is None
    assert [(s.method, s.url) for s in adapter.requests()] == [("DELETE", "/allocations/c")]


def test_a_status_a_call_does_not_expect_is_an_error_though_not_a_failure():
    client, _ = client_of(Response(404, error_body(404, "placement.undefined_code",
                                                   "No resource provider with uuid p")))
    with pytest.raises(PlacementError) as raised:
        client.delete_provider("p")
    assert raised.value.status == 404
    assert type(raised.value) is PlacementError


# --- errors ----------------------------------------------------------------------

def test_a_5xx_is_placement_unavailable_naming_the_request_and_sent_once():
    client, adapter = client_of(Response(503, error_body(503, "placement.undefined_code",
                                                         "the database went away")))
    with pytest.raises(PlacementUnavailable) as raised:
        client.get_inventories("p")
    assert type(raised.value) is PlacementUnavailable
    assert str(raised.value) == (f"Placement at {URL} answered 503 to GET "
                                 "/resource_providers/p/inventories: the database went away")
    assert len(adapter.requests()) == 1


def test_a_lost_race_is_a_generation_conflict_and_any_other_409_is_not():
    client, _ = client_of(
        Response(409, error_body(409, "placement.concurrent_update", "generation moved")),
        Response(409, error_body(409, "placement.inventory.inuse",
                                 "Inventory for VCPU on\n  resource provider p in use.")))
    with pytest.raises(GenerationConflict) as conflict:
        client.set_traits("p", 1, [])
    assert (conflict.value.status, conflict.value.code) == (409, "placement.concurrent_update")
    with pytest.raises(PlacementError) as refused:
        client.set_inventories("p", 1, {})
    assert type(refused.value) is PlacementError
    assert (refused.value.status, refused.value.code) == (409, "placement.inventory.inuse")
    assert str(refused.value) == ("Placement answered 409 to PUT "
                                  "/resource_providers/p/inventories: Inventory for VCPU on "
                                  "resource provider p in use.")


def test_an_error_that_is_not_placements_document_is_shown_as_its_first_200_characters():
    client, _ = client_of(Response(400, raw="<html>" + "x" * 300))
    with pytest.raises(PlacementError) as raised:
        client.get_traits("p")
    assert raised.value.code is None
    assert str(raised.value) == ("Placement answered 400 to GET /resource_providers/p/traits: "
                                 + ("<html>" + "x" * 300)[:200])


def test_the_url_is_the_catalogs_without_its_trailing_slash():
    client, _ = client_of()
    assert client.url == ""
    assert client.endpoint() == URL
    assert client.url == URL


def test_keystone_without_a_placement_endpoint_names_keystone():
    client, adapter = client_of(endpoint=None)
    with pytest.raises(KeystoneUnavailable) as raised:
        client.get_tree("root")
    assert str(raised.value).startswith(
        f"Keystone at {KEYSTONE} has no Placement endpoint in its catalog")
    assert adapter.sent == []


def test_a_wrong_password_names_keystone_and_its_url_not_placement():
    client, _ = client_of(endpoint_error=ks_exc.Unauthorized("no"))
    with pytest.raises(KeystoneUnavailable) as raised:
        client.negotiate()
    assert str(raised.value).startswith(
        f"Keystone at {KEYSTONE} refused the credentials (401)")
    # Callers that cannot go on without Placement treat it as such.
    assert isinstance(raised.value, PlacementUnavailable)


def test_placement_not_answering_names_placement_and_its_catalog_url():
    client, _ = client_of(request_error=ks_exc.ConnectFailure(REFUSED))
    with pytest.raises(PlacementUnavailable) as raised:
        client.negotiate()
    assert type(raised.value) is PlacementUnavailable
    assert str(raised.value) == f"Placement at {URL} did not answer (connection refused)"


def test_keystone_failing_when_the_session_authenticates_again_names_keystone():
    client, _ = client_of(request_error=ks_exc.Unauthorized("expired"))
    with pytest.raises(KeystoneUnavailable, match=f"^Keystone at {KEYSTONE}"):
        client.negotiate()


def test_a_refused_connection_is_said_in_a_few_words():
    assert connection_problem(ks_exc.ConnectFailure(REFUSED)) == \
        "did not answer (connection refused)"
    assert connection_problem(ks_exc.ConnectTimeout("...")) == "did not answer (timed out)"
    # A server stopped in the middle of a request.
    closed = ks_exc.ConnectFailure(
        "Unable to establish connection to http://127.0.0.1:1/x: ('Connection aborted.', "
        "RemoteDisconnected('Remote end closed connection without response'))")
    assert connection_problem(closed) == "did not answer (connection closed)"
    assert connection_problem(ks_exc.SSLError("certificate verify failed")) == \
        "did not answer (TLS: certificate verify failed)"
    # Anything else: its type, and what follows the URL keystoneauth names.
    assert connection_problem(ks_exc.ConnectFailure(
        "Unable to establish connection to http://p/: something new")) == \
        "did not answer (ConnectFailure: something new)"


@pytest.mark.parametrize("error, said", [
    (ks_exc.Unauthorized("The request you have made requires authentication."),
     "refused the credentials (401)"),
    (ks_exc.EndpointNotFound(), "has no Placement endpoint in its catalog"),
    (ks_exc.ConnectFailure(REFUSED), "did not answer (connection refused)"),
    (ks_exc.ServiceUnavailable("Service Unavailable", http_status=503), "answered 503"),
    (ks_exc.DiscoveryFailure("no v3"), "found no identity API version: no v3"),
    (ks_exc.AuthPluginException("no plugin"), "failed: AuthPluginException: no plugin"),
])
def test_keystone_failures_are_named(error, said):
    assert said in keystone_problem(error)


def test_keystone_is_the_auth_plugins_and_none_for_a_token_and_endpoint_plugin():
    by_session = SimpleNamespace(auth=None, session=SimpleNamespace(
        auth=SimpleNamespace(auth_url=KEYSTONE)))
    assert keystone_url(by_session) == KEYSTONE  # type: ignore[arg-type]
    noauth = SimpleNamespace(auth=NoAuth2(URL), session=SimpleNamespace(auth=None))
    assert keystone_url(noauth) is None  # type: ignore[arg-type]


def test_keystoneauths_discovery_warning_is_left_to_the_one_line_of_keystone_unavailable(
        caplog):
    logger = logging.getLogger("keystoneauth.identity.generic.base")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Failed to discover available identity versions when contacting %s. "
                       "Attempting to parse version from URL.", KEYSTONE)
        logger.warning("Another warning")
    assert [r.getMessage() for r in caplog.records] == ["Another warning"]


# --- counted ------------------------------------------------------------------------

def counted(client: PlacementClient) -> dict[tuple[str, str], float]:
    return {(s.labels["method"], s.labels["status"]): s.value
            for family in client.metrics.placement_requests.collect()
            for s in family.samples if s.name.endswith("_total")}


def test_every_request_is_counted_by_method_and_status():
    client, _ = client_of(Response(200, {"resource_providers": []}),
                          Response(409, error_body(409, "placement.concurrent_update", "x")))
    client.get_tree("root")
    with pytest.raises(GenerationConflict):
        client.set_traits("p", 1, [])
    assert counted(client) == {("GET", "200"): 2.0, ("PUT", "409"): 1.0}
    assert client.requests_sent == 3


def test_a_request_that_got_no_answer_is_one_sent_and_one_counted_no_answer():
    client, _ = client_of(request_error=ks_exc.ConnectFailure(REFUSED))
    with pytest.raises(PlacementUnavailable):
        client.negotiate()
    assert client.requests_sent == 1
    assert counted(client) == {("GET", "no_answer"): 1.0}


# --- through keystoneauth, to a server of the test's own -----------------------------

@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class Handler(http.server.BaseHTTPRequestHandler):
    """Placement's GET / and an echo of every other request's generation."""

    received: list[Received]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.received.append(Received(self.command, self.path, dict(self.headers), body))
        answer = versions(NEWEST) if self.path == "/" else {
            "resource_provider_generation": 1, "traits": []}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = _answer  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: Any) -> None:
        pass  # not the test's output


@pytest.fixture
def server() -> Iterator[tuple[str, list[Received]]]:
    received: list[Received] = []
    handler = type("RecordingHandler", (Handler,), {"received": received})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", received
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_keystoneauth_sends_the_microversion_the_token_the_roles_and_the_body(server):
    url, received = server
    auth = NoAuth2(url)
    client = PlacementClient(ks_adapter.Adapter(ks_session.Session(auth=auth),
                                                service_type="placement"))
    assert client.set_traits("p", 0, {"CUSTOM_B", "CUSTOM_A"}) == 1
    negotiation, put = received
    assert (negotiation.method, negotiation.path) == ("GET", "/")
    assert "OpenStack-API-Version" not in negotiation.headers
    assert (put.method, put.path) == ("PUT", "/resource_providers/p/traits")
    assert put.headers["OpenStack-API-Version"] == f"placement {NEWEST}"
    assert (put.headers["X-Auth-Token"], put.headers["X-Roles"]) == ("admin", "admin,service")
    assert put.headers["Content-Type"] == "application/json"
    assert put.body == {"resource_provider_generation": 0, "traits": ["CUSTOM_A", "CUSTOM_B"]}
    assert client.url == url
