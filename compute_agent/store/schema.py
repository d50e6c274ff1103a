"""The store's schema: its version, the meta table's keys, and migrating
a database to this version's schema, one step (compute_agent/store/migrations/)
a transaction."""
from __future__ import annotations

import sqlite3

from compute_agent.store.errors import StoreError
from compute_agent.store.migrations import MIGRATIONS

SCHEMA_VERSION = 8

# Meta keys the agent that holds the state directory writes (Store opened
# with ``root_uuid``). Plain meta rows: the table is there since v1.
ROOT_UUID = "root_uuid"  # the root provider the store was created for
# The [DEFAULT] host the store belongs to (compute_agent/daemon/renamed_host.py);
# absent in a store from before it, which learns it once.
HOST = "host"
# "open" from the moment the holder opened the store (checkpointed into
# the database file itself) until it closed it; "closed" after.
IN_USE = "in_use"
# The number of group commits the holders made (compute_agent/store/sequence.py);
# absent in a store from before it.
COMMIT_SEQUENCE = "commit_sequence"
# SR-IOV PFs as last seen with all their VFs (compute_agent/health/vf_restore.py,
# JSON), and the boot whose VFs were restored; absent before the first.
SRIOV_RECORD = "sriov_record"
VFS_RESTORED_BOOT = "vfs_restored_boot_id"


def schema_version(conn: sqlite3.Connection) -> int:
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
    if not has_meta:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return int(row[0]) if row else 0


def downgrade_refusal(found: int, newest: int) -> str:
    """Why a store at schema ``found`` is refused by code that knows schemas
    up to ``newest``: a newer agent wrote it, and this one cannot know what
    it means. The agent and upgrade-check say it alike."""
    return (f"schema version {found} is newer than the newest this version knows, "
            f"{newest} (a downgrade): install the version that wrote it")


def check_version(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """The database's schema version; StoreError when newer than ``target``."""
    current = schema_version(conn)
    if current > target:
        raise StoreError(downgrade_refusal(current, target))
    return current


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Apply forward migrations, each in its own transaction."""
    current = check_version(conn, target)
    for version in range(current + 1, target + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                         (str(version),))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return target


def migrated_copy(conn: sqlite3.Connection) -> sqlite3.Connection:
    """A copy in memory of the store ``conn`` reads, migrated to this
    version's schema; the store itself is left as it is."""
    copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.backup(copy)
    copy.row_factory = sqlite3.Row
    migrate(copy)
    return copy


def stored_sequence(meta: dict[str, str]) -> int | None:
    """The store's commit sequence from its meta rows; None before it."""
    value = meta.get(COMMIT_SEQUENCE)
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"meta {COMMIT_SEQUENCE} is not a number (value: {value[:40]!r})")
    return int(value)
