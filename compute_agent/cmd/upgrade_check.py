"""compute-agent-manage upgrade-check: whether this version of the agent
can take over the host, run with the new code and config before the
service restarts (oslo.upgradecheck).

Each check is a named method; its verdict a rule of its own below:

- the store's schema can be migrated by this version (an older one is,
  step by step; a newer one is not: a downgrade);
- the configured model, as this version builds it, leaves no class held
  on a provider it takes that class off (a switch of provider_tree_mode
  under guests): otherwise the host runs unhealed until ``heal``;
- no move is in flight in the store.

Read-only, beside a running agent: no lock, the store opened read-only,
nothing written to Placement. Output and exit codes are oslo.upgradecheck's:
a table (or ``--json``), and the worst result: 0 success, 1 warning,
2 failure; 255 when a check itself broke. A check that cannot read what it
needs fails: unknown is never success.
"""
from __future__ import annotations

import traceback
from collections.abc import Collection, Iterable
from pathlib import Path

from oslo_config import cfg
from oslo_upgradecheck import upgradecheck
from oslo_upgradecheck.upgradecheck import Code, Result

from compute_agent.claims.model import Migration
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.exception import AgentError
from compute_agent.reports.run import read_beside_agent, tree_report
from compute_agent.reports.tree import UnhealedClass
from compute_agent.store import node_identity
from compute_agent.store.check import StoreFile
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import inspect_store, stored_schema_version
from compute_agent.store.migrations import MIGRATIONS
from compute_agent.store.queries import all_migrations
from compute_agent.store.schema import SCHEMA_VERSION, downgrade_refusal
from compute_agent.store.store import STORE_FILE, Store

# An exception escaping a check: oslo.upgradecheck's code for it, apart
# from the checks' own 0-2.
CHECK_BROKE = 255


# --- the rules (pure) ---------------------------------------------------------

def schema_result(store: Path, found: int, ours: int, migrations: Collection[int]
                  ) -> Result:
    """The store at ``store``, at schema ``found``; this code at ``ours``
    with the steps in ``migrations`` (version -> its migration, MIGRATIONS).
    A newer store fails as the agent refuses it."""
    if found > ours:
        return Result(Code.FAILURE, f"store {store}: {downgrade_refusal(found, ours)}")
    missing = [v for v in range(found + 1, ours + 1) if v not in migrations]
    if missing:
        return Result(Code.FAILURE, f"the store's schema version {found} cannot be "
                      f"migrated to {ours}: this version has no step to "
                      f"{', '.join(map(str, missing))}")
    if found == ours:
        return Result(Code.SUCCESS, f"schema version {ours}, this version's")
    return Result(Code.SUCCESS, f"schema version {found}; this version migrates it "
                  f"to {ours} when the agent starts")


def unhealed_result(mode: str, unhealed: list[UnhealedClass]) -> Result:
    """What the configured model takes off providers where consumers hold
    it (tree_report's unhealed classes)."""
    if not unhealed:
        return Result(Code.SUCCESS, f"provider_tree_mode = {mode}: Placement's "
                      "allocations all sit where this version's model puts them")
    classes = sorted({u.resource_class for u in unhealed})
    consumers = {h.consumer_uuid for u in unhealed for h in u.holders}
    return Result(Code.WARNING, f"provider_tree_mode = {mode}: this version's "
                  f"model takes {', '.join(classes)} off providers where "
                  f"{len(consumers)} consumers hold them; the host stays unhealed "
                  "(the new providers fully reserved) until 'compute-agent-manage "
                  "heal' (or [heal] on_startup) moves the allocations")


def moves_result(migrations: Iterable[Migration]) -> Result:
    in_flight = sorted((m for m in migrations if m.open), key=lambda m: m.uuid)
    if not in_flight:
        return Result(Code.SUCCESS, "no move in flight")
    return Result(Code.WARNING, f"{len(in_flight)} moves in flight: " + "; ".join(
        f"{m.kind.value} {m.uuid} of instance {m.instance_uuid} ({m.role.value}, "
        f"{m.state.value})" for m in in_flight)
        + ": let them finish (confirm or revert) before the upgrade")


def cannot_tell(what: str, error: Exception) -> Result:
    return Result(Code.FAILURE, f"cannot tell: {what}: {error}")


# --- the checks -------------------------------------------------------------

class UpgradeChecks(upgradecheck.UpgradeCommands):
    display_title = "compute-agent upgrade check"

    def __init__(self, conf: cfg.ConfigOpts):
        super().__init__()
        self.conf = conf
        self.store_path = Path(conf.state_path) / STORE_FILE

    def _store_file(self) -> StoreFile:
        """What is at the store's path; raises StoreError when unusable."""
        facts = inspect_store(self.store_path)
        if facts.file is StoreFile.CORRUPT:
            raise StoreError(f"store {self.store_path} is unusable: {facts.detail}")
        return facts.file

    def check_store_schema(self) -> Result:
        try:
            if self._store_file() is not StoreFile.VALID:
                return Result(Code.SUCCESS, f"no store yet at {self.store_path}: "
                              "this version creates it")
            found = stored_schema_version(self.store_path)
        except StoreError as e:
            return cannot_tell("the store", e)
        return schema_result(self.store_path, found, SCHEMA_VERSION, MIGRATIONS)

    def check_unhealed(self) -> Result:
        conf = self.conf
        try:
            if node_identity.load(conf.state_path) is None:
                return Result(Code.SUCCESS, "the agent has not run on this host: "
                              "nothing of it in Placement to heal")
            report = read_beside_agent(conf, tree_report)
        except (AgentError, StoreError, DriverUnavailable) as e:
            return cannot_tell("the model against Placement", e)
        return unhealed_result(conf.compute.provider_tree_mode, report.unhealed)

    def check_moves_in_flight(self) -> Result:
        try:
            if self._store_file() is not StoreFile.VALID:
                return Result(Code.SUCCESS, "no store yet: no move")
            store = Store(self.store_path, read_only=True)
            try:
                migrations = store.read(all_migrations)
            finally:
                store.close()
        except StoreError as e:
            return cannot_tell("the store", e)
        return moves_result(migrations.values())

    _upgrade_checks = (
        ("Store schema", check_store_schema),
        ("Healed under the configured model", check_unhealed),
        ("No move in flight", check_moves_in_flight),
    )


def run(conf: cfg.ConfigOpts) -> int:
    """Print the table (or JSON with --json); the worst check's code."""
    upgradecheck.CONF = conf  # where oslo.upgradecheck reads --json from
    try:
        return UpgradeChecks(conf).check()
    except Exception:  # noqa: BLE001 - a check's bug, reported as oslo's run() does
        print(f"Error:\n{traceback.format_exc()}")
        return CHECK_BROKE
