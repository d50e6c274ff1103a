"""A store a newer agent wrote (its schema one ahead of this code's) is
refused by the agent, at a daemon start and with --once, and by
compute-agent-manage upgrade-check: exit 2, one line naming the file, its
schema version and the newest this version knows, the store left as it was.

The store is a real one, made by a real cycle against the real Placement,
then given the next schema version, as the newer agent's migration would
have left it, and marked closed, as that agent left it when it stopped
for the downgrade.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from compute_agent.store.schema import IN_USE, SCHEMA_VERSION
from compute_agent.store.store import STORE_FILE
from tests.functional.helpers import write_conf

BIN = Path(sys.executable).parent
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}
NEWER = SCHEMA_VERSION + 1


def run(command: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def newer_store(tmp_path, placement) -> tuple[Path, Path]:
    """(config, store): a host's real store, as the next schema left it."""
    conf = write_conf(tmp_path, placement.url, f"dg-{tmp_path.name[-12:]}", HOST)
    done = run("compute-agent", "--config-file", str(conf), "--once")
    assert done.returncode == 0, done.stderr
    store = tmp_path / "state" / STORE_FILE
    conn = sqlite3.connect(store)
    with conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'"
                            ).fetchone() == (str(SCHEMA_VERSION),)
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(NEWER),))
        conn.execute("UPDATE meta SET value='closed' WHERE key=?", (IN_USE,))
    conn.close()
    return conf, store


def digest(store: Path) -> str:
    return hashlib.sha256(store.read_bytes()).hexdigest()


def refusal(store: Path) -> str:
    return (f"store {store}: schema version {NEWER} is newer than the newest "
            f"this version knows, {SCHEMA_VERSION} (a downgrade): install the "
            "version that wrote it")


@pytest.mark.parametrize("once", [True, False], ids=["once", "daemon"])
def test_the_agent_refuses_a_store_of_a_newer_schema(newer_store, once):
    conf, store = newer_store
    before = digest(store)
    done = run("compute-agent", "--config-file", str(conf), *(["--once"] if once else []))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == f"compute-agent: error: {refusal(store)}\n"
    assert done.stdout == ""
    assert digest(store) == before


def test_upgrade_check_refuses_a_store_of_a_newer_schema(newer_store):
    conf, store = newer_store
    before = digest(store)
    done = run("compute-agent-manage", "--config-file", str(conf), "upgrade-check", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["Store schema"] == {"check": "Store schema", "result": 2,
                                      "details": refusal(store)}
    assert digest(store) == before
