"""compute-agent-manage upgrade-check, check by check, on temporary stores
(the unhealed check against the real Placement is in
tests/functional/test_upgrade_check.py)."""
from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest
from oslo_upgradecheck.upgradecheck import Code

from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind
from compute_agent.cmd.common import load_config
from compute_agent.cmd.upgrade_check import UpgradeChecks, moves_result, schema_result, unhealed_result
from compute_agent.reports.tree import Holder, UnhealedClass
from compute_agent.store.queries import put_migration_sql
from compute_agent.store.schema import SCHEMA_VERSION, migrate
from compute_agent.store.store import Store

ROOT = "3f0b6c1e-8a57-4d52-9c3e-2b1f6e0a9d47"
STORE = Path("/var/lib/compute-agent/state.db")


@pytest.fixture
def checks(tmp_path) -> UpgradeChecks:
    host = tmp_path / "host.yaml"
    host.write_text("numa_cells: [{id: 0, cpus: '0-3', memory_mb: 4096}]\n")
    conf = tmp_path / "agent.conf"
    conf.write_text(f"[DEFAULT]\nhost = upgrading\nstate_path = {tmp_path}/state\n"
                    f"compute_driver = fake\n[fake]\nhost_file = {host}\n"
                    "[placement]\nauth_type = placement_noauth2\n"
                    "endpoint = http://127.0.0.1:1\n")
    return UpgradeChecks(load_config(["--config-file", str(conf)]))


def store_at(checks: UpgradeChecks, version: int) -> Path:
    """A store as the agent whose schema is ``version`` left it."""
    path = checks.store_path
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=min(version, SCHEMA_VERSION))
    if version > SCHEMA_VERSION:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     (str(version),))
    conn.close()
    return path


def move(state_: MigrationState, role=MigrationRole.BOTH) -> Migration:
    return Migration(str(uuid.uuid4()), str(uuid.uuid4()), MoveKind.RESIZE, role, state_)


# --- the rules ---------------------------------------------------------------

def test_an_older_schema_with_every_step_migrates():
    result = schema_result(STORE, 2, 4, {1: "", 2: "", 3: "", 4: ""})
    assert result.code is Code.SUCCESS and "migrates it to 4" in result.details


def test_the_same_schema_is_a_success():
    assert schema_result(STORE, 4, 4, {1: "", 2: "", 3: "", 4: ""}).code is Code.SUCCESS


def test_a_newer_schema_is_a_failure_naming_the_store_and_both_versions():
    result = schema_result(STORE, 5, 4, {1: "", 2: "", 3: "", 4: ""})
    assert result.code is Code.FAILURE
    assert result.details == (f"store {STORE}: schema version 5 is newer than the newest "
                              "this version knows, 4 (a downgrade): install the version "
                              "that wrote it")


def test_a_schema_this_version_has_no_step_from_is_a_failure():
    result = schema_result(STORE, 1, 4, {3: "", 4: ""})
    assert result.code is Code.FAILURE and "no step to 2" in result.details


def test_classes_left_on_old_providers_are_a_warning_naming_them_and_heal():
    held = [UnhealedClass("rp1", "h", "VCPU", 3, (Holder("c1", 1), Holder("c2", 2))),
            UnhealedClass("rp1", "h", "MEMORY_MB", 512, (Holder("c1", 512),))]
    result = unhealed_result("nested", held)
    assert result.code is Code.WARNING
    assert "takes MEMORY_MB, VCPU off providers where 2 consumers" in result.details
    assert "compute-agent-manage heal" in result.details
    assert unhealed_result("nested", []).code is Code.SUCCESS


def test_only_open_moves_are_named():
    open_one = move(MigrationState.FINISHED)
    settled = [move(MigrationState.CONFIRMED), move(MigrationState.REVERTED),
               move(MigrationState.FINISHED, MigrationRole.DESTINATION)]
    result = moves_result([open_one, *settled])
    assert result.code is Code.WARNING
    assert f"1 moves in flight: resize {open_one.uuid} of instance " \
           f"{open_one.instance_uuid} (both, finished)" in result.details
    assert moves_result(settled).code is Code.SUCCESS


# --- the checks on stores ----------------------------------------------------

def test_a_version_1_store_passes_and_is_left_as_it_was(checks):
    path = store_at(checks, 1)
    before = path.read_bytes()
    result = checks.check_store_schema()
    assert result.code is Code.SUCCESS, result.details
    assert "schema version 1; this version migrates it to" in result.details
    assert path.read_bytes() == before


def test_a_store_of_a_newer_agent_fails(checks):
    store_at(checks, SCHEMA_VERSION + 1)
    assert checks.check_store_schema().code is Code.FAILURE
    # Nor can this version read its moves.
    result = checks.check_moves_in_flight()
    assert result.code is Code.FAILURE and result.details.startswith("cannot tell")


def test_a_corrupt_store_fails_naming_it(checks):
    checks.store_path.parent.mkdir(parents=True)
    checks.store_path.write_bytes(b"not a database" * 100)
    result = checks.check_store_schema()
    assert result.code is Code.FAILURE
    assert f"store {checks.store_path} is unusable" in result.details


def test_no_store_and_no_compute_id_is_a_new_host(checks):
    assert [f(checks).code for _, f in checks._upgrade_checks] == [Code.SUCCESS] * 3
    assert not checks.store_path.parent.exists()


def test_an_open_move_in_the_store_is_a_warning(checks):
    store = Store(checks.store_path, ROOT)
    open_one, done = move(MigrationState.ACTIVE), move(MigrationState.CONFIRMED)
    store.write([put_migration_sql(open_one), put_migration_sql(done)])
    try:
        # Beside the agent that holds the store open.
        result = checks.check_moves_in_flight()
    finally:
        store.close()
    assert result.code is Code.WARNING
    assert open_one.uuid in result.details and done.uuid not in result.details


def test_a_placement_that_does_not_answer_is_a_failure_not_a_success(checks):
    store = Store(checks.store_path, ROOT)
    store.close()
    (checks.store_path.parent / "compute_id").write_text(ROOT)
    result = checks.check_unhealed()
    assert result.code is Code.FAILURE
    assert result.details.startswith("cannot tell: the model against Placement: "
                                     "Placement at http://127.0.0.1:1 did not answer"
                                     ), result.details
