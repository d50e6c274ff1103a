"""compute-agent-ctl (compute_agent/cmd/ctl.py): the --spec file's
documented format and its example, its tree by Placement's field names, and
its watchdog, call by call. (The commands as subprocesses:
tests/functional/test_ctl.py and test_cli.py.)"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from compute_agent.cmd import ctl
from compute_agent.exception import InvalidRequest
from compute_agent.rpc import broker
from compute_agent.rpc import client as rpc_client
from compute_agent.rpc import schemas as rpc_schemas
from compute_agent.rpc.outstanding import OutstandingCalls
from compute_agent.tree.provider_tree import tree_lines
from tests.unit.clocks import FakeClock
from tests.unit.rpc.test_broker import WRONG_ADDRESS

TOP = Path(__file__).resolve().parents[3]
EXAMPLE = TOP / ctl.EXAMPLE_SPEC


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


def run_ctl(tmp_path, monkeypatch, command: ctl.Command, timeout: float) -> int:
    conf = tmp_path / "ctl.conf"
    conf.write_text("[DEFAULT]\ntransport_url = rabbit://guest:guest@127.0.0.1:1/\n")
    monkeypatch.setitem(ctl.COMMANDS, "hosts", command)
    monkeypatch.setattr(ctl, "BROKER_GRACE", 0.5)
    return ctl.main(["--config-file", str(conf), "--timeout", str(timeout),
                     "hosts", "--json"])


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
        "the message broker did not answer within 1.5s")


def test_a_command_stuck_between_calls_blames_placement(tmp_path, monkeypatch, capsys,
                                                        clock, stuck):
    assert run_ctl(tmp_path, monkeypatch, placement_read_of(1.6, stuck),
                   timeout=1) == 1
    assert json.loads(capsys.readouterr().out)["error"].startswith(
        "Placement did not answer within 1.5s")


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
