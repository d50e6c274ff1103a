"""Helpers for functional tests: agent configs, and reading Placement with
plain HTTP, independently of the agent's own client."""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import requests
import yaml

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.heal.rules import capacity
from compute_agent.rpc.client import ComputeAgentAPI
from tests.waiting import wait_for

HEADERS = {"X-Auth-Token": "admin", "X-Roles": "admin,service",
           "OpenStack-API-Version": "placement 1.39"}


def write_conf(directory: Path, placement_url: str, host: str, host_dict: dict | None,
               **sections) -> Path:
    """A config file for a fake-driver agent; ``sections`` maps a group to
    its options, e.g. pci={"device_spec": [...]}."""
    directory.mkdir(parents=True, exist_ok=True)
    groups: dict[str, dict] = {
        "DEFAULT": {"host": host, "state_path": str(directory / "state"),
                    "compute_driver": "fake", "update_interval": 1,
                    "update_jitter": 0},
        "placement": {"auth_type": "placement_noauth2", "endpoint": placement_url},
    }
    if host_dict is not None:
        (directory / "host.yaml").write_text(yaml.safe_dump(host_dict))
        groups["fake"] = {"host_file": str(directory / "host.yaml")}
    for group, opts in sections.items():
        groups.setdefault(group, {}).update(opts)
    lines = []
    for group, opts in groups.items():
        lines.append(f"[{group}]")
        for key, value in opts.items():
            for v in value if isinstance(value, list) else [value]:
                lines.append(f"{key} = {v}")
    path = directory / "agent.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_refused(done: subprocess.CompletedProcess, state: Path, *named: str) -> None:
    """A command stopped on its configuration: exit 2, one line on stderr
    naming each of ``named``, and nothing in the state directory."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert all(n in lines[0] for n in named), lines[0]
    assert not state.exists() or not any(state.iterdir())


def make_agent(tmp_path: Path, placement_url: str, host_dict: dict, **sections):
    host = f"host-{uuid.uuid4().hex[:8]}"
    path = write_conf(tmp_path, placement_url, host, host_dict, **sections)
    return compose(load_config(["--config-file", str(path)]))


def get(url: str, path: str):
    resp = requests.get(url + path, headers=HEADERS, timeout=10)
    resp.raise_for_status()
    return resp.json()


def providers_named(url: str, name: str, resources: str = "") -> list[dict]:
    """The provider called ``name`` (none or one), in one request, so never
    half-made nor half-gone; with ``resources`` ("VGPU:1") only when it
    has that much free, as a scheduler would see it."""
    query = f"name={name}" + (f"&resources={resources}" if resources else "")
    return get(url, f"/resource_providers?{query}")["resource_providers"]


def provider_uuid(url: str, name: str) -> str:
    """The uuid of the provider called ``name``, in one request (a whole
    tree read costs two more a provider)."""
    [provider] = providers_named(url, name)
    return provider["uuid"]


def inventories_and_traits(url: str, uuid: str) -> dict:
    """A provider's inventories and traits, in two requests."""
    return {"inventories": get(url, f"/resource_providers/{uuid}/inventories")["inventories"],
            "traits": set(get(url, f"/resource_providers/{uuid}/traits")["traits"])}


def provider_view(url: str, name: str) -> dict:
    """The provider called ``name``: its uuid, inventories and traits, in
    three requests, where its whole tree would take two a provider."""
    uuid = provider_uuid(url, name)
    return {"uuid": uuid, **inventories_and_traits(url, uuid)}


def placement_tree(url: str, root_uuid: str) -> dict[str, dict]:
    """Placement's view of a tree, by provider name: parent name,
    inventories, traits, generation."""
    rows = get(url, f"/resource_providers?in_tree={root_uuid}")["resource_providers"]
    names = {r["uuid"]: r["name"] for r in rows}
    return {r["name"]: {"uuid": r["uuid"], "parent": names.get(r["parent_provider_uuid"]),
                        "generation": r["generation"],
                        **inventories_and_traits(url, r["uuid"])}
            for r in rows}


def provider_uuids(url: str, root_uuid: str) -> list[str]:
    return [r["uuid"] for r in
            get(url, f"/resource_providers?in_tree={root_uuid}")["resource_providers"]]


def offered(url: str, root_uuid: str) -> dict[str, int]:
    """What Placement lets be allocated on the tree, per class: the sum of
    (total - reserved) * allocation_ratio."""
    out: dict[str, int] = {}
    for rp in provider_uuids(url, root_uuid):
        for rc, record in get(url, f"/resource_providers/{rp}/inventories")[
                "inventories"].items():
            out[rc] = out.get(rc, 0) + capacity(record)
    return out


def used(url: str, root_uuid: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for rp in provider_uuids(url, root_uuid):
        for rc, n in get(url, f"/resource_providers/{rp}/usages")["usages"].items():
            out[rc] = out.get(rc, 0) + n
    return {rc: n for rc, n in out.items() if n}


def assert_never_more_than_physical(url: str, root_uuid: str,
                                    physical: dict[str, int]) -> None:
    """Placement offers no class beyond what the host has: summed over the
    tree, and as a scheduler sees it (one more than is free finds no
    candidate)."""
    have = offered(url, root_uuid)
    assert all(have.get(rc, 0) <= n for rc, n in physical.items()), have
    taken = used(url, root_uuid)
    for rc, n in sorted(physical.items()):
        ask = n - taken.get(rc, 0) + 1
        found = get(url, f"/allocation_candidates?resources={rc}:{ask}"
                         f"&in_tree={root_uuid}")["allocation_requests"]
        assert found == [], (rc, ask, found)


def totals(node: dict) -> dict[str, int]:
    return {rc: inv["total"] for rc, inv in node["inventories"].items()}


def failed_cycles(state_path: Path, dependency: str = "Placement") -> int:
    """How many cycles in a row a running agent has found ``dependency``
    down, from the record it rewrites after each cycle (the log says so
    once, not each cycle)."""
    from compute_agent.daemon import cycle_record
    from compute_agent.dependencies import Dependency
    record = cycle_record.read(cycle_record.path_in(state_path))
    state = record.dependencies.get(Dependency(dependency)) if record else None
    return state.failures if state else 0


def put_allocations(url: str, consumer: str, allocations: dict) -> None:
    """What a conductor's scheduler does before it asks a host to build."""
    resp = requests.put(f"{url}/allocations/{consumer}", headers=HEADERS, timeout=10, json={
        "allocations": allocations,
        "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
        "consumer_generation": None, "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text


def allocate(url: str, provider_uuid: str, resources: dict[str, int]) -> str:
    consumer = str(uuid.uuid4())
    put_allocations(url, consumer, {provider_uuid: {"resources": resources}})
    return consumer


def unallocate(url: str, consumer: str) -> None:
    resp = requests.delete(f"{url}/allocations/{consumer}", headers=HEADERS, timeout=10)
    assert resp.status_code == 204, resp.text


def wait_serving(conf: Path, host: str, proc: subprocess.Popen, log: Path,
                 timeout: float = 60) -> dict:
    """Wait until the agent ``proc`` (its output in ``log``) answers
    get_host_info over the bus with its providers; its answer. Asked from
    this process: a compute-agent-ctl process a poll cost a second of CPU."""
    api = ComputeAgentAPI(load_config(["--config-file", str(conf)]), timeout=30)

    def answering() -> dict | None:
        assert proc.poll() is None, log.read_text()
        try:
            info = api._call(host, "get_host_info", timeout=3)
        except Exception:
            return None
        return info if info["providers"] else None

    try:
        return wait_for(answering, timeout=timeout, interval=0.5)
    finally:
        api.close()

