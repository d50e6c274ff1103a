"""The real commands on a config that can never work: exit 2, one line on
stderr naming the section, the option and the value, and nothing written
to state_path. No Placement is needed: nothing gets that far."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from compute_agent.rpc.host_server import host_queues
from tests.functional.helpers import assert_refused, wait_for, write_conf
from tests.functional.private_services import PrivateRabbitMQ
from tests.functional.test_daemon import start_daemon

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
    return run("compute_agent.cmd.agent", conf, "--once"), tmp_path / "state"


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
    ("compute_agent.cmd.manage", ["tree"]),
    ("compute_agent.cmd.ctl", ["host-info", "somehost"]),
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
    done = run("compute_agent.cmd.agent", conf, "--once")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"store {store}: cannot be opened: not a regular file" in lines[0]


# --- names the agent does not read --------------------------------------------

COMMANDS = [
    ("compute_agent.cmd.agent", ["--once"]),
    ("compute_agent.cmd.agent", []),
    ("compute_agent.cmd.manage", ["status"]),
    ("compute_agent.cmd.manage", ["upgrade-check"]),
    ("compute_agent.cmd.ctl", ["host-info", "somehost"]),
]


def conf_with(tmp_path: Path, extra: str) -> Path:
    conf = write_conf(tmp_path, NO_PLACEMENT, "failfast", HOST)
    conf.write_text(conf.read_text() + extra)
    return conf


@pytest.mark.parametrize("module,args", COMMANDS)
@pytest.mark.parametrize("extra,named", [
    ("[devices]\nenabled_mdev_type = nvidia-35\n",
     "[devices] enabled_mdev_type: unknown option; did you mean enabled_mdev_types?"),
    ("[pmemm]\nnamespaces = LABEL:ns0\n", "[pmemm]: unknown section; did you mean [pmem]?"),
    ("[DEFAULT]\nUPDATE_INTERVAL = 5\n",
     "[DEFAULT] UPDATE_INTERVAL: unknown option; did you mean update_interval?"),
    ("[placement]\nendpont = http://127.0.0.1:9\n",
     "[placement] endpont: unknown option; did you mean endpoint?"),
])
def test_bug_a_misspelt_name_stops_every_command_naming_the_file_and_the_known_name(
        tmp_path, module, args, extra, named):
    conf = conf_with(tmp_path, extra)
    done = run(module, conf, *args)
    assert_refused(done, tmp_path / "state", f"{conf}: {named}")


def test_names_of_another_version_are_one_warning_and_the_agent_runs(tmp_path):
    """A fleet's config that a newer agent reads more of: the older one
    says so once and goes on (here to its cycle, which fails for want of
    a Placement)."""
    conf = conf_with(tmp_path, "[DEFAULT]\nupdate_interval_max = 5\n"
                     "[newer_feature]\nenabled = true\n"
                     "[mdev_nvidia-36]\ndevice_addresses = 0000:81:00.0\n")
    done = run("compute_agent.cmd.agent", conf, "--once")
    warnings = [line for line in done.stderr.splitlines() if "Not read by this version" in line]
    assert done.returncode == 1 and "cycle failed" in done.stderr, done.stderr
    assert len(warnings) == 1 and " WARNING " in warnings[0], done.stderr
    assert all(name in warnings[0] for name in (
        "[DEFAULT] update_interval_max", "[newer_feature]", "[mdev_nvidia-36]"))


# --- values checked before anything is written ---------------------------------

LONG_NAME = "x" * 300


@pytest.mark.parametrize("module,args", COMMANDS[:3])
def test_bug_a_log_file_name_too_long_is_one_line_in_every_command(tmp_path, module, args):
    conf = conf_with(tmp_path, f"[DEFAULT]\nlog_file = {tmp_path}/{LONG_NAME}.log\n")
    done = run(module, conf, *args)
    assert_refused(done, tmp_path / "state", "[DEFAULT] log_file: a name in the path is "
                   "longer than 255 bytes (304)")


@pytest.mark.parametrize("extra,named", [
    ("[fake]\nstate_file = {tmp}\n", "[fake] state_file: a directory, not a file"),
    ("[DEFAULT]\ntransport_url = kafka://127.0.0.1:9092/\n",
     "[DEFAULT] transport_url: the kafka driver is not installed"),
    ("[DEFAULT]\nlogging_default_format_string = %(nosuchkey)s\n",
     "[DEFAULT] logging_default_format_string: a log record has no field 'nosuchkey'"),
    ("[DEFAULT]\nlogging_context_format_string = %(message)d\n",
     "[DEFAULT] logging_context_format_string: not a %-format string"),
    ("[DEFAULT]\nowner_trait = CUSTOM_" + "X" * 250 + "\n",
     "[DEFAULT] owner_trait: not an OWNER_* trait of os-traits nor CUSTOM_ followed by up "
     "to 248"),
    ("[DEFAULT]\nowner_trait = CUSTOM_lower\n", "[DEFAULT] owner_trait: not an OWNER_*"),
    ("[metrics]\nlisten = 192.0.2.1:9100\n", "[metrics] listen: cannot serve metrics there: "
     "not an address of this host (value: '192.0.2.1:9100')"),
    ("[metrics]\nlisten = nosuchhost.invalid:9100\n",
     "[metrics] listen: the host name does not resolve"),
])
@pytest.mark.parametrize("once", [True, False])
def test_bug_a_value_that_cannot_work_is_refused_before_anything_is_written(
        tmp_path, extra, named, once):
    conf = conf_with(tmp_path, extra.format(tmp=tmp_path))
    done = run("compute_agent.cmd.agent", conf, *(["--once"] if once else []))
    assert_refused(done, tmp_path / "state", named)


def test_bug_a_busy_metrics_port_stops_the_daemon_before_it_writes_anything(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = conf_with(tmp_path, f"[metrics]\nlisten = 127.0.0.1:{port}\n")
        done = run("compute_agent.cmd.agent", conf)
        # Beside a running agent its port is rightly in use: not a refusal
        # for the commands that do not serve it.
        status = run("compute_agent.cmd.manage", conf, "status")
    assert_refused(done, tmp_path / "state", "[metrics] listen: cannot serve metrics there: "
                   "address already in use", f"'127.0.0.1:{port}'")
    assert "listen" not in status.stderr


# --- the lines themselves ------------------------------------------------------

@pytest.mark.parametrize("section,option,value,length", [
    ("placement", "timeout", "x" * 200_000, 200_000),
    ("pmem", "namespaces", "x" * 200_000, 200_000),
    ("compute", "cpu_dedicated_set", "0," * 200_000 + "a", 400_001),
    ("DEFAULT", "host", "h" * 200_000, 200_000),
])
def test_bug_a_long_value_is_cut_with_its_length_in_a_line_of_300(
        tmp_path, section, option, value, length):
    conf = conf_with(tmp_path, f"[{section}]\n{option} = {value}\n")
    done = run("compute_agent.cmd.agent", conf, "--once")
    assert_refused(done, tmp_path / "state", f"[{section}] {option}:",
                   f"({length} characters)")
    assert len(done.stderr.strip()) <= 300, done.stderr[:400]


def test_bug_a_bad_value_of_a_deprecated_option_is_one_line(tmp_path):
    conf = conf_with(tmp_path, "[DEFAULT]\nreserved_host_memory_mb = abc\n")
    done = run("compute_agent.cmd.agent", conf, "--once")
    assert_refused(done, tmp_path / "state", "[DEFAULT] reserved_host_memory_mb:", "'abc'")


def test_bug_a_config_file_starting_with_a_byte_order_mark_is_read(tmp_path):
    conf = conf_with(tmp_path, "[DEFAULT]\nupdate_interval = 7\n")
    conf.write_bytes(b"\xef\xbb\xbf" + conf.read_bytes())
    done = run("compute_agent.cmd.agent", conf, "--once")
    assert done.returncode == 1 and "cycle failed" in done.stderr, done.stderr
    assert "error:" not in done.stderr and "Not read" not in done.stderr


# --- the broker ------------------------------------------------------------------

def test_bug_a_broker_that_refuses_the_credentials_is_exit_2_in_one_line(tmp_path, services):
    """The machine's RabbitMQ, asked with guest and a wrong password (which
    changes nothing there): refused for good, so systemd must not retry."""
    conf = conf_with(tmp_path, "[DEFAULT]\n"
                     "transport_url = rabbit://guest:not-the-password@127.0.0.1:5672/\n")
    done = run("compute_agent.cmd.agent", conf)
    assert_refused(done, tmp_path / "state", "[DEFAULT] transport_url: the message broker "
                   "at rabbit://127.0.0.1:5672/ refused the credentials of user 'guest'")
    assert "not-the-password" not in done.stderr


def agent_daemon(conf: Path) -> subprocess.Popen:
    """The daemon started on ``conf``, its standard error piped."""
    env = {**os.environ, "PYTHONPATH": str(TOP)}
    return subprocess.Popen([sys.executable, "-m", "compute_agent.cmd.agent", "--config-file",
                             str(conf)], stderr=subprocess.PIPE, text=True, env=env)


def test_a_broker_that_does_not_answer_is_waited_for(tmp_path):
    """Not a refusal: the daemon goes on and its driver keeps trying."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused
        conf = conf_with(tmp_path, f"[DEFAULT]\ntransport_url = "
                         f"rabbit://guest:guest@127.0.0.1:{port}/\n")
        daemon = agent_daemon(conf)
        seen: list[str] = []

        def read_lines() -> None:
            for line in daemon.stderr:
                seen.append(line)

        reader = threading.Thread(target=read_lines, daemon=True)
        reader.start()
        try:
            # Until the driver says it waits: a fixed wait would be too
            # short on a loaded machine, where start-up alone takes seconds.
            wait_for(lambda: any("did not answer (connection refused)" in line
                                 for line in seen) or daemon.poll() is not None, 120)
            assert daemon.poll() is None, "".join(seen)
        finally:
            daemon.kill()
            daemon.wait(30)
            reader.join(30)
    stderr = "".join(seen)
    assert "did not answer (connection refused)" in stderr, stderr
    assert "error:" not in stderr


def test_bug_a_broker_that_comes_back_refusing_the_credentials_is_exit_2_in_one_line(
        tmp_path):
    """A RabbitMQ node of the test's own, away when the daemon starts (it
    goes on, and waits for it), back refusing guest's wrong password: the
    daemon stops with the same one line, not a traceback and exit 1."""
    node = PrivateRabbitMQ().start()
    try:
        node.stop_app()
        conf = conf_with(tmp_path, "[DEFAULT]\ntransport_url = "
                         f"rabbit://guest:not-the-password@127.0.0.1:{node.port}/\n")
        daemon = agent_daemon(conf)
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                daemon.wait(timeout=6)
            node.start_app()
            daemon.wait(timeout=90)
        finally:
            daemon.kill()
            _, stderr = daemon.communicate(timeout=30)
    finally:
        node.close()
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert daemon.returncode == 2, stderr
    assert errors == [line for line in stderr.splitlines() if " ERROR " in line
                      or "Traceback" in line or "error:" in line], stderr
    assert len(errors) == 1 and errors[0].endswith(
        f"[DEFAULT] transport_url: the message broker at rabbit://127.0.0.1:{node.port}/ "
        "refused the credentials of user 'guest': correct the user or password in "
        "transport_url, or the broker's users"), stderr
    assert "not-the-password" not in stderr


def test_bug_a_queue_left_of_another_type_is_exit_2_in_one_line_naming_it(tmp_path):
    """The host's classic queues and the control exchange, left by the
    agent that ran before rabbit_quorum_queue was turned on: RabbitMQ
    refuses, for good, to declare them quorum and durable (PRECONDITION_FAILED,
    inequivalent arg). Was a traceback and exit 1, which systemd restarts,
    and the broker refuses again. Deleted as each line says, they are
    declared quorum and durable."""
    node = PrivateRabbitMQ().start()
    log = tmp_path / "agent.log"

    def refused() -> str:
        """The one error line of a start on ``conf``."""
        done = run("compute_agent.cmd.agent", conf)
        errors = [line for line in done.stderr.splitlines() if " ERROR " in line
                  or "Traceback" in line or "error:" in line]
        assert done.returncode == 2 and len(errors) == 1, done.stderr
        return errors[0]

    try:
        conf = conf_with(tmp_path, f"[DEFAULT]\ntransport_url = {node.url}\n")
        serve_once(conf, log)
        queues = host_queues("failfast")
        assert {q: node.queue_types()[q] for q in queues} == dict.fromkeys(queues, "classic")
        conf.write_text(conf.read_text() + "[oslo_messaging_rabbit]\nrabbit_quorum_queue = true\n")
        assert refused().endswith(
            "[oslo_messaging_rabbit] rabbit_quorum_queue: the broker has queue "
            "'compute-agent.failfast' as classic; this config asks for quorum (value: True). "
            "A stopped agent's queues hold nothing of value: delete its two (rabbitmqctl "
            "delete_queue), then start it")
        for queue in queues:
            node.delete_queue(queue)
        assert refused().endswith(
            "[oslo_messaging_rabbit] rabbit_quorum_queue: the broker has exchange 'openstack' "
            "not durable; this config asks for it durable (value: True). Every agent and "
            "conductor shares it: set them all alike; to change it, delete it (rabbitmqadmin) "
            "with all of them stopped")
        with node.amqp() as connection:
            connection.channel().exchange_delete("openstack")
        serve_once(conf, log)
        assert {q: node.queue_types()[q] for q in queues} == dict.fromkeys(queues, "quorum")
    finally:
        node.close()


def serve_once(conf: Path, log: Path) -> None:
    """The daemon on ``conf`` started, serving RPC, and stopped."""
    daemon = start_daemon(conf, log)  # its log begins afresh
    try:
        wait_for(lambda: "running as host" in log.read_text() or daemon.poll() is not None,
                 120)
        assert daemon.poll() is None, log.read_text()
    finally:
        daemon.terminate()
        daemon.wait(60)
