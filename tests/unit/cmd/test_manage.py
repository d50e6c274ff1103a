"""compute-agent-manage (compute_agent/cmd/manage.py): device's request,
checked before the agent is asked, and its lines; bus-permissions' request
and its rabbitmqctl lines. (The commands as
subprocesses: tests/functional/test_cli.py and test_status.py.)"""
from __future__ import annotations

import json
import shlex
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
from compute_agent.exception import ConfigError, shown


def manage_conf(conf_file: Path, *args: str):
    """compute-agent-manage's config, ``args`` its subcommand and after."""
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
