"""accept-store: the store at the path taken for this host's latest,
whatever the host recorded of it."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from compute_agent.store.check import StoreFile, one_line
from compute_agent.store.connection import connect, named_error
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import inspect_store
from compute_agent.store.schema import IN_USE
from compute_agent.store.sequence import record_path, write_recorded


@dataclass(frozen=True)
class Acceptance:
    """What ``accept_store`` accepted."""

    path: Path
    sequence: int | None  # the store's commit sequence; None before it
    recorded: int | None  # what the host had recorded; None: no record
    wal_lost: bool  # its write-ahead log was gone after a crash

    def describe(self) -> str:
        at = ("no commit sequence" if self.sequence is None
              else f"commit sequence {self.sequence}")
        was = ("no record" if self.recorded is None
               else f"the host recorded {self.recorded}")
        return (f"accepting store {self.path} at {at}; {was}"
                + ("; its write-ahead log, lost after a crash, is accepted as lost"
                   if self.wal_lost else ""))


def accept_store(path: Path) -> Acceptance:
    """Take the store at ``path`` for this host's latest, whatever the
    host recorded (an older copy an operator put back on purpose): the
    record then holds its sequence, and a write-ahead log lost after a
    crash is no longer asked for. Holding the state directory's lock, the
    agent stopped. A store that is not there or not sound is refused with
    StoreError."""
    facts = inspect_store(path)
    if facts.file is not StoreFile.VALID:
        detail = f" ({one_line(facts.detail)})" if facts.detail else ""
        raise StoreError(f"store {path} is {facts.file.value}{detail}: there is no "
                         "store to accept; rebuild-store makes one")
    accepted = Acceptance(path, facts.sequence, facts.recorded, facts.wal_lost)
    # The record first: a crash before the store's own write leaves a
    # record no store is behind.
    write_recorded(record_path(path), facts.sequence or 0)
    if facts.wal_lost:
        try:
            conn = connect(path)
            try:
                conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'closed')", (IN_USE,))
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise named_error(path, e) from None
    return accepted
