"""A restart at the floor: an agent started as the daemon starts it (the
one-agent check, then the agent it composes), stopped and started again,
its Placement requests counted at the HTTP level as the local Placement saw
them; and what changed while it was down, found all the same."""
from __future__ import annotations

import time
from pathlib import Path
from uuid import uuid4

import requests

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.one_agent_run import check_one_agent_per_host
from compute_agent.daemon.service import Agent
from tests.functional.helpers import (
    HEADERS,
    allocate,
    provider_uuid,
    unallocate,
    wait_for,
    write_conf,
)
from tests.functional.test_update_provider_tree import HOST, POLICY

SPEC = {"name": "vm", "vcpus": 1, "memory_mb": 512}
PF, GPU = "0000:3B:00.0", "pci_0000_af_00_0"


def agent_conf(tmp_path: Path, url: str, refresh_interval: int) -> Path:
    """A host whose guests outlive its agent (the fake hypervisor's state
    file), its loop's own cycles out of the way of the counts."""
    return write_conf(tmp_path, url, f"host-{uuid4().hex[:8]}", HOST, **POLICY,
                      DEFAULT={"allocation_refresh_interval": refresh_interval,
                               "update_interval": 600},
                      fake={"state_file": str(tmp_path / "hypervisor.json")})


def started(conf: Path) -> Agent:
    """As compute-agent starts (compute_agent/cmd/daemon.py), the bus left out."""
    loaded = load_config(["--config-file", str(conf)])
    agent = compose(loaded, start=check_one_agent_per_host(loaded, ask_the_bus=False))
    agent.start()
    return agent


def provider(agent: Agent, url: str, suffix: str) -> str:
    return provider_uuid(url, f"{agent.policy.host}_{suffix}")


def build(agent: Agent, url: str, on: str, resources: dict[str, int]) -> str:
    """An instance as a conductor has it: allocated, then built here."""
    instance = allocate(url, on, resources)
    agent.manager.build_instance(instance, SPEC, {on: {"resources": resources}})
    return instance


def unexplained(agent: Agent) -> set[str]:
    """The allocations on our providers no record explains, after a cycle."""
    agent.run_cycle()
    report = agent.reconcile(at_start=False)
    return {f.subject for f in report.findings if f.kind == "allocation_without_record"}


def test_a_restart_with_instances_after_which_nothing_changed_sends_two_requests(
        tmp_path, placement):
    conf = agent_conf(tmp_path, placement.url, refresh_interval=3600)
    first = started(conf)
    try:
        build(first, placement.url, provider(first, placement.url, PF),
              {"CUSTOM_PCI_8086_154C": 1})
        build(first, placement.url, provider(first, placement.url, GPU), {"VGPU": 1})
        assert unexplained(first) == set()  # their providers' allocations read, and saved
        root = first.policy.root_uuid
    finally:
        first.stop()

    mark = placement.mark()
    again = started(conf)
    try:
        sent = placement.requests_since(mark)
        # The microversion's discovery, and the tree read that answers the
        # one-agent check and is the first cycle's.
        assert sent == ["GET / 200", f"GET /resource_providers?in_tree={root} 200"], sent
        assert again.sync.client.requests_sent == 2
        assert unexplained(again) == set()  # the instances' allocations known
    finally:
        again.stop()


def test_what_changed_while_the_agent_was_down_is_found_within_the_refresh_interval(
        tmp_path, placement):
    """Placement moves no generation where allocations are deleted: the
    restart's view of them is trusted until read again by age, within
    allocation_refresh_interval of the start."""
    refresh_interval = 6
    conf = agent_conf(tmp_path, placement.url, refresh_interval)
    first = started(conf)
    try:
        gpu, pf = provider(first, placement.url, GPU), provider(first, placement.url, PF)
        build(first, placement.url, gpu, {"VGPU": 1})
        deleted = allocate(placement.url, gpu, {"VGPU": 1})
        on_pf = allocate(placement.url, pf, {"CUSTOM_PCI_8086_154C": 1})
        assert unexplained(first) == {deleted, on_pf}
    finally:
        first.stop()

    # While it is down: an allocation removed, a provider (emptied) deleted.
    unallocate(placement.url, deleted)
    unallocate(placement.url, on_pf)
    resp = requests.delete(f"{placement.url}/resource_providers/{pf}", headers=HEADERS,
                           timeout=10)
    assert resp.status_code == 204, resp.text

    again = started(conf)
    restarted_at = time.monotonic()
    try:
        wait_for(lambda: unexplained(again) == set(), timeout=refresh_interval + 10,
                 interval=0.5)
        assert time.monotonic() - restarted_at <= refresh_interval + 2
        assert provider(again, placement.url, PF)  # the deleted provider is back
    finally:
        again.stop()
