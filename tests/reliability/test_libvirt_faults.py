"""libvirt faults, short versions (issue 16; the long one is
tools/reliability_cases/libvirt_faults.py): the test's own libvirtd
(QEMU/KVM) stopped and started under a running agent, during its update
cycles and during a build of a small real guest."""
from __future__ import annotations

import logging
import uuid

import pytest

from compute_agent.drivers.errors import DriverUnavailable
from tests.functional.helpers import unallocate
from tests.reliability.libvirt_faults import (
    build,
    build_with_libvirtd_stopping,
    held,
    libvirt_agent,
    restart_under_the_loop,
    schedule,
)


@pytest.fixture
def agent(tmp_path, placement, private_libvirtd):
    a = libvirt_agent(tmp_path, placement.url, private_libvirtd)
    scheduled: list[str] = []

    def allocations(instance: str) -> dict:
        scheduled.append(instance)
        return schedule(a, placement.url, instance)
    a.allocations_for = allocations
    yield a
    for instance in scheduled:
        try:
            a.manager.delete_instance(instance)
        finally:
            unallocate(placement.url, instance)
    a.stop()


def said(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.levelno >= logging.INFO and r.name.startswith("compute_agent")]


def test_libvirtd_restarted_under_the_update_loop(agent, private_libvirtd, caplog):
    """One line each way, with reconciliation every cycle (before: each
    reconciliation during the outage was an ERROR "Reconciliation failed"
    with a traceback); the guest that ran before is still ours, running,
    and the audit clean."""
    before = str(uuid.uuid4())
    build(agent, before, agent.allocations_for(before))
    caplog.set_level(logging.INFO)
    caplog.clear()
    restart_under_the_loop(agent, private_libvirtd)

    uri = private_libvirtd.uri
    lines = [line for line in said(caplog) if line[0] != "INFO" or "libvirt" in line[1]]
    assert len(lines) == 2, lines
    assert lines[0][0] == "WARNING" and lines[0][1].startswith(f"libvirt at {uri} ")
    assert lines[1][0] == "INFO" and lines[1][1].startswith(
        f"libvirt at {uri} is back after")
    assert agent.driver.guest_is_running(before)
    assert agent.manager.get_instance(before)["running"]
    assert agent.reconcile(at_start=False, fix=False).consistent


def test_a_build_while_libvirtd_is_away_fails_and_succeeds_on_retry(agent,
                                                                    private_libvirtd):
    instance = str(uuid.uuid4())
    wanted = agent.allocations_for(instance)
    private_libvirtd.stop()
    try:
        with pytest.raises(DriverUnavailable) as failed:
            build(agent, instance, wanted)
    finally:
        private_libvirtd.start()
    assert str(failed.value).startswith(f"cannot connect to libvirt at {private_libvirtd.uri}")
    # What the guests hold is unknown while libvirtd is away, so nothing is
    # chosen: the build fails before it claims (a claim that stays, building,
    # is libvirtd going away during the spawn: the test below).
    assert not agent.manager.tracker.knows(instance)
    assert agent.manager.tracker.snapshot()[1] == []

    retried = build(agent, instance, wanted)
    assert agent.driver.guest_is_running(instance)
    assert held(agent.manager.get_instance(instance)) == held(retried)
    assert agent.reconcile(at_start=False, fix=False).consistent


def test_libvirtd_stopping_in_the_middle_of_a_build(agent, private_libvirtd, caplog):
    """libvirtd goes away once the build has claimed, as the driver starts
    the guest: the build fails, its claim stays (whether a guest exists is
    unknown) and the log says so (before: "giving its devices back", which
    the failing clean-up never did, and the clean-up's error raised in
    place of the build's); the retry with the same uuid builds it on the
    same claim; the delete gives it back."""
    instance = str(uuid.uuid4())
    wanted = agent.allocations_for(instance)
    assert isinstance(build_with_libvirtd_stopping(agent, private_libvirtd, instance, wanted),
                      DriverUnavailable)
    claimed = held(agent.manager.get_instance(instance))
    assert [r.getMessage() for r in caplog.records if r.name == "compute_agent.compute.manager"] == [
        f"Spawning {instance} failed (cannot connect to libvirt at {private_libvirtd.uri}: "
        f"Failed to connect socket to '{private_libvirtd.socket}': No such file or "
        "directory); the hypervisor cannot say whether its guest exists: its claim stays "
        "until the build is retried or the instance deleted"]

    retried = build(agent, instance, wanted)
    assert held(retried) == claimed
    assert agent.driver.guest_is_running(instance)
    assert agent.reconcile(at_start=False, fix=False).consistent
    agent.manager.delete_instance(instance)
    assert agent.manager.tracker.snapshot()[1] == []
    assert not agent.driver.guest_is_running(instance)
