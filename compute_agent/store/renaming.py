"""rename-host: the store recorded as another host name's, on purpose.

The start refuses a state directory that belongs to another host name
than ``[DEFAULT] host`` (compute_agent/daemon/renamed_host.py); an operator
who renamed the host records the new name here, the agent stopped, and
the next start renames the root provider in Placement."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from compute_agent.store.check import StoreFile, one_line
from compute_agent.store.connection import connect, named_error
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import inspect_store, stored_host
from compute_agent.store.schema import HOST


@dataclass(frozen=True)
class Renaming:
    """What ``rename_host`` recorded."""

    path: Path
    previous: str | None  # the name the store recorded; None: none (older)
    name: str

    def describe(self) -> str:
        was = (f"it belonged to host {self.previous}" if self.previous is not None
               else "it recorded no host name")
        return (f"store {self.path} now belongs to host {self.name} ({was}); the "
                f"next start renames its root provider in Placement to {self.name}")


def rename_host(path: Path, name: str) -> Renaming:
    """Record ``name`` as the host the store at ``path`` belongs to.
    Holding the state directory's lock, the agent stopped. A store that is
    not there or not sound is refused with StoreError, nothing written."""
    facts = inspect_store(path)
    if facts.file is not StoreFile.VALID:
        detail = f" ({one_line(facts.detail)})" if facts.detail else ""
        raise StoreError(f"store {path} is {facts.file.value}{detail}: there is no "
                         "store to rename; the next start takes [DEFAULT] host")
    previous = stored_host(path).name
    try:
        conn = connect(path)
        try:
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (HOST, name))
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise named_error(path, e) from None
    return Renaming(path, previous, name)
