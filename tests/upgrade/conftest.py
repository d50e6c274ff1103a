"""Fixtures of the upgrade tests (collected only with ``--upgrade``:
tests/conftest.py). They share the suite's fixtures: Placement, the
services, the pair of private libvirtds."""
from __future__ import annotations

import time

import libvirt
import pytest
from keystoneauth1 import adapter, session

from compute_agent.cmd.common import load_config
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI
from tests.upgrade.hosts import BROKER
from tests.upgrade.old_version import OldVersion


@pytest.fixture(scope="session")
def installed():
    """pinned commit -> its OldVersion, installed on first use; reports
    what was built in this run and how long it took."""
    versions: dict[str, OldVersion] = {}

    def install(commit: str) -> OldVersion:
        if commit not in versions:
            versions[commit] = OldVersion(commit).install()
        return versions[commit]

    started = time.monotonic()
    yield install
    built = {c[:7]: round(v.built_in, 1) for c, v in versions.items() if v.built_in}
    print(f"\nupgrade: old versions built in this run (s): {built or 'none, all cached'}; "
          f"session {time.monotonic() - started:.0f} s")


@pytest.fixture
def conductor_conf(tmp_path):
    conf = tmp_path / "conductor.conf"
    conf.write_text(f"[DEFAULT]\ntransport_url = {BROKER}\n")
    return load_config(["--config-file", str(conf)])


@pytest.fixture
def api(conductor_conf):
    """A conductor's RPC client of this checkout; ``api.probe``, one that
    waits 3 s for an answer, asks whether an agent serves yet (a call to a
    server not yet listening is lost, and waits out its whole timeout)."""
    client = ComputeAgentAPI(conductor_conf, timeout=60)
    client.probe = ComputeAgentAPI(conductor_conf, timeout=3)
    yield client
    client.probe.close()
    client.close()


@pytest.fixture
def placement_client(placement) -> PlacementClient:
    return PlacementClient(adapter.Adapter(session.Session(auth=NoAuth2(placement.url)),
                                           service_type="placement"))


@pytest.fixture
def libvirtd_pair(two_private_libvirtds):
    """The module's two private libvirtds, with no domain left on them
    after each test (a failed test's guests would hold their CPUs)."""
    yield two_private_libvirtds
    for daemon in two_private_libvirtds:
        conn = libvirt.open(daemon.uri)
        try:
            for dom in conn.listAllDomains():
                if dom.isActive():
                    dom.destroy()
                if dom.isPersistent():
                    dom.undefine()
        finally:
            conn.close()
