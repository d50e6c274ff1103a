"""Store faults under the real daemon (tests/reliability/store_faults.py):
a full disk, a read-only store, a store cut short while stopped."""
from __future__ import annotations

import logging
import uuid

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.rpc.errors import NoAnswer
from tests.functional.helpers import write_conf
from tests.functional.test_store_lost import HOST
from tests.reliability.store_faults import StoreDisk, StoreFaultHost, cut_in_half, refusal


@pytest.fixture
def host(tmp_path, placement, services):
    h = StoreFaultHost(tmp_path, placement.url)
    try:
        yield h
    finally:
        h.close()


def assert_refused_in_one_line(host: StoreFaultHost) -> str:
    proc, log = host.daemon.start()
    code, errors, text = refusal(proc, log)
    assert code == 2 and len(errors) == 1 and "Traceback" not in text, text
    return errors[0]


def test_a_full_disk_fails_builds_cleanly_and_loses_nothing(host):
    host.start()
    host.build()
    host.disk.fill()
    for _ in range(3):
        host.build()
    assert host.ledger.refused, "the full disk refused nothing: no fault was made"
    assert host.proc.poll() is None
    assert host.violations() == []

    host.disk.unfill()
    for instance in list(host.ledger.refused):
        host.build(instance)  # the conductor retries
    assert host.ledger.refused == []
    assert host.stop() == 0
    assert host.violations() == []
    host.start()  # the store it left opens
    assert host.violations() == []


def test_bug_a_full_disk_at_start_was_called_a_corrupt_store_to_rebuild(host):
    # The store could not be read for want of space (SQLite's "disk I/O
    # error"), and the agent said the store was unusable and should be
    # moved aside and rebuilt: a sound store, and the wrong remedy.
    host.start()
    host.build()
    assert host.stop() == 0
    host.disk.fill()
    line = assert_refused_in_one_line(host)
    # Read whole by the start check, it cannot be opened for writing.
    assert f"store {host.store}: cannot be opened" in line, line
    assert "file system is full" in line and "rebuild" not in line, line
    host.disk.unfill()
    host.start()
    assert host.violations() == []


def test_a_store_the_kernel_turns_read_only_fails_builds_cleanly_and_loses_nothing(host):
    host.start()
    first = host.build()
    host.disk.fail_read_only()
    host.build()
    host.build()
    assert len(host.ledger.refused) == 2
    assert host.proc.poll() is None
    # What it holds is still served, from memory.
    assert host.api.get_instance(host.daemon.name, first)["assignments"]
    log = host.daemon.dir / f"agent-{host.daemon.starts}.log"
    host.stop()
    assert "Traceback" not in log.read_text(), log.read_text()
    assert host.violations() == []

    host.disk.repair()
    host.start()
    for instance in list(host.ledger.refused):
        host.build(instance)  # the conductor retries
    assert host.ledger.refused == [] and len(host.ledger.acknowledged) == 3
    assert host.violations() == []


def test_an_agent_refuses_to_start_on_a_read_only_store(host):
    host.start()
    host.build()
    assert host.stop() == 0
    host.disk.remount("ro")
    line = assert_refused_in_one_line(host)
    assert str(host.store.parent) in line
    host.disk.remount("rw")
    assert host.violations() == []


def test_a_store_cut_in_half_while_stopped_is_refused_in_one_line(host):
    # Deleted and truncated to nothing: tests/functional/test_store_lost.py.
    host.start()
    for _ in range(3):
        host.build()
    assert host.stop() == 0
    cut_in_half(host.store)
    line = assert_refused_in_one_line(host)
    assert str(host.store) in line


def test_bug_a_store_removed_under_the_daemon_took_builds_to_a_nameless_file(host):
    # Two builds and their get_instance calls were answered OK with no
    # warning, the writes going to a file that no longer had a name.
    host.start()
    first = host.build()
    host.store.unlink()
    # Refused; or unanswered, when the update loop found the file gone
    # first and stopped the daemon: either way never acknowledged.
    try:
        host.build()
    except NoAnswer:
        pass
    assert list(host.ledger.acknowledged) == [first]
    code, errors, text = refusal(host.proc,
                                 host.daemon.dir / f"agent-{host.daemon.starts}.log")
    assert code == 2 and len(errors) == 1 and "Traceback" not in text, text
    assert errors[0] == (f"compute-agent: error: store {host.store} was removed while the "
                         "agent ran: nothing more is written or acknowledged; the agent "
                         "stops"), text


def test_a_store_removed_under_an_idle_daemon_stops_it_within_a_cycle(host):
    host.start()
    host.build()
    host.store.unlink()  # no call follows: the update loop finds it
    code, errors, text = refusal(host.proc,
                                 host.daemon.dir / f"agent-{host.daemon.starts}.log")
    assert code == 2 and len(errors) == 1 and "Traceback" not in text, text
    assert f"store {host.store} was removed while the agent ran" in errors[0]


# --- bugs these faults found, each with the fault that showed it ---------------

@pytest.fixture
def agent_on_a_disk(tmp_path, placement):
    """An agent in this process (fake driver) whose state directory is a
    StoreDisk."""
    disk = StoreDisk(tmp_path / "state.img", tmp_path / "state")
    agent = None
    try:
        conf = write_conf(tmp_path, placement.url, f"disk-{uuid.uuid4().hex[:8]}", HOST)
        agent = compose(load_config(["--config-file", str(conf)]))
        agent.driver.init_host()
        yield agent, disk
    finally:
        try:
            if agent is not None:
                agent.stop()
        finally:
            disk.unmount()


def test_bug_an_unwritable_store_failed_every_cycle_with_a_traceback(
        agent_on_a_disk, caplog):
    # Saving Placement's view, a cache, raised StoreError out of the cycle:
    # "unexpected error" and a traceback each cycle, Placement synced all
    # the same.
    agent, disk = agent_on_a_disk
    assert agent.run_cycle().ok
    disk.fail_read_only()
    # The host changes: the cycle writes Placement, and has a new view to save.
    agent.driver.set_host({**HOST, "disk_gb": HOST["disk_gb"] + 1})
    with caplog.at_level(logging.WARNING):
        outcome = agent.run_cycle()
    assert outcome.ok, outcome.reason
    # One warning for each file it could not write (the store; the cycle
    # record beside it), and no traceback.
    assert {r.levelname for r in caplog.records} == {"WARNING"}, caplog.text
    assert "Placement's view not saved" in caplog.text
    assert "Traceback" not in caplog.text and len(caplog.records) <= 2, caplog.text


def test_bug_stopping_with_an_unwritable_store_ended_in_a_traceback(
        agent_on_a_disk, caplog):
    # Store.close could not write its mark of a clean stop and raised out
    # of Agent.stop: the daemon's SIGTERM ended in "Unhandled error".
    agent, disk = agent_on_a_disk
    assert agent.run_cycle().ok
    disk.fail_read_only()
    with caplog.at_level(logging.WARNING):
        agent.stop()
    assert "Store not marked closed" in caplog.text
