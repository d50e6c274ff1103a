"""The real commands on a config that can never work: exit 2, one line on
stderr naming the section, the option and the value, and nothing written
to state_path. No Placement is needed: nothing gets that far."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.functional.helpers import write_conf

TOP = Path(__file__).resolve().parents[2]
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-7", "memory_mb": 4096}]}
NO_PLACEMENT = "http://127.0.0.1:9"


def run(module: str, conf: Path, *args: str) -> subprocess.CompletedProcess:
    """The command as installed, with this checkout's code."""
    env = {**os.environ, "PYTHONPATH": str(TOP)}
    return subprocess.run([sys.executable, "-m", module, "--config-file", str(conf), *args],
                          capture_output=True, text=True, timeout=60, env=env)


def agent_once(tmp_path: Path, placement: dict | None = None, **sections):
    conf = write_conf(tmp_path, NO_PLACEMENT, "failfast", HOST, **sections)
    if placement is not None:  # replace [placement] whole
        text = conf.read_text().split("[placement]\n")
        rest = text[1].split("\n[", 1)
        conf.write_text(text[0] + "[placement]\n"
                        + "".join(f"{k} = {v}\n" for k, v in placement.items())
                        + ("\n[" + rest[1] if len(rest) > 1 else ""))
    return run("agent.cmd.agent", conf, "--once"), tmp_path / "state"


def assert_refused(done, state: Path, *named: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert all(n in lines[0] for n in named), lines[0]
    assert not state.exists() or not any(state.iterdir())


@pytest.mark.parametrize("section,option,value", [
    ("DEFAULT", "update_interval", "99999999999999999999999"),
    ("compute", "cpu_dedicated_set", "0-7,^0-7"),
    ("compute", "cpu_shared_set", "1,,2"),
    ("pmem", "namespaces", "bad label!:ns0"),
    ("upgrade_levels", "compute_agent", "abc"),
    ("compute", "reserved_host_memory_mb", "10^23"),
    ("DEFAULT", "debug", "maybe"),
    ("oslo_messaging_rabbit", "heartbeat_rate", "0"),
])
def test_a_bad_value_is_one_line_and_exit_2_and_nothing_written(
        tmp_path, section, option, value):
    done, state = agent_once(tmp_path, **{section: {option: value}})
    assert_refused(done, state, f"[{section}] {option}:", repr(value))


def test_a_nameless_custom_mdev_class_is_refused(tmp_path):
    done, state = agent_once(tmp_path, devices={"enabled_mdev_types": "nvidia-35"},
                             **{"mdev_nvidia-35": {"mdev_class": "CUSTOM_"}})
    assert_refused(done, state, "[mdev_nvidia-35] mdev_class:", "'CUSTOM_'")


def test_no_auth_plugin_is_refused(tmp_path):
    done, state = agent_once(tmp_path, placement={"endpoint": NO_PLACEMENT})
    assert_refused(done, state, "[placement] auth_type: missing", "unset")


def test_an_unknown_auth_plugin_lists_the_known_ones(tmp_path):
    done, state = agent_once(tmp_path, placement={"auth_type": "passwort"})
    assert_refused(done, state, "[placement] auth_type: unknown auth plugin",
                   "password, placement_noauth2", "'passwort'")


def test_noauth2_without_its_endpoint_is_refused(tmp_path):
    done, state = agent_once(tmp_path, placement={"auth_type": "placement_noauth2"})
    assert_refused(done, state, "[placement] endpoint: missing")


def test_a_password_without_a_project_is_refused_and_never_shown(tmp_path):
    done, state = agent_once(tmp_path, placement={
        "auth_type": "password", "auth_url": "http://keystone:5000/v3",
        "username": "agent", "password": "s3cret-pw", "user_domain_name": "Default"})
    assert_refused(done, state, "[placement] project_name: missing")
    assert "s3cret-pw" not in done.stderr


def test_a_bad_transport_url_is_shown_without_its_password(tmp_path):
    done, state = agent_once(tmp_path, DEFAULT={
        "transport_url": "rabbit://agent:s3cret-pw@broker:99999/"})
    assert_refused(done, state, "[DEFAULT] transport_url: port 99999",
                   "rabbit://agent:***@broker:99999/")
    assert "s3cret-pw" not in done.stderr


@pytest.mark.parametrize("module,args", [
    ("agent.cmd.manage", ["tree"]),
    ("agent.cmd.ctl", ["host-info", "somehost"]),
])
def test_every_command_runs_the_check(tmp_path, module, args):
    conf = write_conf(tmp_path, NO_PLACEMENT, "failfast", HOST,
                      DEFAULT={"rpc_response_timeout": "-5"})
    done = run(module, conf, *args)
    assert_refused(done, tmp_path / "state", "[DEFAULT] rpc_response_timeout:", "'-5'")


def test_a_store_that_cannot_be_opened_is_one_line_naming_it(tmp_path):
    conf = write_conf(tmp_path, NO_PLACEMENT, "failfast", HOST)
    store = tmp_path / "state" / "state.db"
    store.mkdir(parents=True)
    (tmp_path / "state" / "compute_id").write_text("5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31\n")
    done = run("agent.cmd.agent", conf, "--once")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"store {store}: cannot be opened: not a regular file" in lines[0]
