"""A same-host resize of a real running QEMU/KVM guest on this machine's
libvirtd, through the agent's manager, with the real Placement.

No host device may be given to a guest here, so the guest holds what QEMU
really runs: a dedicated host CPU (PCPU, pinned with <vcpupin>) on the
host's NUMA cell. The resize moves it to the other CPU; the test reads the
running guest's live domain XML after finish, confirm and revert, which is
where a guest that was only redefined would still show its old CPU.
"""
from __future__ import annotations

import os
import uuid

import pytest

from compute_agent.claims.model import Owner
from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.drivers.base import DeviceKind
from compute_agent.exception import DevicesInUse
from tests.functional.helpers import placement_tree, write_conf
from tests.functional.libvirt_host import live_pins


@pytest.fixture
def agent(tmp_path, placement, private_libvirtd):
    assert os.cpu_count() >= 2, "the resize needs two host CPUs to move between"
    (tmp_path / "sys").mkdir()  # checked at load: it must exist
    path = write_conf(
        tmp_path, placement.url, f"real-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(tmp_path / "sys")},
        libvirt={"connection_uri": private_libvirtd.uri,
                 "instances_path": str(tmp_path / "instances")},
        compute={"cpu_dedicated_set": "0-1"})
    agent = compose(load_config(["--config-file", str(path)]))
    agent.driver.init_host()
    outcome = agent.run_cycle()
    assert outcome.ok, outcome.reason
    made: list[str] = []
    yield agent, made, private_libvirtd.uri
    for instance in made:
        agent.manager.delete_instance(instance)
    agent.driver.cleanup()
    agent.manager.tracker.store.close()


def pcpu_allocations(agent: Agent, placement) -> dict:
    cell = placement_tree(placement.url, agent.policy.root_uuid)[
        f"{agent.policy.host}_numa_0"]["uuid"]
    return {cell: {"resources": {"PCPU": 1, "MEMORY_MB": 64}}}


def build(agent: Agent, made: list[str], allocations: dict) -> str:
    instance = str(uuid.uuid4())
    made.append(instance)
    agent.manager.build_instance(instance, {"name": f"ca-{instance[:8]}", "vcpus": 1,
                                            "memory_mb": 64}, allocations)
    return instance


def pinned(agent: Agent, instance: str) -> list[str]:
    _, rows, _ = agent.manager.tracker.instance(instance)
    return sorted(a.device_id for a in rows
                  if a.kind is DeviceKind.PCPU and a.owner is Owner.INSTANCE)


def test_same_host_resize_moves_a_running_qemu_guest_to_its_new_cpu(agent, placement):
    agent, made, uri = agent
    m = agent.manager
    alloc = pcpu_allocations(agent, placement)
    instance = build(agent, made, alloc)
    first_cpu = pinned(agent, instance)
    assert live_pins(uri, instance) == first_cpu

    migration = str(uuid.uuid4())
    m.prep_resize(migration, instance, {"name": f"ca-{instance[:8]}", "vcpus": 1,
                                        "memory_mb": 64}, alloc)
    m.resize_instance(migration, instance)
    m.finish_resize(migration, instance)
    second_cpu = pinned(agent, instance)
    assert second_cpu != first_cpu
    assert live_pins(uri, instance) == second_cpu
    m.confirm_resize(migration, instance)
    assert live_pins(uri, instance) == second_cpu

    # The CPU given back at confirm is the only free one: the next guest
    # gets it, and the two running guests do not share a CPU.
    other = build(agent, made, alloc)
    assert live_pins(uri, other) == first_cpu
    m.delete_instance(other)

    # Resized again and reverted: back on the CPU it ran on before.
    again = str(uuid.uuid4())
    m.prep_resize(again, instance, {"name": f"ca-{instance[:8]}", "vcpus": 1,
                                    "memory_mb": 64}, alloc)
    m.resize_instance(again, instance)
    m.finish_resize(again, instance)
    assert live_pins(uri, instance) == first_cpu
    m.revert_resize(again, instance)
    assert live_pins(uri, instance) == second_cpu
    assert pinned(agent, instance) == second_cpu


def test_confirm_refuses_while_the_running_guest_still_holds_the_old_cpu(agent,
                                                                        placement):
    """A conductor that confirms without finishing: the guest still runs on
    the CPU the confirm would give back, so nothing is given back."""
    agent, made, uri = agent
    m = agent.manager
    alloc = pcpu_allocations(agent, placement)
    instance = build(agent, made, alloc)
    cpu = pinned(agent, instance)
    migration = str(uuid.uuid4())
    m.prep_resize(migration, instance, {"name": f"ca-{instance[:8]}", "vcpus": 1,
                                        "memory_mb": 64}, alloc)
    with pytest.raises(DevicesInUse, match=f"pcpu {cpu[0]}"):
        m.confirm_resize(migration, instance)
    assert live_pins(uri, instance) == cpu
    _, rows, _ = m.tracker.instance(instance)
    assert cpu[0] in {a.device_id for a in rows if a.owner is Owner.MIGRATION}
