"""compute-agent-manage (compute_agent/cmd/manage.py): audit's report and
exit codes, rebuild-store's refusals and its plan, device's request
(checked before the agent is asked), its wait for a cleaning and its
lines, bus-permissions' request and its rabbitmqctl lines, and the exit
codes of each kind of error. With a fake agent's
answers, an agent on the fake host and a fake Placement. (The commands as
subprocesses: tests/functional/test_cli.py, test_status.py,
test_store_lost.py.)"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from compute_agent.cmd import common, manage
from compute_agent.cmd.manage import (
    DeviceAction,
    bus_permissions_request,
    device_request,
    device_use_line,
    print_bus_permissions,
)
from compute_agent.dependencies import Unknown
from compute_agent.drivers.fake import FakeDriver
from compute_agent.exception import AgentError, ConfigError, shown
from compute_agent.rpc import client as rpc_client
from compute_agent.rpc.errors import NoAnswer
from compute_agent.store import lock, node_identity
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import stored_host
from compute_agent.store.queries import all_instances
from compute_agent.store.store import STORE_FILE, Store
from compute_agent.tree.host_tree import TreePolicy, build_tree
from tests.unit.clocks import FakeClock
from tests.unit.daemon.agents import (
    HOST,
    ROOT,
    FakePlacement,
    agent_on_fake_host,
    fake_agent_conf_file,
)

INSTANCE = "3c1f5a9e-7b2d-4e8f-a6c0-1d9b8e7f6a5c"


def manage_conf(conf_file: Path, *args: str):
    """The config of ``compute-agent-manage --config-file conf_file args``."""
    command = manage.cfg.SubCommandOpt("command", handler=manage.add_parsers)
    return common.load_config(["--config-file", str(conf_file), *args],
                              [command], command_help=manage.HELP)


def device_conf(conf_file: Path, *args: str):
    return manage_conf(conf_file, "device", *args)


@pytest.mark.parametrize("args,line", [
    (["clean"], "device clean: ADDRESS is required"),
    (["clean", "81:00.0"],
     "device clean: ADDRESS: not a PCI address dddd:bb:ss.f (value: '81:00.0')"),
    (["release", "0000:81:00.0"],
     "device release: gives the device back to scheduling; say --yes once it is clean"),
])
def test_device_refuses_a_bad_request_before_asking_the_agent(conf_file, args, line):
    with pytest.raises(ConfigError) as caught:
        device_request(device_conf(conf_file, *args))
    assert str(caught.value) == line


def test_device_takes_an_address_in_either_case(conf_file):
    assert device_request(device_conf(conf_file, "release", "0000:AF:00.0", "--yes")) == (
        DeviceAction.RELEASE, "0000:af:00.0")
    assert device_request(device_conf(conf_file, "list")) == (DeviceAction.LIST, None)


def test_a_device_use_is_one_line():
    entry = {"address": "0000:af:00.0", "state": "used", "reason": "", "held": False,
             "cleaning": False}
    assert device_use_line(entry) == "0000:af:00.0: used"
    assert device_use_line({**entry, "held": True}) == "0000:af:00.0: held by an instance"
    assert device_use_line({**entry, "cleaning": True}) == "0000:af:00.0: being cleaned"
    assert device_use_line({**entry, "state": "cleaning_failed", "reason": "exit status 4"}
                           ) == "0000:af:00.0: cleaning failed (exit status 4)"


# --- device: through the running agent ----------------------------------------

class DeviceUses:
    """The agent's answers to device's calls: the uses listed, one list
    per call (the last one again once they run out), or an error."""

    def __init__(self, *listed: list[dict], error: Exception | None = None) -> None:
        self.listed = list(listed)
        self.error = error
        self.calls: list[tuple] = []
        self.closed = False

    def _answer(self, call: tuple):
        self.calls.append(call)
        if self.error is not None:
            raise self.error

    def list_device_uses(self, host: str) -> list[dict]:
        self._answer(("list", host))
        return self.listed.pop(0) if len(self.listed) > 1 else self.listed[0]

    def release_device(self, host: str, address: str) -> dict:
        self._answer(("release", host, address))
        return {"address": address, "state": "clean"}

    def clean_device(self, host: str, address: str) -> None:
        self._answer(("clean", host, address))

    def close(self) -> None:
        self.closed = True


def use(state: str, cleaning: bool = False, reason: str = "") -> dict:
    return {"address": "0000:af:00.0", "state": state, "reason": reason, "held": False,
            "cleaning": cleaning}


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """manage's time: each poll's sleep moves the clock on."""
    clock = FakeClock()

    class Time:
        monotonic = clock

        @staticmethod
        def sleep(seconds: float) -> None:
            clock.advance(seconds)
            assert clock() < 2000, "still polling long past any deadline"

        time = clock

    monkeypatch.setattr(manage, "time", Time)
    return clock


def test_a_cleaning_is_waited_for_until_the_device_is_back(clock):
    """Used and not being cleaned yet: its cleaning is still to begin."""
    api = DeviceUses([use("used")], [use("used", cleaning=True)], [])
    assert manage.wait_for_cleaning(api, "h", "0000:af:00.0", clock() + 60) == {
        "address": "0000:af:00.0", "state": "clean", "reason": "", "held": False,
        "cleaning": False}
    assert len(api.calls) == 3


def test_a_cleaning_that_failed_ends_the_wait_with_why(clock):
    failed = use("cleaning_failed", reason="exit status 4")
    api = DeviceUses([use("used", cleaning=True)], [failed])
    assert manage.wait_for_cleaning(api, "h", "0000:af:00.0", clock() + 60) == failed


def test_a_cleaning_longer_than_the_wait_is_answered_as_it_stands(clock):
    api = DeviceUses([use("used", cleaning=True)])
    started = clock()
    assert manage.wait_for_cleaning(api, "h", "0000:af:00.0", started + 1) == use(
        "used", cleaning=True)
    assert 1 < clock() - started <= 1 + manage.CLEAN_POLL_S


@pytest.fixture
def agent_api(monkeypatch):
    """device's agent: the answers a test sets."""
    answers = DeviceUses([])
    monkeypatch.setattr(rpc_client, "ComputeAgentAPI", lambda conf, timeout: answers)
    return answers


def test_device_lists_the_uses_one_a_line(conf_file, agent_api, capsys):
    agent_api.listed = [[use("used"), {**use("used", cleaning=True), "address": "0000:b0:00.0"}]]
    assert manage.device(device_conf(conf_file, "list")) == 0
    assert capsys.readouterr().out == "0000:af:00.0: used\n0000:b0:00.0: being cleaned\n"
    assert agent_api.calls == [("list", "here")] and agent_api.closed
    agent_api.listed = [[]]
    manage.device(device_conf(conf_file, "list"))
    assert capsys.readouterr().out == "no one-time-use device waits\n"


def test_device_clean_that_fails_is_exit_1(conf_file, agent_api, capsys, clock):
    agent_api.listed = [[use("cleaning_failed", reason="exit status 4")]]
    assert manage.device(device_conf(conf_file, "clean", "0000:AF:00.0", "--json")) == 1
    assert json.loads(capsys.readouterr().out)["reason"] == "exit status 4"
    assert agent_api.calls[0] == ("clean", "here", "0000:af:00.0")


def test_device_release_gives_the_device_back(conf_file, agent_api, capsys):
    assert manage.device(device_conf(conf_file, "release", "0000:af:00.0", "--yes")) == 0
    assert agent_api.calls == [("release", "here", "0000:af:00.0")]
    assert capsys.readouterr().out == "0000:af:00.0: clean\n"


@pytest.mark.parametrize("error,code,line", [
    (NoAnswer("here", "list_device_uses", 30), 2,
     "the agent of here did not answer: is compute-agent running? (list_device_uses to "
     "here: no answer within 30s)"),
    (AgentError("not one-time-use\nTraceback (most recent call last):"), 1,
     "not one-time-use"),
])
def test_device_errors_are_one_line_and_their_exit_code(conf_file, agent_api, capsys,
                                                         error, code, line):
    agent_api.error = error
    assert manage.device(device_conf(conf_file, "list", "--json")) == code
    assert json.loads(capsys.readouterr().out) == {"error": line, "exit_code": code}
    assert agent_api.closed


def test_a_bad_device_request_asks_the_agent_nothing(conf_file, agent_api, capsys):
    assert manage.device(device_conf(conf_file, "release", "0000:af:00.0")) == 1
    assert agent_api.calls == []
    assert capsys.readouterr().err.endswith("say --yes once it is clean\n")


# --- bus-permissions ------------------------------------------------------------

@pytest.mark.parametrize("host", ["a b", "h/1", "-h", "h" * 101, "h1\n"])
def test_bus_permissions_refuses_a_host_that_is_not_a_host_name(conf_file, host):
    with pytest.raises(ConfigError) as caught:
        bus_permissions_request(manage_conf(conf_file, "bus-permissions", "--", host))
    assert str(caught.value) == (
        "bus-permissions: HOST: not a host name of up to 100 letters, digits, '.', '-' "
        f"and _ (value: {shown(host)})")


def test_bus_permissions_are_for_rabbitmq_only(conf_file):
    conf_file.write_text("[DEFAULT]\nhost = here\ntransport_url = fake://\n")
    with pytest.raises(ConfigError, match="transport_url: not a rabbit:// URL"):
        bus_permissions_request(manage_conf(conf_file, "bus-permissions", "h1"))


@pytest.mark.parametrize("user", [None, "agent of h.1"])
def test_the_rabbitmqctl_lines_set_what_the_json_says(conf_file, capsys, user):
    """On the virtual host of transport_url, for HOST's user; the
    expressions quoted for a shell."""
    from compute_agent.rpc.bus_permissions import bus_permissions, queue_naming
    conf_file.write_text("[DEFAULT]\nhost = here\ncontrol_exchange = cloud\n"
                         "transport_url = rabbit://u:p@r1:5672,u:p@r2:5672/cloud-vhost\n")
    as_user = ["--user", user] if user else []
    conf = manage_conf(conf_file, "bus-permissions", "h.1", "--json", *as_user)
    assert print_bus_permissions(conf) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == bus_permissions("h.1", queue_naming(conf)).as_dict()
    assert printed["topic"][0]["exchange"] == "cloud"

    conf = manage_conf(conf_file, "bus-permissions", "h.1", *as_user)
    assert print_bus_permissions(conf) == 0
    *described, permissions, topic = capsys.readouterr().out.splitlines()
    user = user or "h.1"
    assert described[0] == f"The agent of h.1, as broker user {user} on virtual host cloud-vhost, may"
    assert "    compute-agent-heartbeat.<any host>, compute-agent.h.1" in described
    assert shlex.split(permissions) == [
        "rabbitmqctl", "set_permissions", "-p", "cloud-vhost", user,
        printed["configure"], printed["write"], printed["read"]]
    [on_cloud] = printed["topic"]
    assert shlex.split(topic) == [
        "rabbitmqctl", "set_topic_permissions", "-p", "cloud-vhost", user, "cloud",
        on_cloud["write"], on_cloud["read"]]


def test_a_bad_host_is_one_line_and_exit_2(tmp_path, capsys):
    conf_file = tmp_path / "agent.conf"
    conf_file.write_text("[DEFAULT]\nhost = here\n[placement]\nauth_type = placement_noauth2\n"
                         "endpoint = http://127.0.0.1:8778/\n")
    assert manage.main(["--config-file", str(conf_file), "bus-permissions", "h 1"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(": bus-permissions: HOST: not a host name of up to 100 letters, "
                         "digits, '.', '-' and _ (value: 'h 1')"), line


# --- audit: read-only, beside a running agent ---------------------------------

@pytest.fixture
def placement() -> FakePlacement:
    """Placement with the tree of the fake host of tests/unit/daemon/agents.py."""
    placement = FakePlacement()
    placement.has_tree(build_tree(FakeDriver(HOST).get_host_inventory(),
                                  TreePolicy(host="h", root_uuid=ROOT)).tree)
    return placement


@pytest.fixture
def beside(tmp_path, monkeypatch, placement):
    """audit's agent, opened beside the running one: an agent on the fake
    host, Placement the test's."""
    agent = agent_on_fake_host(tmp_path / "state", client=placement)
    monkeypatch.setattr(manage, "read_beside_agent", lambda conf, read: read(agent))
    yield agent
    agent.manager.tracker.store.close()


def test_an_audit_in_step_is_consistent_and_exit_0(conf_file, beside, capsys):
    assert manage.audit(manage_conf(conf_file, "audit")) == manage.AUDIT_CONSISTENT
    assert capsys.readouterr().out == "consistent\n"


def test_an_audit_lists_what_disagrees_fixing_nothing(conf_file, beside, placement, capsys):
    placement.held["stray"] = {ROOT: {"DISK_GB": 1}}
    assert manage.audit(manage_conf(conf_file, "audit")) == manage.AUDIT_INCONSISTENT
    assert capsys.readouterr().out.splitlines() == [
        "allocation_without_record  stray  holds allocations on 1 of our providers that "
        "no local record explains", "1 inconsistencies"]
    assert "stray" in placement.held


def test_an_audit_fixes_nothing_that_a_reconciliation_would(conf_file, beside, placement,
                                                           capsys):
    """A build's claim with no guest: rolled back at an agent's start,
    only reported by the audit."""
    tracker = beside.manager.tracker
    built = beside.build_model(beside.driver.get_host_inventory())
    tracker.set_pools(built.pools_by_uuid({}))
    cell = built.tree.named("h_numa_0").uuid
    placement.held[INSTANCE] = {cell: {"VCPU": 1}}
    tracker.claim_build(INSTANCE, {"name": "vm", "vcpus": 1, "memory_mb": 512},
                        {cell: {"resources": {"VCPU": 1}}})
    assert manage.audit(manage_conf(conf_file, "audit")) == manage.AUDIT_INCONSISTENT
    assert capsys.readouterr().out.splitlines() == [
        f"claim_stuck_claiming  {INSTANCE}  no guest holds these devices", "1 inconsistencies"]
    assert tracker.knows(INSTANCE)


def test_an_audit_without_placement_is_unknown_and_says_why(conf_file, beside, placement,
                                                            capsys):
    placement.down = True
    assert manage.audit(manage_conf(conf_file, "audit", "--json")) == manage.AUDIT_UNKNOWN
    assert json.loads(capsys.readouterr().out) == {
        "consistent": None, "findings": [],
        "unknown": ["Placement's allocations: Placement at http://placement did not "
                    "answer (down)"]}


def test_an_audit_that_cannot_open_the_store_is_unknown(conf_file, monkeypatch, capsys):
    def unreadable(conf, read):
        raise StoreError("store /var/lib/compute-agent/state.db is corrupt\nsecond line")

    monkeypatch.setattr(manage, "read_beside_agent", unreadable)
    assert manage.audit(manage_conf(conf_file, "audit")) == manage.AUDIT_UNKNOWN
    assert capsys.readouterr().out.splitlines() == [
        "not read: store /var/lib/compute-agent/state.db is corrupt", "not read: second line",
        "unknown"]


# --- rebuild-store and the exit codes of main ---------------------------------

@pytest.fixture
def agent_conf(tmp_path) -> Path:
    return fake_agent_conf_file(tmp_path)


def state(tmp_path) -> Path:
    return tmp_path / "state"


def rebuild(agent_conf: Path, *args: str) -> int:
    return manage.main(["--config-file", str(agent_conf), "rebuild-store", *args])


@pytest.fixture
def placement_of_node1(monkeypatch) -> FakePlacement:
    """Placement as rebuild-store's client: node1's tree under ROOT."""
    placement = FakePlacement()
    placement.has_tree(build_tree(FakeDriver(HOST).get_host_inventory(),
                                  TreePolicy(host="node1", root_uuid=ROOT)).tree)
    monkeypatch.setattr(manage, "PlacementClient", lambda adapter: placement)
    return placement


def test_rebuild_needs_the_root_it_rebuilds_for(tmp_path, agent_conf, capsys):
    assert rebuild(agent_conf, "--yes") == 1
    assert capsys.readouterr().err.endswith(
        f"{state(tmp_path)}/compute_id does not exist: no root provider to rebuild the "
        "store for\n")


# Each runs main once per state directory: the command holds its lock until
# the process ends, as the command's own process would.

@pytest.mark.parametrize("corrupt,refusal", [
    (False, "is there and valid: it is never overwritten"), (True, "is unusable (")])
def test_rebuild_never_overwrites_a_store(tmp_path, agent_conf, capsys, corrupt, refusal):
    node_identity.record(str(state(tmp_path)), ROOT)
    Store(state(tmp_path) / STORE_FILE, ROOT).close()
    if corrupt:
        (state(tmp_path) / STORE_FILE).write_bytes(b"not a database, not empty either")
    before = (state(tmp_path) / STORE_FILE).read_bytes()
    assert rebuild(agent_conf, "--yes") == 1
    assert refusal in capsys.readouterr().err
    assert (state(tmp_path) / STORE_FILE).read_bytes() == before


def test_a_dry_run_writes_nothing(tmp_path, agent_conf, placement_of_node1, capsys):
    node_identity.record(str(state(tmp_path)), ROOT)
    path = state(tmp_path) / STORE_FILE
    assert rebuild(agent_conf, "--dry-run") == 0
    assert capsys.readouterr().out == f"dry run: {path} not written\n"
    assert not path.exists()


def test_a_rebuild_writes_the_store(tmp_path, agent_conf, placement_of_node1, capsys):
    node_identity.record(str(state(tmp_path)), ROOT)
    path = state(tmp_path) / STORE_FILE
    assert rebuild(agent_conf, "--yes") == 0
    assert capsys.readouterr().out == f"{path} rebuilt: 0 instances, 0 assignments\n"
    store = Store(path, ROOT)
    assert store.read(all_instances) == {}
    store.close()


def test_a_rebuild_that_cannot_map_everything_is_refused_listing_it(
        tmp_path, agent_conf, placement_of_node1, capsys):
    node_identity.record(str(state(tmp_path)), ROOT)
    placement_of_node1.held["moving"] = {ROOT: {"DISK_GB": 1}}
    assert rebuild(agent_conf, "--dry-run") == 1
    assert "consumer moving: holds allocations on this host's providers but no guest of " \
           "ours is defined for it" in capsys.readouterr().err
    assert not (state(tmp_path) / STORE_FILE).exists()


def test_a_state_directory_in_use_is_a_store_error_and_exit_2(tmp_path, agent_conf,
                                                              capsys):
    node_identity.record(str(state(tmp_path)), ROOT)
    held = lock.acquire(str(state(tmp_path)))
    try:
        assert rebuild(agent_conf, "--yes") == 2
    finally:
        held.release()
    assert "is in use by another agent" in capsys.readouterr().err


def rename_host(agent_conf: Path, new: str) -> int:
    return manage.main(["--config-file", str(agent_conf), "rename-host", new])


class NamesServed:
    """Placement's roots by name and the bus's answers by host, as
    rename-host asks them."""

    def __init__(self, roots: dict[str, list[str]] | None = None,
                 answers: dict[str, dict | Unknown] | None = None) -> None:
        self.roots = roots or {}
        self.answers = answers or {}
        self.asked: list[str] = []

    def get_roots_named(self, name: str) -> list[str]:
        self.asked.append(f"placement {name}")
        return self.roots.get(name, [])

    def agent_serving(self, conf, host: str, deadline: float):
        self.asked.append(f"bus {host}")
        return self.answers.get(host)


@pytest.fixture
def served(monkeypatch) -> NamesServed:
    names = NamesServed()
    monkeypatch.setattr(manage, "PlacementClient", lambda adapter: names)
    monkeypatch.setattr(manage, "agent_serving", names.agent_serving)
    return names


def test_rename_host_records_the_configured_name(tmp_path, agent_conf, capsys, served):
    path = state(tmp_path) / STORE_FILE
    Store(path, ROOT, host="node0").close()
    node_identity.record(str(state(tmp_path)), ROOT)
    served.roots["node1"] = [ROOT]  # ours: renamed already, say
    assert rename_host(agent_conf, "node1") == 0
    assert served.asked == ["placement node1", "bus node0", "bus node1"]
    assert capsys.readouterr().out == (
        f"store {path} now belongs to host node1 (it belonged to host node0); the next "
        "start renames its root provider in Placement to node1\n")
    assert stored_host(path).name == "node1"


def test_rename_host_to_another_name_than_the_config_s_writes_nothing(tmp_path, agent_conf,
                                                                      capsys):
    path = state(tmp_path) / STORE_FILE
    Store(path, ROOT, host="node0").close()
    assert rename_host(agent_conf, "node2") == 1
    assert ("rename-host node2: [DEFAULT] host is node1 in the config; set it to node2 "
            "there first, nothing was written") in capsys.readouterr().err
    assert stored_host(path).name == "node0"


def test_rename_host_while_a_clone_serves_the_old_name_writes_nothing(
        tmp_path, agent_conf, capsys, served):
    path = state(tmp_path) / STORE_FILE
    Store(path, ROOT, host="node0").close()
    served.answers["node0"] = {"root_uuid": ROOT}
    assert rename_host(agent_conf, "node1") == 1
    assert ("rename-host node1: another agent serves host node0: it answers on the bus "
            "(a clone of this machine?); nothing was written") in capsys.readouterr().err
    assert stored_host(path).name == "node0"


def test_rename_host_when_the_bus_cannot_be_asked_writes_nothing(tmp_path, agent_conf,
                                                                   capsys, served):
    path = state(tmp_path) / STORE_FILE
    Store(path, ROOT, host="node0").close()
    served.answers["node0"] = Unknown("the broker did not answer")
    assert rename_host(agent_conf, "node1") == 1
    assert ("rename-host node1: whether another agent serves host node0 cannot be told: "
            "the broker did not answer; nothing was written") in capsys.readouterr().err
    assert stored_host(path).name == "node0"


def test_rename_host_beside_a_running_agent_is_exit_2(tmp_path, agent_conf, capsys):
    path = state(tmp_path) / STORE_FILE
    Store(path, ROOT, host="node0").close()
    held = lock.acquire(str(state(tmp_path)))
    try:
        assert rename_host(agent_conf, "node1") == 2
    finally:
        held.release()
    assert "is in use by another agent" in capsys.readouterr().err
    assert stored_host(path).name == "node0"


def test_no_store_to_accept_is_exit_2(tmp_path, agent_conf, capsys):
    assert manage.main(["--config-file", str(agent_conf), "accept-store"]) == 2
    assert (f"error: store {state(tmp_path) / STORE_FILE} is missing: there is no store to "
            "accept") in capsys.readouterr().err


def test_a_bad_config_is_exit_2_before_any_command(tmp_path, agent_conf, capsys,
                                                   monkeypatch):
    agent_conf.write_text(agent_conf.read_text() + "[DEFAULT]\nupdate_interval = 0\n")
    monkeypatch.setattr(sys, "argv", ["compute-agent-manage"])
    assert rebuild(agent_conf, "--yes") == 2
    assert capsys.readouterr().err.startswith(
        "compute-agent-manage: error: [DEFAULT] update_interval: ")
    assert not state(tmp_path).exists()
