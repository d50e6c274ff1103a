"""What every console script does alike (compute_agent/cmd/common.py) and the
pure parts of the commands: the --spec file's documented format and its
example, --json errors, the --version, the --once summary line. (The
commands as subprocesses: tests/functional/test_cli.py.)"""
from __future__ import annotations

import json
import shlex
import threading
from importlib import metadata
from pathlib import Path

import pytest

from compute_agent.cmd import common, ctl
from compute_agent.cmd.daemon import once_summary
from compute_agent.daemon.service import CycleOutcome
from compute_agent.exception import ConfigError, InvalidRequest, shown
from compute_agent.placement.sync import SyncResult
from compute_agent.rpc import broker
from compute_agent.rpc import client as rpc_client
from compute_agent.rpc import schemas as rpc_schemas
from compute_agent.rpc.outstanding import OutstandingCalls
from compute_agent.tree.provider_tree import Provider, ProviderTree
from tests.unit.clocks import FakeClock
from tests.unit.rpc.test_broker import WRONG_ADDRESS

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / ctl.EXAMPLE_SPEC


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


MIGRATION = "1d2c3b4a-5f6e-4d7c-8b9a-0f1e2d3c4b5a"


@pytest.fixture
def conf_file(tmp_path) -> Path:
    path = tmp_path / "agent.conf"
    path.write_text("[DEFAULT]\nhost = here\n")
    return path


@pytest.mark.parametrize("argv", [
    ["--timeout", "5", "--debug", "--config-file", "F", "evacuate", "src", "--target", "h"],
    ["evacuate", "src", "--timeout", "5", "--target", "h", "-d", "--config-file", "F"],
    ["--config-file=F", "evacuate", "--timeout=5", "src", "--debug", "--target", "h"],
    ["evacuate", "src", "--target", "h", "--config-file", "F", "--debug", "--timeout", "5"],
], ids=["before", "after", "between", "last"])
def test_the_commands_own_options_come_before_or_after_its_subcommand(argv, conf_file):
    conf = common.load_config([str(conf_file) if a == "F" else a.replace("=F", f"={conf_file}")
                               for a in argv], ctl.cli_opts, command_help=ctl.HELP)
    assert (conf.timeout, conf.debug, conf.config_file, conf.host) == (
        5, True, [str(conf_file)], "here")
    assert (conf.command.name, conf.command.agent_host, conf.command.target) == (
        "evacuate", "src", "h")


def test_a_subcommands_own_options_and_what_follows_double_dash_stay_its_own(conf_file):
    conf = common.load_config(
        ["--config-file", str(conf_file), "live-migrate", "inst", "--target", "h",
         "--timeout", "7", "--migration", MIGRATION], ctl.cli_opts, command_help=ctl.HELP)
    assert (conf.command.instance, conf.command.target, conf.command.migration,
            conf.timeout) == ("inst", "h", MIGRATION, 7)
    conf = common.load_config(["--config-file", str(conf_file), "show", "h", "--",
                               "--debug"], ctl.cli_opts, command_help=ctl.HELP)
    assert (conf.command.instance, conf.debug) == ("--debug", False)


def test_version_is_the_installed_distributions():
    assert common.version() == metadata.version("compute-agent")


def test_an_error_with_json_is_one_object_on_stdout(capsys):
    assert common.report_error("no answer from h1\nsecond line", 1, as_json=True) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == {"error": "no answer from h1\nsecond line", "exit_code": 1}


def test_an_error_without_json_is_a_line_per_line_on_stderr(capsys):
    assert common.report_error(ValueError("a\nb"), 2, prefix="unknown: ") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert [line.split(": ", 1)[1] for line in err.splitlines()] == [
        "unknown: a", "unknown: b"]


def test_json_is_asked_for_by_the_flag_anywhere_on_the_line():
    assert common.json_requested(["--config-file", "f", "tree", "--json"])
    assert not common.json_requested(["--config-file", "f", "tree"])


def _provider(name: str) -> Provider:
    return Provider(uuid=f"00000000-0000-0000-0000-{len(name):012d}", name=name)


def test_once_summary_of_a_cycle_that_wrote():
    tree = ProviderTree([_provider("h"), _provider("h_numa_0")])
    outcome = CycleOutcome(True, result=SyncResult(writes=5, warnings=["w"], tree=tree))
    assert once_summary(outcome, 9, 0.4321) == (
        "cycle ok: 2 providers in Placement, 5 writes, 1 warnings, "
        "9 Placement requests, 0.43 s")


def test_once_summary_of_a_failed_cycle_gives_the_reason():
    outcome = CycleOutcome(False, "Placement unavailable, cycle abandoned: refused")
    assert once_summary(outcome, 1, 2.0) == (
        "cycle failed (1 Placement requests, 2.00 s): "
        "Placement unavailable, cycle abandoned: refused")


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


def manage_conf(conf_file: Path, *args: str):
    """compute-agent-manage's config, ``args`` its subcommand and after."""
    from compute_agent.cmd import manage
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
    from compute_agent.cmd.manage import device_request
    with pytest.raises(ConfigError) as caught:
        device_request(device_conf(conf_file, *args))
    assert str(caught.value) == line


def test_device_takes_an_address_in_either_case(conf_file):
    from compute_agent.cmd.manage import DeviceAction, device_request
    assert device_request(device_conf(conf_file, "release", "0000:AF:00.0", "--yes")) == (
        DeviceAction.RELEASE, "0000:af:00.0")
    assert device_request(device_conf(conf_file, "list")) == (DeviceAction.LIST, None)


def test_a_device_use_is_one_line():
    from compute_agent.cmd.manage import device_use_line
    entry = {"address": "0000:af:00.0", "state": "used", "reason": "", "held": False,
             "cleaning": False}
    assert device_use_line(entry) == "0000:af:00.0: used"
    assert device_use_line({**entry, "held": True}) == "0000:af:00.0: held by an instance"
    assert device_use_line({**entry, "cleaning": True}) == "0000:af:00.0: being cleaned"
    assert device_use_line({**entry, "state": "cleaning_failed", "reason": "exit status 4"}
                           ) == "0000:af:00.0: cleaning failed (exit status 4)"


@pytest.mark.parametrize("host", ["a b", "h/1", "-h", "h" * 101, "h1\n"])
def test_bus_permissions_refuses_a_host_that_is_not_a_host_name(conf_file, host):
    from compute_agent.cmd.manage import bus_permissions_request
    with pytest.raises(ConfigError) as caught:
        bus_permissions_request(manage_conf(conf_file, "bus-permissions", "--", host))
    assert str(caught.value) == (
        "bus-permissions: HOST: not a host name of up to 100 letters, digits, '.', '-' "
        f"and _ (value: {shown(host)})")


def test_bus_permissions_are_for_rabbitmq_only(conf_file):
    from compute_agent.cmd.manage import bus_permissions_request
    conf_file.write_text("[DEFAULT]\nhost = here\ntransport_url = fake://\n")
    with pytest.raises(ConfigError, match="transport_url: not a rabbit:// URL"):
        bus_permissions_request(manage_conf(conf_file, "bus-permissions", "h1"))


@pytest.mark.parametrize("user", [None, "agent of h.1"])
def test_the_rabbitmqctl_lines_set_what_the_json_says(conf_file, capsys, user):
    """On the virtual host of transport_url, for HOST's user; the
    expressions quoted for a shell."""
    from compute_agent.cmd.manage import print_bus_permissions
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
    from compute_agent.cmd import manage
    conf_file = tmp_path / "agent.conf"
    conf_file.write_text("[DEFAULT]\nhost = here\n[placement]\nauth_type = placement_noauth2\n"
                         "endpoint = http://127.0.0.1:8778/\n")
    assert manage.main(["--config-file", str(conf_file), "bus-permissions", "h 1"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(": bus-permissions: HOST: not a host name of up to 100 letters, "
                         "digits, '.', '-' and _ (value: 'h 1')"), line
