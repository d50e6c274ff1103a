"""libvirt faults against a running agent (issue 16), shared by the short
tests (test_libvirt_faults.py) and the long case
(tools/reliability_cases/libvirt_faults.py): an agent on a libvirtd of the
harness's own (PrivateLibvirtd, QEMU/KVM) with this machine's sysfs, its
update loop (and its reconciliation) every second, building small real guests (1 vCPU, 64 MiB,
CPUs and memory only: no device of this machine is given away)."""
from __future__ import annotations

import uuid
from pathlib import Path

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.dependencies import Dependency, DependencyState, Health
from tests.functional.helpers import put_allocations, wait_for, write_conf
from tests.functional.private_services import PrivateLibvirtd

# Failed cycles an outage lasts: the counter must move while nothing is said.
FAILED_CYCLES = 2


def libvirt_agent(tmp_path: Path, placement_url: str, libvirtd: PrivateLibvirtd) -> Agent:
    """Started; the caller stops it."""
    conf = write_conf(
        tmp_path, placement_url, f"lvfault-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": "/sys", "update_interval": 1,
                 "reconcile_interval": 1},
        libvirt={"connection_uri": libvirtd.uri,
                 "instances_path": str(tmp_path / "instances")})
    agent = compose(load_config(["--config-file", str(conf)]))
    agent.start()
    return agent


def schedule(agent: Agent, placement_url: str, instance: str) -> dict:
    """What the scheduler allocates for one small guest; the allocations."""
    cell = next(p.uuid for p in agent.sync.cache if p.name.endswith("_numa_0"))
    wanted = {cell: {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}
    put_allocations(placement_url, instance, wanted)
    return wanted


def build(agent: Agent, instance: str, wanted: dict) -> dict:
    return agent.manager.build_instance(
        instance, {"name": f"ca-test-{instance[:8]}", "vcpus": 1, "memory_mb": 64}, wanted)


def held(answer: dict) -> list[tuple[str, str, str, int]]:
    """An instance's assignments, whatever their state."""
    return sorted((a["id"], a["resource_class"], a["device_id"], a["amount"])
                  for a in answer["assignments"])


def libvirt_state(agent: Agent) -> DependencyState:
    return agent.dependencies.snapshot()[Dependency.LIBVIRT]


def restart_under_the_loop(agent: Agent, libvirtd: PrivateLibvirtd) -> None:
    """libvirtd stopped (its guests run on) for FAILED_CYCLES failed
    cycles, then started; returns once a cycle has reached it again."""
    libvirtd.stop()
    try:
        wait_for(lambda: libvirt_state(agent).failures >= FAILED_CYCLES, timeout=30)
    finally:
        libvirtd.start()
    wait_for(lambda: libvirt_state(agent).health is Health.UP, timeout=30)


def build_with_libvirtd_stopping(agent: Agent, libvirtd: PrivateLibvirtd, instance: str,
                                 wanted: dict) -> Exception | None:
    """A build during which libvirtd stops, once the claim is made and as
    the driver starts the guest; libvirtd started again after. The build's
    error (None if it succeeded)."""
    spawn = agent.driver.spawn

    def libvirtd_stops_first(guest):
        libvirtd.stop()
        spawn(guest)
    agent.driver.spawn = libvirtd_stops_first
    try:
        build(agent, instance, wanted)
    except Exception as e:
        return e
    finally:
        agent.driver.spawn = spawn
        libvirtd.start()
    return None
