"""compute-agent-ctl (compute_agent/cmd/ctl.py): the --spec file's
documented format and its example, its tree by Placement's field names, and
its watchdog, call by call. (The commands as subprocesses:
tests/functional/test_ctl.py and test_cli.py.)"""
from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import pytest

from compute_agent.cmd import ctl
from compute_agent.cmd.errors import SpecFileError
from compute_agent.exception import AgentError, InvalidRequest
from compute_agent.rpc import broker
from compute_agent.rpc import client as rpc_client
from compute_agent.rpc import schemas as rpc_schemas
from compute_agent.rpc.errors import BrokerUnreachable, NoAnswer
from compute_agent.rpc.outstanding import OutstandingCalls
from compute_agent.tree.provider_tree import tree_lines
from tests.unit.clocks import FakeClock
from tests.unit.rpc.test_broker import WRONG_ADDRESS

TOP = Path(__file__).resolve().parents[3]
EXAMPLE = TOP / ctl.EXAMPLE_SPEC
MIGRATION = "1d2c3b4a-5f6e-4d7c-8b9a-0f1e2d3c4b5a"


def test_the_example_spec_file_is_a_build_the_agent_accepts():
    read = ctl.read_spec(str(EXAMPLE), ctl.BUILD_FIELDS)
    # The agent's own check of a build_instance payload, as the RPC
    # endpoint runs it.
    checked = rpc_schemas.checked(rpc_schemas.validator(rpc_schemas.CLAIM), read)
    assert checked["spec"]["vcpus"] == 2 and len(checked["allocations"]) == 2


def test_the_example_without_its_uuid_is_a_move_claim_the_agent_accepts():
    read = json.loads(EXAMPLE.read_text())
    claim = {k: read[k] for k in ctl.MOVE_CLAIM_FIELDS}
    payload = {**claim, "instance_uuid": read["instance_uuid"],
               "migration_uuid": "1d2c3b4a-5f6e-4d7c-8b9a-0f1e2d3c4b5a"}
    rpc_schemas.checked(rpc_schemas.validator(rpc_schemas.MOVE_CLAIM), payload)


def test_a_broken_example_would_be_refused():
    """The check above can fail: the schema refuses what the help forbids."""
    read = json.loads(EXAMPLE.read_text())
    read["spec"]["vcpus"] = rpc_schemas.SPEC["properties"]["vcpus"]["maximum"] + 1
    with pytest.raises(InvalidRequest, match="spec.vcpus"):
        rpc_schemas.checked(rpc_schemas.validator(rpc_schemas.CLAIM), read)


def test_the_spec_file_help_names_every_field_and_the_schemas_limits():
    text = ctl.spec_file_help(ctl.BUILD_FIELDS)
    for field in ("instance_uuid", "spec", "name", "vcpus", "memory_mb", "allocations",
                  "resources"):
        assert f'"{field}"' in text, field
    assert f"1 to {rpc_schemas.SPEC['properties']['memory_mb']['maximum']}" in text
    assert f"at most {rpc_schemas.MAX_PROVIDERS} providers" in text
    assert ctl.EXAMPLE_SPEC in text
    assert '"instance_uuid"' not in ctl.spec_file_help(ctl.MOVE_CLAIM_FIELDS)


# --- ctl tree: the agent's answer by Placement's field names ---------------

ROOT_PROVIDER = {"uuid": "r", "name": "h", "generation": 3, "traits": ["COMPUTE_NODE"],
                 "inventories": {"VCPU": {"total": 8, "reserved": 1, "allocation_ratio": 4.0}}}
CELL = {"uuid": "c", "name": "h_numa_0", "generation": 1, "traits": [],
        "inventories": {"MEMORY_MB": {"total": 2048, "reserved": 0,
                                      "allocation_ratio": 1.0}}}


def test_an_agent_of_this_release_and_an_older_one_read_the_same():
    new = [{**ROOT_PROVIDER, "parent_provider_uuid": None, "parent_uuid": None},
           {**CELL, "parent_provider_uuid": "r", "parent_uuid": "r"}]
    old = [{**ROOT_PROVIDER, "parent_uuid": None}, {**CELL, "parent_uuid": "r"}]
    assert ctl.in_placement_terms(new) == ctl.in_placement_terms(old) == [
        {**ROOT_PROVIDER, "parent_provider_uuid": None}, {**CELL, "parent_provider_uuid": "r"}]


def test_the_tree_shows_reserved_and_allocation_ratio_under_its_parent():
    assert tree_lines(ctl.in_placement_terms([{**ROOT_PROVIDER, "parent_uuid": None},
                                              {**CELL, "parent_uuid": "r"}])) == [
        "h  [r] generation 3",
        "    inventory: VCPU=8 (reserved 1, allocation_ratio 4.0)",
        "    traits: COMPUTE_NODE",
        "    h_numa_0  [c] generation 1",
        "        inventory: MEMORY_MB=2048"]


# --- ctl's watchdog: call by call, on a clock the test moves ---------------------

class WatchedCalls(OutstandingCalls):
    """The calls outstanding, on the test's clock, counting the watchdog's
    looks: a command's call "takes" the seconds it moves the clock by, and
    lasts until the watchdog has looked at it (``seen``)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.clock = clock
        self._looked = threading.Condition()
        self._looks = 0

    def overdue(self, grace: float, between_calls: float):
        found = super().overdue(grace, between_calls)
        with self._looked:
            self._looks += 1
            self._looked.notify_all()
        return found

    def take(self, seconds: float) -> None:
        """``seconds`` go by; the watchdog looks at least once after."""
        with self._looked:
            looks = self._looks
        self.clock.advance(seconds)
        with self._looked:
            # A look begun before the clock moved may end after: two.
            assert self._looked.wait_for(lambda: self._looks >= looks + 2, 10)


@pytest.fixture
def clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(rpc_client, "OutstandingCalls", lambda: WatchedCalls(clock))
    return clock


@pytest.fixture
def stuck():
    """What a stuck command waits on; set after the test, so its thread
    ends."""
    event = threading.Event()
    yield event
    event.set()


def calls_of(seconds: float, count: int, timeout: float | None = None,
             then: threading.Event | None = None) -> ctl.Command:
    """A conductor's command that makes ``count`` calls of ``seconds`` each,
    one after the other, each allowed ``timeout`` (--timeout by default),
    and says how many it made; its last call, with ``then``, waits for it
    (a call never answered)."""
    def call(api, args, conf):
        for i in range(count):
            with api.outstanding.one(timeout or api.timeout):
                api.outstanding.take(seconds)
                if then is not None and i == count - 1:
                    then.wait(10)
        return {"calls": count}
    return ctl.Command("test", call, conductor=True)


def placement_read_of(seconds: float, then: threading.Event) -> ctl.Command:
    """A conductor's command that reads Placement for ``seconds``, no call
    outstanding, then waits for ``then`` (a read never answered)."""
    def call(api, args, conf):
        api.outstanding.take(seconds)
        then.wait(10)
        return {}
    return ctl.Command("test", call, conductor=True)


def run_ctl(tmp_path, monkeypatch, command: ctl.Command, timeout: float,
            argv: tuple[str, ...] = ("hosts", "--json"), more_config: str = "") -> int:
    """ctl with ``command`` in the place of the one ``argv`` names;
    ``more_config`` after its config's [DEFAULT]."""
    conf = tmp_path / "ctl.conf"
    conf.write_text("[DEFAULT]\ntransport_url = rabbit://guest:guest@127.0.0.1:1/\n"
                    + more_config)
    monkeypatch.setitem(ctl.COMMANDS, argv[0], command)
    monkeypatch.setattr(ctl, "BROKER_GRACE", 0.5)
    return ctl.main(["--config-file", str(conf), "--timeout", str(timeout), *argv])


def test_bug_an_evacuation_longer_than_its_timeout_was_called_a_broker_failure(
        tmp_path, monkeypatch, capsys, clock):
    """ctl waited --timeout plus 5 s for the whole command: an evacuation
    whose calls each answered within --timeout, together later, ended in
    "the message broker did not answer" and its outcomes were lost."""
    assert run_ctl(tmp_path, monkeypatch, calls_of(0.9, 4), timeout=1) == 0
    assert json.loads(capsys.readouterr().out) == {"calls": 4}


def test_bug_heartbeats_longer_than_the_timeout_were_called_a_placement_failure(
        tmp_path, monkeypatch, capsys, clock):
    """ctl hosts' heartbeats (each allowed service_down_time, 60 s) were not
    watched: at 1,000 hosts, checked 32 at a time, ctl said "Placement did
    not answer within 65s" while they were still coming in."""
    assert run_ctl(tmp_path, monkeypatch, calls_of(3, 1, timeout=3), timeout=1) == 0
    assert json.loads(capsys.readouterr().out) == {"calls": 1}


def test_a_call_that_outlives_its_timeout_is_still_given_up(tmp_path, monkeypatch,
                                                             capsys, clock, stuck):
    assert run_ctl(tmp_path, monkeypatch, calls_of(1.6, 1, then=stuck),
                   timeout=1) == 1
    assert json.loads(capsys.readouterr().out)["error"].startswith(
        "the message broker did not answer within 1s")


def test_a_command_stuck_between_calls_blames_placement(tmp_path, monkeypatch, capsys,
                                                        clock, stuck):
    assert run_ctl(tmp_path, monkeypatch, placement_read_of(1.6, stuck),
                   timeout=1) == 1
    assert json.loads(capsys.readouterr().out)["error"].startswith(
        "Placement did not answer within 1s")


def test_a_broker_refusing_tls_is_exit_2_before_the_command_sends_anything(
        tmp_path, monkeypatch, capsys):
    """Not the driver's retries for --timeout, then "did not answer": the
    one line the daemon says too, and the command never run."""
    monkeypatch.setattr(broker, "login", lambda host, timeout: WRONG_ADDRESS)
    sent: list[str] = []

    def call(api, args, conf):
        sent.append("call")
        return {}

    assert run_ctl(tmp_path, monkeypatch, ctl.Command("test", call, conductor=True),
                   timeout=1) == 2
    assert json.loads(capsys.readouterr().out) == {
        "error": "[DEFAULT] transport_url: the message broker at rabbit://127.0.0.1:1/ "
                 "presented a certificate for another name (IP address mismatch, "
                 "certificate is not valid for '127.0.0.1'): reach the broker by a name "
                 "its certificate holds", "exit_code": 2}
    assert sent == []


def test_bug_a_login_to_a_paused_broker_was_called_a_stuck_placement_read(
        tmp_path, monkeypatch, capsys, clock, stuck):
    """The start-up login (TLS and credentials checked) waited on a paused
    broker with no call outstanding: the watchdog said "Placement did not
    answer"."""
    watched = WatchedCalls(clock)
    monkeypatch.setattr(rpc_client, "OutstandingCalls", lambda: watched)

    def paused(host, timeout):
        watched.take(1.6)
        stuck.wait(10)
        return TimeoutError("timed out")

    monkeypatch.setattr(broker, "login", paused)
    assert run_ctl(tmp_path, monkeypatch, calls_of(0.1, 1), timeout=1) == 1
    assert json.loads(capsys.readouterr().out)["error"].startswith(
        "the message broker did not answer within 1s")


# --- the answer, or the error, as the operator reads it ---------------------------

def answering(result: object = None, error: Exception | None = None) -> ctl.Command:
    """An agent's command that answers ``result`` or raises ``error``."""
    def call(api, args):
        if error is not None:
            raise error
        return result
    return ctl.Command("test", call, ctl._host_info)


@pytest.mark.parametrize("error,line", [
    (AgentError("instance x: no such instance\nTraceback (most recent call last): ..."),
     "instance x: no such instance"),
    # The host that did not answer, which a conductor's command may not name.
    (NoAnswer("h3", "get_host_info", 1), "no answer from h3 within 1s: the host may be "
     "down, or its compute-agent not running or not connected to this broker"),
    (BrokerUnreachable("no connection"), "the message broker did not answer within 1s: "
     "is it running, and is [DEFAULT] transport_url right? (see --debug)"),
])
def test_an_error_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, error, line):
    assert run_ctl(tmp_path, monkeypatch, answering(error=error), timeout=1,
                   argv=("host-info", "h2", "--json")) == 1
    assert json.loads(capsys.readouterr().out) == {"error": line, "exit_code": 1}


def test_a_live_migration_without_an_answer_says_how_to_resume_it(tmp_path, monkeypatch,
                                                                  capsys):
    def call(api, args, conf):
        raise NoAnswer("h2", "live_migrate", 1)

    assert run_ctl(tmp_path, monkeypatch, ctl.Command("test", call, conductor=True),
                   timeout=1, argv=("live-migrate", "inst", "--target", "h2",
                                    "--migration", MIGRATION.upper())) == 1
    assert capsys.readouterr().err.endswith(
        f"; live migration {MIGRATION} may be under way: run it again with --migration "
        f"{MIGRATION} to finish or roll it back\n")


def test_the_answer_is_rendered_for_a_reader(tmp_path, monkeypatch, capsys):
    info = {"providers": 3, "host": "h2", "zeta": 1, "root_uuid": "r", "boot_id": "b",
            "rpc_version": "1.4", "machine": "m", "alpha": 0}
    assert run_ctl(tmp_path, monkeypatch, answering(info), timeout=1,
                   argv=("host-info", "h2")) == 0
    assert capsys.readouterr().out.splitlines() == [
        "host: h2", "root uuid: r", "rpc version: 1.4", "providers: 3", "alpha: 0",
        "boot id: b", "machine: m", "zeta: 1"]


def test_an_evacuation_that_left_instances_behind_is_exit_1(tmp_path, monkeypatch, capsys):
    result = {"ok": False, "source": "h1", "instances": [
        {"instance": "a", "state": "running", "destination": "h2"},
        {"instance": "b", "state": "error", "error": "no host with room"}]}
    command = ctl.Command("test", lambda api, args, conf: result, ctl._evacuation_lines,
                          conductor=True)
    assert run_ctl(tmp_path, monkeypatch, command, timeout=1, argv=("evacuate", "h1")) == 1
    out, err = capsys.readouterr()
    assert out == "h1: 1 of 2 instances running elsewhere\n"
    assert err.endswith("not every instance was evacuated (see above)\n")


def test_a_steps_answer_is_one_line_per_field():
    assignment = {"resource_class": "VGPU", "amount": 1, "device_id": "m1",
                  "provider_uuid": "p1", "owner": "migration", "state": "claimed",
                  "migration_uuid": "mig"}
    assert ctl._result({"uuid": "i1", "migration_uuid": "mig", "state": "finished",
                        "assignments": [assignment], "instance": None,
                        "devices": [{"kind": "vgpu", "device_id": "m1",
                                     "assignment_id": "a1"}]}) == [
        "instance: i1", "migration: mig", "state: finished", "assignments: 1",
        "  VGPU x1  device m1  provider p1  migration  claimed  migration mig",
        "instance: gone from this host", "devices: 1", "  vgpu  m1  assignment a1"]


def test_hosts_say_when_each_last_answered_if_known():
    assert ctl._hosts_lines([
        {"host": "h1", "state": "up", "last_seen": 0.0, "instances": 2},
        {"host": "h2", "state": "down", "last_seen": None, "instances": 1}]) == [
        "h1  up  last seen 1970-01-01T00:00:00Z  instances 2",
        "h2  down  last seen unknown  instances 1"]


def test_nothing_to_evacuate_is_said():
    assert ctl._evacuation_lines({"source": "h1", "instances": []}) == [
        "nothing to evacuate on h1"]


@pytest.mark.parametrize("text,parsed", [("1", 1), ("32", 32), ("0", None), ("33", None),
                                         ("2.5", None), ("x", None)])
def test_parallel_is_a_whole_number_up_to_the_limit(text, parsed):
    if parsed is None:
        with pytest.raises(argparse.ArgumentTypeError, match="is not a whole number from 1 "
                                                             "to 32"):
            ctl.parallel_count(text)
    else:
        assert ctl.parallel_count(text) == parsed


def test_a_migration_is_a_uuid_made_canonical():
    assert ctl.migration_uuid(MIGRATION.upper()) == MIGRATION
    with pytest.raises(argparse.ArgumentTypeError, match="'m-1' is not a uuid"):
        ctl.migration_uuid("m-1")


@pytest.mark.parametrize("text,problem", [
    (None, "No such file or directory"),
    ("{", "not JSON: "),
    ("[]", "must be a JSON object with instance_uuid, spec, allocations"),
    ('{"instance_uuid": "i", "spec": {}}', "allocations: missing"),
    ('{"instance_uuid": "i", "spec": {}, "allocations": {}, "flavor": 1}',
     "flavor: unknown field (expected instance_uuid, spec, allocations)"),
])
def test_a_spec_file_that_is_not_the_format_is_named_with_what_is_wrong(tmp_path, text,
                                                                        problem):
    path = tmp_path / "spec.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SpecFileError) as refused:
        ctl.read_spec(str(path), ctl.BUILD_FIELDS)
    assert str(refused.value).startswith(f"spec file {path}: ")
    assert problem in str(refused.value)


def test_an_agents_error_is_read_by_its_first_line():
    assert ctl.first_line(AgentError("refused\n  File ...")) == "refused"
    assert ctl.first_line(AgentError("")) == "AgentError"


def test_ctl_names_its_reply_queue_at_random_with_the_queue_manager_on(
        tmp_path, monkeypatch, capsys):
    """compute_agent/messaging.py name_reply_queues_at_random: ctl runs once."""
    def call(api, args, conf):
        return {"use_queue_manager": conf.oslo_messaging_rabbit.use_queue_manager}
    assert run_ctl(tmp_path, monkeypatch, ctl.Command("test", call, conductor=True),
                   timeout=5, more_config="[oslo_messaging_rabbit]\nuse_queue_manager = true\n"
                   ) == 0
    assert json.loads(capsys.readouterr().out) == {"use_queue_manager": False}
