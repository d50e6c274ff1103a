"""libvirt faults, short versions (issue 16): the test's own libvirtd
(QEMU/KVM) stopped and started under a running agent, during its update
cycles and during a build of a small real guest."""
from __future__ import annotations

import logging
import threading
import uuid

import pytest

from agent.cmd.common import load_config
from agent.dependencies import Dependency, Health
from agent.service import Agent
from drivers.base import DriverUnavailable
from tests.functional.helpers import put_allocations, unallocate, wait_for, write_conf

FAILED_CYCLES = 2


@pytest.fixture
def agent(tmp_path, placement, private_libvirtd):
    """An agent (its update loop every second) on the private libvirtd,
    with this machine's sysfs: CPUs and memory only, no device given."""
    conf = write_conf(
        tmp_path, placement.url, f"lvfault-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": "/sys", "update_interval": 1},
        libvirt={"connection_uri": private_libvirtd.uri,
                 "instances_path": str(tmp_path / "instances")})
    a = Agent.from_conf(load_config(["--config-file", str(conf)]))
    a.start()
    built: list[str] = []
    a.built = built
    yield a
    for instance in built:
        try:
            a.manager.delete_instance(instance)
        finally:
            unallocate(placement.url, instance)
    a.stop()


def build(agent: Agent, placement, instance: str) -> dict:
    cell = next(p.uuid for p in agent.sync.cache if p.name.endswith("_numa_0"))
    wanted = {cell: {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}
    if instance not in agent.built:
        put_allocations(placement.url, instance, wanted)
        agent.built.append(instance)
    return agent.manager.build_instance(
        instance, {"name": f"ca-test-{instance[:8]}", "vcpus": 1, "memory_mb": 64}, wanted)


def held(answer: dict) -> list[tuple[str, str, str, int]]:
    return sorted((a["id"], a["resource_class"], a["device_id"], a["amount"])
                  for a in answer["assignments"])


def libvirt_state(agent: Agent):
    return agent.dependencies.snapshot()[Dependency.LIBVIRT]


def restart(agent: Agent, libvirtd) -> None:
    """libvirtd stopped for FAILED_CYCLES failed cycles, then started; back
    once a cycle has reached it."""
    libvirtd.stop()
    try:
        wait_for(lambda: libvirt_state(agent).failures >= FAILED_CYCLES, timeout=30)
    finally:
        libvirtd.start()
    wait_for(lambda: libvirt_state(agent).health is Health.UP, timeout=30)


def said(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.levelno >= logging.INFO and r.name.startswith(("agent", "drivers"))]


def test_libvirtd_restarted_under_the_update_loop(agent, placement, private_libvirtd,
                                                  caplog):
    """One line each way; the guest that ran before is still ours, running,
    and the audit clean."""
    before = str(uuid.uuid4())
    build(agent, placement, before)
    caplog.set_level(logging.INFO)
    caplog.clear()
    restart(agent, private_libvirtd)

    uri = private_libvirtd.uri
    lines = [line for line in said(caplog) if line[0] != "INFO" or "libvirt" in line[1]]
    assert len(lines) == 2, lines
    assert lines[0][0] == "WARNING" and lines[0][1].startswith(f"libvirt at {uri} ")
    assert lines[1][0] == "INFO" and lines[1][1].startswith(
        f"libvirt at {uri} is back after")
    assert agent.driver.guest_is_running(before)
    assert agent.manager.get_instance(before)["running"]
    assert agent.reconcile(at_start=False, fix=False).consistent


def test_a_build_while_libvirtd_is_away_fails_cleanly_and_succeeds_on_retry(
        agent, placement, private_libvirtd):
    instance = str(uuid.uuid4())
    private_libvirtd.stop()
    try:
        with pytest.raises(DriverUnavailable) as failed:
            build(agent, placement, instance)
    finally:
        private_libvirtd.start()
    assert str(failed.value).startswith(f"cannot connect to libvirt at {private_libvirtd.uri}")
    # Whether a guest was defined is unknown while libvirtd is away: the
    # claim stays, building, until the conductor retries or deletes.
    assert agent.manager.get_instance(instance)["running"] is False

    retried = build(agent, placement, instance)
    assert agent.driver.guest_is_running(instance)
    assert held(agent.manager.get_instance(instance)) == held(retried)
    assert agent.reconcile(at_start=False, fix=False).consistent


def test_libvirtd_stopping_in_the_middle_of_a_build(agent, placement, private_libvirtd,
                                                    caplog):
    """libvirtd goes away once the build has claimed, as the driver starts
    the guest: the build fails, its claim stays (whether a guest exists is
    unknown) and the log says so (before: "giving its devices back", which
    the failing clean-up never did, and the clean-up's error raised in
    place of the build's); the retry with the same uuid builds it on the
    same claim; the delete gives it back."""
    spawn = agent.driver.spawn

    def libvirtd_stops_first(guest):
        private_libvirtd.stop()
        spawn(guest)
    agent.driver.spawn = libvirtd_stops_first
    instance = str(uuid.uuid4())
    try:
        with pytest.raises(DriverUnavailable):
            build(agent, placement, instance)
    finally:
        agent.driver.spawn = spawn
        private_libvirtd.start()
    claimed = held(agent.manager.get_instance(instance))
    assert [r.getMessage() for r in caplog.records if r.name == "agent.manager"] == [
        f"Spawning {instance} failed (cannot connect to libvirt at {private_libvirtd.uri}: "
        f"Failed to connect socket to '{private_libvirtd.socket}': No such file or "
        "directory); the hypervisor cannot say whether its guest exists: its claim stays "
        "until the build is retried or the instance deleted"]

    retried = build(agent, placement, instance)
    assert held(retried) == claimed
    assert agent.driver.guest_is_running(instance)
    assert agent.reconcile(at_start=False, fix=False).consistent
    agent.manager.delete_instance(instance)
    assert agent.manager.tracker.snapshot()[1] == []
    assert not agent.driver.guest_is_running(instance)
