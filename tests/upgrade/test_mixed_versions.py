"""Mixed versions on the bus, for each pinned version with the RPC version
ledger (964717c on): an old conductor's client against this checkout's
agent, and this checkout's client, pinned at the old version
(``[upgrade_levels] compute_agent``), against the old agent; through the
machine's RabbitMQ, on a QEMU/KVM host of a private libvirtd.

The conductor runs every call the old side knows, in one sequence (build,
read, resize reverted and confirmed, a live migration's checks and
rollbacks, an evacuation's rebuild, delete). What the older side cannot
do is refused with a declared error, and the host is left as it was.
"""
from __future__ import annotations

import signal
import uuid

import pytest

from compute_agent.rpc.versions import VERSION
from tests.functional.helpers import put_allocations, wait_for
from tests.upgrade.hosts import BROKER, NewAgent, QemuHost
from tests.upgrade.old_version import run_here
from tests.upgrade.pinned import PINNED, short

WITH_LEDGER = [p for p in PINNED if p.has_rpc_ledger]


def steps(host: QemuHost, url: str) -> tuple[list, dict[str, str]]:
    """The conductor's calls, and the instances they name."""
    g, g2, g3 = (str(uuid.uuid4()) for _ in range(3))
    m1, m2, m3, m4, m5, m6 = (str(uuid.uuid4()) for _ in range(6))
    shared = host.allocations(pinned=False, pmem=False)
    pinned = host.allocations(pinned=True, pmem=False)
    for instance in (g, g3):
        put_allocations(url, instance, shared)
    spec = {"name": "mixed", "vcpus": 1, "memory_mb": 64}
    move = {"instance_uuid": g}
    return [
        ["get_host_info", {}],
        ["get_provider_tree", {}],
        ["build_instance", {"instance_uuid": g, "spec": spec, "allocations": shared}],
        ["get_instance", {"instance_uuid": g}],
        ["list_instances", {}],
        ["prep_resize", {"migration_uuid": m1, **move, "spec": spec, "allocations": pinned}],
        ["resize_instance", {"migration_uuid": m1, **move}],
        ["finish_resize", {"migration_uuid": m1, **move}],
        ["revert_resize", {"migration_uuid": m1, **move}],
        ["prep_resize", {"migration_uuid": m2, **move, "spec": spec, "allocations": pinned}],
        ["resize_instance", {"migration_uuid": m2, **move}],
        ["finish_resize", {"migration_uuid": m2, **move}],
        ["confirm_resize", {"migration_uuid": m2, **move}],
        # g2 arriving by live migration: claimed here, then rolled back.
        ["check_can_live_migrate_destination", {"migration_uuid": m3, "instance_uuid": g2,
                                                "spec": spec, "allocations": shared}],
        ["rollback_live_migration_at_destination", {"migration_uuid": m3,
                                                    "instance_uuid": g2}],
        # g leaving for another host: announced here, then rolled back.
        ["check_can_live_migrate_source", {"migration_uuid": m4, **move,
                                           "destination_host": "elsewhere"}],
        ["rollback_live_migration_at_source", {"migration_uuid": m4, **move}],
        # A migration this host never claimed or announced: refused.
        ["live_migrate", {"migration_uuid": m5, **move,
                          "destination": {"claimed": [], "migration_uri": "qemu://x"}}],
        ["post_live_migration_at_destination", {"migration_uuid": m5, **move}],
        # g3 rebuilt here after its host failed (an evacuation).
        ["rebuild_instance", {"migration_uuid": m6, "instance_uuid": g3, "spec": spec,
                              "allocations": shared}],
        ["delete_instance", {"instance_uuid": g3}],
        ["delete_instance", {"instance_uuid": g}],
        ["get_host_info", {}],
    ], {"g": g, "g3": g3}


def outcomes(sequence: list, answer: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for (method, _), result in zip(sequence, answer["results"]):
        out.setdefault(method, []).append(result)
    return out


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def expected(client_version: str, server_version: str, capped_here: bool
             ) -> dict[str, list[str]]:
    """What each call answers between a client of API ``client_version``
    and an agent serving ``server_version``; ``capped_here``: this
    checkout's client, pinned at the older version, refuses a newer call
    itself (VersionCapped, nothing sent)."""
    older = min(as_tuple(client_version), as_tuple(server_version))
    ok = {"get_host_info": ["ok", "ok"], "get_provider_tree": ["ok"],
          "build_instance": ["ok"], "get_instance": ["ok"], "list_instances": ["ok"],
          "prep_resize": ["ok", "ok"], "resize_instance": ["ok", "ok"],
          "finish_resize": ["ok", "ok"], "revert_resize": ["ok"], "confirm_resize": ["ok"],
          "check_can_live_migrate_destination": ["ok"],
          "rollback_live_migration_at_destination": ["ok"],
          "check_can_live_migrate_source": ["ok"],
          "rollback_live_migration_at_source": ["ok"],
          # Neither side knows this migration: the declared refusal.
          "live_migrate": ["InvalidRequest"], "post_live_migration_at_destination":
          ["InvalidRequest"],
          "rebuild_instance": ["ok"], "delete_instance": ["ok", "ok"]}
    if older < (1, 4):
        # Calls of 1.4: an older client has none; a capped one refuses.
        for method in ("check_can_live_migrate_source", "rollback_live_migration_at_source"):
            ok[method] = ["VersionCapped" if capped_here else "unknown"]
    if older < (1, 2):
        # live_migrate before 1.2 took no destination: the capped client
        # refuses it, the old client's call is refused by the agent.
        ok["live_migrate"] = ["VersionCapped" if capped_here else "InvalidRequest"]
    return ok


def conductor_conf(tmp_path, cap: str | None):
    path = tmp_path / f"conductor-{cap}.conf"
    path.write_text(f"[DEFAULT]\ntransport_url = {BROKER}\n"
                    + (f"[upgrade_levels]\ncompute_agent = {cap}\n" if cap else ""))
    return path


def assert_nothing_left(api, host: QemuHost) -> None:
    info = api.get_host_info(host.name)
    assert (info["instances"], info["assignments"]) == (0, 0), info


@pytest.mark.parametrize("pinned", WITH_LEDGER, ids=short)
def test_an_old_conductor_drives_this_agent_with_every_call_it_knows(
        pinned, installed, tmp_path, placement, services, libvirtd_pair, api):
    old = installed(pinned.commit)
    host = QemuHost(tmp_path / "h", libvirtd_pair[0], placement.url, "mix-new")
    agent = NewAgent(host, api)
    try:
        sequence, _ = steps(host, placement.url)
        answer = old.run("conductor", {"config": str(conductor_conf(tmp_path, None)),
                                       "host": host.name, "steps": sequence})
        assert outcomes(sequence, answer) == expected(old.rpc_version(), VERSION,
                                                      capped_here=False), answer
        if as_tuple(old.rpc_version()) < (1, 2):
            refusal = answer["answers"][[m for m, _ in sequence].index("live_migrate")]
            assert refusal.startswith("destination: missing"), refusal
        assert_nothing_left(api, host)
    finally:
        agent.stop()


@pytest.mark.parametrize("pinned", WITH_LEDGER, ids=short)
def test_this_conductor_pinned_at_an_old_version_drives_the_old_agent(
        pinned, installed, tmp_path, placement, services, libvirtd_pair, api):
    old = installed(pinned.commit)
    host = QemuHost(tmp_path / "h", libvirtd_pair[0], placement.url, "mix-old")
    log = tmp_path / "old-agent.log"
    daemon = old.popen([str(old.bin("compute-agent")), "--config-file", str(host.conf)],
                       log)
    try:
        wait_for(lambda: _serves(api, host, daemon, log), timeout=120, interval=0.5)
        sequence, _ = steps(host, placement.url)
        version = old.rpc_version()
        answer = run_here("conductor", {"config": str(conductor_conf(tmp_path, version)),
                                        "host": host.name, "steps": sequence})
        assert outcomes(sequence, answer) == expected(VERSION, version,
                                                      capped_here=True), answer
        assert_nothing_left(api, host)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)


def _serves(api, host: QemuHost, daemon, log) -> bool:
    assert daemon.poll() is None, log.read_text()[-4000:]
    try:
        return bool(api.probe.get_host_info(host.name).get("providers"))
    except Exception:  # not serving yet
        return False
