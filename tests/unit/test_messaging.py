"""compute_agent/messaging.py: the waits on the broker bounded, so that a listener
stops, and a transport closes, soon after it is asked; the agent's errors
keep their types on the wire across the rename of ``agent``."""
from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from oslo_config import cfg

from compute_agent import config
from compute_agent.exception import InvalidRequest, NoSuchInstance
from compute_agent.messaging import (
    ALLOWED_EXMODS,
    QUEUE_MANAGER_LOCKS,
    accept_errors_sent_as_before,
    bound_broker_waits,
    name_reply_queues_at_random,
    sent_as_before,
    transport,
)


def rabbit_conf(**rabbit) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf([], default_config_files=[], default_config_dirs=[])
    for name, value in rabbit.items():
        conf.set_override(name, value, group="oslo_messaging_rabbit")
    return conf


def broker_wait(conf: cfg.ConfigOpts) -> float:
    """oslo.messaging's longest wait on the socket, as impl_rabbit reckons it."""
    rabbit = conf.oslo_messaging_rabbit
    return rabbit.heartbeat_timeout_threshold / rabbit.heartbeat_rate / 2


def test_the_waits_on_the_broker_last_at_most_the_bound():
    conf = rabbit_conf()
    assert broker_wait(conf) == 10  # oslo.messaging's defaults: 60 s, rate 3
    bound_broker_waits(conf, 0.5)
    assert broker_wait(conf) <= 0.5


def test_an_operators_shorter_wait_is_kept():
    conf = rabbit_conf(heartbeat_rate=600)
    bound_broker_waits(conf, 0.5)
    assert conf.oslo_messaging_rabbit.heartbeat_rate == 600


def test_with_heartbeats_off_nothing_is_changed():
    conf = rabbit_conf(heartbeat_timeout_threshold=0)
    bound_broker_waits(conf, 0.5)
    assert conf.oslo_messaging_rabbit.heartbeat_rate == 3


# --- errors on the wire across the rename of agent to compute_agent -------

def sent(error: Exception) -> dict:
    """What oslo.messaging puts on the wire for ``error`` raised by a
    call, after the server has named it as this release does."""
    import json
    import sys

    from oslo_messaging._drivers import common as wire
    try:
        raise sent_as_before(error)
    except Exception:
        return json.loads(wire.serialize_remote_exception(sys.exc_info()))


def rebuilt(data: dict) -> Exception:
    import json

    from oslo_messaging._drivers import common as wire
    accept_errors_sent_as_before()
    return wire.deserialize_remote_exception(json.dumps(data), ALLOWED_EXMODS)


def test_this_agents_error_is_named_as_0_3_0_callers_rebuild_it():
    data = sent(InvalidRequest("destination", "nowhere", "no such host"))
    assert (data["module"], data["class"]) == ("agent.exception", "InvalidRequest")
    assert data["args"] == ["destination", None, "no such host", "'nowhere'"]


def test_an_error_that_is_not_ours_keeps_its_name():
    data = sent(ValueError("x"))
    assert (data["module"], data["class"]) == ("builtins", "ValueError")


def test_an_error_sent_by_a_0_3_0_agent_reaches_this_caller_as_its_type():
    error = rebuilt({"module": "agent.exception", "class": "NoSuchInstance",
                     "message": "m", "tb": [], "args": ["0f0e"], "kwargs": {}})
    assert isinstance(error, NoSuchInstance) and error.args == ("0f0e",)


def test_an_error_sent_under_the_new_name_reaches_this_caller_as_its_type():
    """What the release after this one sends."""
    error = rebuilt({"module": "compute_agent.exception", "class": "NoSuchInstance",
                     "message": "m", "tb": [], "args": ["0f0e"], "kwargs": {}})
    assert isinstance(error, NoSuchInstance)


def test_a_round_trip_keeps_type_arguments_and_message():
    original = InvalidRequest("destination", "nowhere", "no such host")
    message = str(original)
    error = rebuilt(sent(original))
    assert isinstance(error, InvalidRequest)
    assert error.args == ("destination", None, "no such host", "'nowhere'")
    assert str(error).startswith(message)


def test_another_module_named_on_the_wire_is_not_rebuilt():
    error = rebuilt({"module": "agent.config", "class": "Opt", "message": "m", "tb": [],
                     "args": [], "kwargs": {}})
    assert type(error).__name__ == "RemoteError"


# --- oslo.messaging's queue manager (use_queue_manager) -------------------

@pytest.fixture
def queue_manager(tmp_path: Path) -> Iterator[cfg.ConfigOpts]:
    """A config with use_queue_manager, a host of its own and a state
    directory; after the test, the queue manager's counter in /dev/shm is
    removed and oslo's global lock_path is as it was."""
    conf = rabbit_conf(use_queue_manager=True)
    conf.set_override("host", f"qm-{uuid.uuid4().hex[:8]}")
    conf.set_override("state_path", str(tmp_path / "state"))
    conf.set_override("transport_url", "rabbit://guest:guest@127.0.0.1:1/")
    try:
        yield conf
    finally:
        rabbit = conf.oslo_messaging_rabbit
        Path(f"/dev/shm/{rabbit.hostname}_{rabbit.processname}_qmanager").unlink(missing_ok=True)
        cfg.CONF.clear_default("lock_path", group="oslo_concurrency")


def reply_queue_name(conf: cfg.ConfigOpts) -> str:
    """The name oslo.messaging gives a new reply queue of a transport made
    from ``conf`` (made without connecting to the broker)."""
    name: str = transport(conf)._driver._get_reply_queue_name()
    return name


def test_bug_the_queue_manager_numbered_queues_only_with_a_lock_path_the_agent_never_sets(
        queue_manager):
    """Was: every start with use_queue_manager failed, RequiredOptError for
    [oslo_concurrency] lock_path: oslo.concurrency reads that option from
    oslo's global config, which the agent (with a config of its own) never
    fills."""
    rabbit = queue_manager.oslo_messaging_rabbit
    first = reply_queue_name(queue_manager)
    assert first == f"reply_{queue_manager.host}:{rabbit.processname}:1"
    assert reply_queue_name(queue_manager) == f"reply_{queue_manager.host}:{rabbit.processname}:2"
    locks = Path(queue_manager.state_path) / QUEUE_MANAGER_LOCKS
    assert [p.name for p in locks.iterdir()] == [
        f"oslo_read_shm_{queue_manager.host}_{rabbit.processname}"]


def test_a_lock_path_the_process_set_itself_is_kept(queue_manager, tmp_path):
    """A conductor that calls agents from a service of its own, whose
    config gives oslo.concurrency its lock_path."""
    cfg.CONF.set_override("lock_path", str(tmp_path / "conductor"), group="oslo_concurrency")
    try:
        reply_queue_name(queue_manager)
    finally:
        cfg.CONF.clear_override("lock_path", group="oslo_concurrency")
    assert (tmp_path / "conductor").is_dir()
    assert not (Path(queue_manager.state_path) / QUEUE_MANAGER_LOCKS).exists()


def test_bug_every_call_failed_once_the_process_groups_leader_had_exited(
        queue_manager, monkeypatch):
    """Was: FileNotFoundError for /proc/PGID/stat in every call of a
    process started in the background by a script that had ended (seen in
    a CI run started with ``&``)."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    group = {"leader": gone.pid}
    monkeypatch.setattr(os, "getpgrp", lambda: group["leader"])

    def setpgid(pid: int, pgid: int) -> None:
        assert (pid, pgid) == (0, 0)
        group["leader"] = os.getpid()

    monkeypatch.setattr(os, "setpgid", setpgid)
    rabbit = queue_manager.oslo_messaging_rabbit
    assert reply_queue_name(queue_manager) == f"reply_{queue_manager.host}:{rabbit.processname}:1"
    assert group["leader"] == os.getpid()


def test_a_process_whose_group_leader_lives_stays_in_its_group(queue_manager, monkeypatch):
    """Under systemd, or in a shell's foreground (where Ctrl-C reaches the
    group)."""
    monkeypatch.setattr(os, "getpgrp", os.getpid)  # a leader alive, however pytest was run
    monkeypatch.setattr(os, "setpgid", lambda pid, pgid: pytest.fail("left its group"))
    reply_queue_name(queue_manager)


def test_the_queue_manager_names_queues_after_this_host_unless_told_otherwise():
    """Its default, the machine's name, is shared by every agent of a
    machine (several in tests and in tools/fleet), whose queues would take
    one another's messages."""
    conf = rabbit_conf()
    conf.set_override("host", "compute-7")
    assert conf.oslo_messaging_rabbit.hostname == "compute-7"
    conf.set_override("hostname", "bus-name-7", group="oslo_messaging_rabbit")
    assert conf.oslo_messaging_rabbit.hostname == "bus-name-7"


def test_ctl_names_its_reply_queues_at_random(queue_manager):
    """The queue manager's names are one per process group: two ctl
    commands run from two shells would share one reply queue and take
    each other's answers."""
    name_reply_queues_at_random(queue_manager)
    names = {reply_queue_name(queue_manager) for _ in range(2)}
    assert len(names) == 2
    assert all(re.fullmatch(r"reply_[0-9a-f]{32}", n) for n in names), names


def test_the_next_broker_after_a_lost_one_is_drawn_at_random_unless_told_otherwise():
    """oslo.messaging's round-robin came back, at each attempt, to the one
    node of three that was paused (tests/cluster/test_broker_cluster.py):
    the agent stayed deaf until that node resumed."""
    conf = rabbit_conf()
    assert conf.oslo_messaging_rabbit.kombu_failover_strategy == "shuffle"
    conf.set_override("kombu_failover_strategy", "round-robin", group="oslo_messaging_rabbit")
    assert conf.oslo_messaging_rabbit.kombu_failover_strategy == "round-robin"
