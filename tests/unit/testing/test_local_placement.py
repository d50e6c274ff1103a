"""The local Placement's parts that need no Placement
(compute_agent/testing/local_placement.py): its config, its request log
(written by a WSGI wrapper, read by LocalPlacement), jsonschema checking
each schema once, and its command line. (A real one, started and
stopped, is tests/functional/test_local_placement.py's: it takes seconds.)"""
from __future__ import annotations

import configparser
import io
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

import jsonschema
import pytest

from compute_agent.testing import local_placement
from compute_agent.testing.local_placement import LocalPlacement

StartResponse = Callable[..., object]


def test_the_config_is_noauth2_on_a_database_in_the_directory(tmp_path):
    directory = tmp_path / "new" / "placement"
    conf = local_placement.write_config(directory)
    assert conf == directory / "placement.conf"
    parsed = configparser.ConfigParser()
    parsed.read(conf)
    assert parsed["api"]["auth_strategy"] == "noauth2"
    assert parsed["placement_database"]["connection"] == (
        f"sqlite:///{directory / 'placement.db'}")


def app_answering(status: str) -> Callable[[dict, StartResponse], Iterable[bytes]]:
    def app(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        start_response(status, [("Content-Type", "application/json")])
        return [b"{}"]
    return app


def call(app, method: str, path: str, query: str = "") -> list[str]:
    """``app`` called as a WSGI server calls it; the statuses it started."""
    started: list[str] = []
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
               "wsgi.input": io.BytesIO()}
    app(environ, lambda status, headers, exc_info=None: started.append(status))
    return started


def test_each_request_is_one_line_of_its_method_path_query_and_status(tmp_path):
    log = tmp_path / "requests.log"
    log.write_text("GET / 200\n")  # a line of an earlier run stays
    counting = local_placement._counting(app_answering("409 Conflict"), log)
    assert call(counting, "PUT", "/resource_providers/rp1/traits") == ["409 Conflict"]
    call(local_placement._counting(app_answering("200 OK"), log), "GET",
         "/allocation_candidates", "resources=VCPU:1&limit=5")
    assert log.read_text().splitlines() == [
        "GET / 200", "PUT /resource_providers/rp1/traits 409",
        "GET /allocation_candidates?resources=VCPU:1&limit=5 200"]


def test_a_request_the_app_fails_is_logged_without_a_status(tmp_path):
    def failing(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        raise RuntimeError("placement bug")

    log = tmp_path / "requests.log"
    with pytest.raises(RuntimeError):
        call(local_placement._counting(failing, log), "DELETE", "/allocations/c1")
    assert log.read_text() == "DELETE /allocations/c1\n"


def test_the_request_log_is_read_from_a_mark(tmp_path):
    placement = LocalPlacement(tmp_path, port=8778)
    assert placement.url == "http://127.0.0.1:8778"
    assert placement.requests() == [] and placement.mark() == 0
    placement.request_log.write_text("GET / 200\n")
    mark = placement.mark()
    with placement.request_log.open("a") as log:
        log.write("PUT /traits/CUSTOM_A 201\nGET /traits 200\n")
    assert placement.requests_since(mark) == ["PUT /traits/CUSTOM_A 201", "GET /traits 200"]
    assert placement.requests()[0] == "GET / 200"
    placement.stop()  # never started: nothing to stop
    assert placement.proc is None


def test_a_free_port_is_one_a_server_can_listen_on():
    port = local_placement.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert s.getsockname()[1] == port


@pytest.fixture
def checked_once(monkeypatch) -> list[int]:
    """jsonschema.validate as check_each_schema_once makes it (given back
    after the test), and the ids of the schemas it checked."""
    monkeypatch.setattr(jsonschema, "validate", jsonschema.validate)
    checked: list[int] = []
    check_schema = jsonschema.Draft202012Validator.check_schema

    def counting(schema: dict) -> None:
        checked.append(id(schema))
        check_schema(schema)

    monkeypatch.setattr(jsonschema.Draft202012Validator, "check_schema", counting)
    local_placement.check_each_schema_once()
    return checked


SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"name": {"type": "string", "maxLength": 5}},
          "required": ["name"], "additionalProperties": False}


def test_a_schema_is_checked_once_and_every_instance_still_validated(checked_once):
    jsonschema.validate({"name": "rp1"}, SCHEMA)
    for bad in ({"name": 1}, {}, {"name": "toolong"}, {"name": "a", "other": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)
    jsonschema.validate({"name": "rp2"}, SCHEMA)
    assert checked_once == [id(SCHEMA)]


def test_a_bad_schema_is_refused_and_other_schemas_checked_too(checked_once):
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.validate({}, {**SCHEMA, "type": "no such type"})
    other = {**SCHEMA, "required": []}
    jsonschema.validate({}, other)
    assert checked_once[-1] == id(other) and len(checked_once) == 2


def test_the_error_shown_is_the_best_match_as_jsonschema_gives_it(checked_once):
    """Placement shows the error's message to its client: the one
    jsonschema's own validate would have raised of the two found (not the
    first found, the name's type)."""
    with pytest.raises(jsonschema.ValidationError) as raised:
        jsonschema.validate({"name": 12345678, "other": 1}, SCHEMA)
    assert raised.value.message == "Additional properties are not allowed ('other' was unexpected)"


def test_the_command_line_serves_the_directory_on_the_port_with_the_workers(
        tmp_path, monkeypatch):
    served: list[tuple[Path, int, int]] = []
    monkeypatch.setattr(local_placement, "serve",
                        lambda directory, port, workers: served.append(
                            (directory, port, workers)))
    monkeypatch.chdir(tmp_path)
    local_placement.main(["--dir", "p", "--port", "8778", "--workers", "3"])
    local_placement.main(["--dir", "p"])
    assert served == [(tmp_path / "p", 8778, 3), (tmp_path / "p", 0, 1)]


def test_the_command_line_refuses_no_worker(capsys):
    with pytest.raises(SystemExit) as raised:
        local_placement.main(["--dir", "p", "--workers", "0"])
    assert raised.value.code == 2
    assert "--workers must be at least 1, not 0" in capsys.readouterr().err
