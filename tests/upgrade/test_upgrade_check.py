"""upgrade-check, run as the upgrade's instructions say (docs/operations.md):
this checkout's command, on the state an earlier version left, before the
new agent starts. It must judge that state, never fail to read it."""
from __future__ import annotations

import json
import uuid

import pytest

from tests.functional.helpers import put_allocations
from tests.upgrade.hosts import DeviceHost, manage
from tests.upgrade.pinned import PINNED, short


@pytest.mark.parametrize("pinned", PINNED, ids=short)
def test_upgrade_check_judges_the_store_and_host_each_version_left(
        pinned, installed, tmp_path, placement):
    old = installed(pinned.commit)
    host = DeviceHost(tmp_path / "t", placement.url)
    old.run("host", {"config": str(host.conf), "steps": []})
    instance = str(uuid.uuid4())
    put_allocations(placement.url, instance, host.allocations())
    built = old.run("host", {"config": str(host.conf), "dump_domains": True, "steps": [
        {"op": "build", "instance": instance, "allocations": host.allocations(),
         "spec": {"name": f"up-{instance[:8]}", "vcpus": 1, "memory_mb": 64}}]})
    host.keep(built["domains"])

    done = manage(host, "upgrade-check", "--json")
    checks = {c["check"]: (c["result"], c["details"])
              for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == 0, checks
    assert {name: result for name, (result, _) in checks.items()} == {
        "Store schema": 0, "Healed under the configured model": 0,
        "No move in flight": 0}, checks
