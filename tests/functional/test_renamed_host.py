"""A renamed host against the real Placement: a start with another
[DEFAULT] host under a state directory is refused (exit 2, one line) and
changes nothing; compute-agent-manage rename-host records the rename on
purpose, and the next start renames the root, its allocations and the
store's records kept."""
from __future__ import annotations

import uuid
from pathlib import Path

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.store import node_identity
from compute_agent.store.queries import all_instances
from compute_agent.store.store import STORE_FILE, Store
from tests.functional.helpers import get, placement_tree, provider_uuid, put_allocations, write_conf
from tests.functional.test_daemon import HOST, run

SPEC = {"name": "kept", "vcpus": 1, "memory_mb": 64}


def built_instance(conf: Path, url: str, host: str) -> tuple[str, dict]:
    """An instance built on ``host``'s NUMA cell as a conductor has it
    built: its allocation in Placement, its record in the store."""
    instance = str(uuid.uuid4())
    wanted = {provider_uuid(url, f"{host}_numa_0"): {"resources": {"VCPU": 1}}}
    put_allocations(url, instance, wanted)
    agent = compose(load_config(["--config-file", str(conf)]))
    try:
        assert agent.run_cycle().ok  # the host's pools, as the daemon's first cycle
        agent.manager.build_instance(instance, SPEC, wanted)
    finally:
        agent.stop()
    return instance, wanted


def test_a_renamed_host_is_refused_until_renamed_on_purpose(tmp_path, placement):
    url = placement.url
    old, new = f"ren-a-{uuid.uuid4().hex[:6]}", f"ren-b-{uuid.uuid4().hex[:6]}"
    conf = write_conf(tmp_path, url, old, HOST)
    state = tmp_path / "state"
    assert run("compute-agent", conf, "--once").returncode == 0
    root = node_identity.load(str(state))
    instance, wanted = built_instance(conf, url, old)
    before = placement_tree(url, root)

    write_conf(tmp_path, url, new, HOST)  # the same state_path
    refused = run("compute-agent", conf, "--once")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith(
        f"compute-agent: error: [DEFAULT] host is {new}, but state path {state} (root "
        f"provider {root}) belongs to host {old} (its store's record): nothing was "
        "renamed;"), lines[0]
    assert f"run 'compute-agent-manage rename-host {new}'" in lines[0]
    assert placement_tree(url, root) == before  # nothing renamed, no generation moved

    renamed = run("compute-agent-manage", conf, "rename-host", new)
    assert renamed.returncode == 0, renamed.stderr
    assert renamed.stdout == (
        f"store {state / STORE_FILE} now belongs to host {new} (it belonged to host "
        f"{old}); the next start renames its root provider in Placement to {new}\n")

    started = run("compute-agent", conf, "--once")
    assert started.returncode == 0, started.stderr
    after = placement_tree(url, root)
    assert old not in after and after[new]["uuid"] == root
    assert node_identity.load(str(state)) == root
    assert after[f"{new}_numa_0"]["parent"] == new
    held = get(url, f"/allocations/{instance}")["allocations"]
    assert {rp: a["resources"] for rp, a in held.items()} == {
        rp: w["resources"] for rp, w in wanted.items()}
    store = Store(state / STORE_FILE, read_only=True)
    try:
        assert store.read(all_instances)[instance]["name"] == "kept"
    finally:
        store.close()
