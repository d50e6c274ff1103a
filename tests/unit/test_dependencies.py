"""compute_agent/dependencies.py: one line going down, one coming back, a counter
in between; and the Placement client's failures told apart by dependency."""
from __future__ import annotations

import logging

import pytest
from keystoneauth1 import exceptions as ks_exc

from compute_agent.daemon import cycle_record
from compute_agent.daemon.errors import RecordUnreadable
from compute_agent.dependencies import (
    LINE_LIMIT,
    Dependencies,
    Dependency,
    DependencyState,
    Health,
    answered,
    failed,
    reached_before,
)
from compute_agent.exception import KeystoneUnavailable, PlacementUnavailable
from compute_agent.placement.client import PlacementClient, connection_problem, keystone_problem

URL = "http://127.0.0.1:8778"
# What urllib3 says, inside keystoneauth's ConnectFailure, for a port that
# refuses.
REFUSED = ("Unable to establish connection to http://127.0.0.1:1/: HTTPConnectionPool("
           "host='127.0.0.1', port=1): Max retries exceeded with url: / (Caused by "
           "NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=1): Failed to "
           "establish a new connection: [Errno 111] Connection refused\"))")


def test_first_failure_says_it_and_later_ones_only_count():
    state, line = failed(DependencyState(Dependency.PLACEMENT), URL,
                         "did not answer (connection refused)", now=100)
    assert line == f"Placement at {URL} did not answer (connection refused)"
    assert (state.health, state.failures, state.since) == (Health.DOWN, 1, 100)
    state, line = failed(state, URL, "answered 503 to GET /: down", now=160)
    assert line is None
    assert (state.failures, state.total_failures, state.since) == (2, 2, 100)
    assert state.problem == "answered 503 to GET /: down"


def test_coming_back_says_how_long_and_resets_the_count_not_the_total():
    state = DependencyState(Dependency.KEYSTONE, Health.DOWN, "http://ks/v3", "x",
                            failures=3, total_failures=5, since=100)
    state, line = answered(state, now=190)
    assert line == "Keystone at http://ks/v3 is back after 3 failed cycles, 90 s"
    assert (state.health, state.failures, state.total_failures) == (Health.UP, 0, 5)
    assert answered(state, now=200)[1] is None


def test_first_success_says_nothing():
    state, line = answered(DependencyState(Dependency.LIBVIRT), now=1)
    assert line is None and state.health is Health.UP


def test_a_line_is_never_longer_than_the_limit():
    _, line = failed(DependencyState(Dependency.PLACEMENT), URL, "x" * 500, now=0)
    assert len(line) == LINE_LIMIT and line.endswith("...")


def test_a_failure_means_what_was_asked_before_it_answered():
    path = (Dependency.LIBVIRT, Dependency.KEYSTONE, Dependency.PLACEMENT)
    assert reached_before(Dependency.PLACEMENT, path) == path[:2]
    assert reached_before(Dependency.KEYSTONE, path) == path[:1]
    assert reached_before(None, path) == path


def test_the_board_logs_once_each_way_over_many_cycles(caplog):
    now = [0.0]
    board = Dependencies(clock=lambda: now[0])
    path = (Dependency.LIBVIRT, Dependency.PLACEMENT)
    with caplog.at_level(logging.DEBUG, logger="compute_agent.dependencies"):
        board.observe_path(path)
        for _ in range(5):
            now[0] += 1
            board.observe_path(path, Dependency.PLACEMENT, URL, "did not answer (x)")
        for _ in range(2):
            now[0] += 1
            board.observe_path(path)
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.levelno >= logging.INFO]
    assert said == [("WARNING", f"Placement at {URL} did not answer (x)"),
                    ("INFO", f"Placement at {URL} is back after 5 failed cycles, 5 s")]
    states = board.snapshot()
    assert states[Dependency.PLACEMENT].total_failures == 5
    assert states[Dependency.LIBVIRT].health is Health.UP


def test_a_record_reads_back_as_written(tmp_path):
    board = Dependencies(clock=lambda: 7.0)
    board.failed(Dependency.BROKER, "rabbit://127.0.0.1:5672/", "did not answer (y)")
    record = cycle_record.CycleRecord(42, 10.0, 5.0, "z", board.snapshot())
    path = tmp_path / cycle_record.FILENAME
    cycle_record.write(path, record)
    assert cycle_record.read(path) == record
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("{}")
    with pytest.raises(RecordUnreadable, match=str(path)):
        cycle_record.read(path)
    assert cycle_record.read(tmp_path / "absent") is None


# --- the Placement client's errors -------------------------------------

def test_a_refused_connection_is_said_in_a_few_words():
    assert connection_problem(ks_exc.ConnectFailure(REFUSED)) == \
        "did not answer (connection refused)"
    assert connection_problem(ks_exc.ConnectTimeout("...")) == "did not answer (timed out)"
    # A server stopped in the middle of a request.
    closed = ks_exc.ConnectFailure(
        "Unable to establish connection to http://127.0.0.1:1/x: ('Connection aborted.', "
        "RemoteDisconnected('Remote end closed connection without response'))")
    assert connection_problem(closed) == "did not answer (connection closed)"


@pytest.mark.parametrize("error, said", [
    (ks_exc.Unauthorized("The request you have made requires authentication."),
     "refused the credentials (401)"),
    (ks_exc.EndpointNotFound(), "has no Placement endpoint in its catalog"),
    (ks_exc.ConnectFailure(REFUSED), "did not answer (connection refused)"),
    (ks_exc.ServiceUnavailable("Service Unavailable", http_status=503), "answered 503"),
])
def test_keystone_failures_are_named(error, said):
    assert said in keystone_problem(error)


class Auth:
    auth_url = "http://127.0.0.1:5000/v3"


class Adapter:
    """keystoneauth's Adapter as the client uses it; each step raises what
    it is given."""

    def __init__(self, endpoint_error=None, request_error=None):
        self.auth = Auth()
        self.endpoint_override = None
        self.endpoint_error = endpoint_error
        self.request_error = request_error

    def get_endpoint(self):
        if self.endpoint_error:
            raise self.endpoint_error
        return URL + "/"

    def request(self, url, method, **kwargs):
        raise self.request_error


def test_a_wrong_password_names_keystone_and_its_url_not_placement():
    client = PlacementClient(Adapter(endpoint_error=ks_exc.Unauthorized("no")))
    with pytest.raises(KeystoneUnavailable) as raised:
        client.negotiate()
    assert str(raised.value).startswith(
        "Keystone at http://127.0.0.1:5000/v3 refused the credentials (401)")
    # Callers that cannot go on without Placement treat it as such.
    assert isinstance(raised.value, PlacementUnavailable)


def test_placement_not_answering_names_placement_and_its_catalog_url():
    client = PlacementClient(Adapter(request_error=ks_exc.ConnectFailure(REFUSED)))
    with pytest.raises(PlacementUnavailable) as raised:
        client.negotiate()
    assert type(raised.value) is PlacementUnavailable
    assert str(raised.value) == f"Placement at {URL} did not answer (connection refused)"


def test_keystone_failing_when_the_session_authenticates_again_names_keystone():
    client = PlacementClient(Adapter(request_error=ks_exc.Unauthorized("expired")))
    with pytest.raises(KeystoneUnavailable, match="^Keystone at http://127.0.0.1:5000/v3"):
        client.negotiate()


def test_a_request_that_got_no_answer_is_one_sent_and_one_counted_no_answer():
    client = PlacementClient(Adapter(request_error=ks_exc.ConnectFailure(REFUSED)))
    with pytest.raises(PlacementUnavailable):
        client.negotiate()
    assert client.requests_sent == 1
    assert [(s.labels, s.value) for family in client.metrics.placement_requests.collect()
            for s in family.samples if s.name.endswith("_total")] == [
        ({"method": "GET", "status": "no_answer"}, 1.0)]
