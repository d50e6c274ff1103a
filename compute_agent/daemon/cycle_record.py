"""What the running agent's update loop last did, for readers that must not
take the state directory's lock (``compute-agent-manage status``).

After every cycle the agent replaces ``<state_path>/last_cycle.json``
(mode 0600, atomically): when the latest cycle ended, when the latest
successful one did, and each dependency's state with its failure counters.
A file rather than the store: written every cycle (every second in tests)
it would add a store transaction per cycle, and a reader of a corrupt
store still learns how the loop fares.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from compute_agent.daemon.errors import RecordUnreadable
from compute_agent.dependencies import Dependency, DependencyState
from compute_agent.store.atomic_file import write_private

LOG = logging.getLogger(__name__)

FILENAME = "last_cycle.json"


@dataclass(frozen=True)
class CycleRecord:
    pid: int
    # Wall-clock times (time.time()).
    last_cycle_at: float
    last_success_at: float | None
    # The latest cycle's failure, one line; "" when it succeeded.
    last_problem: str = ""
    dependencies: dict[Dependency, DependencyState] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"pid": self.pid, "last_cycle_at": self.last_cycle_at,
                "last_success_at": self.last_success_at,
                "last_problem": self.last_problem,
                "dependencies": [s.as_dict() for s in self.dependencies.values()]}

    @classmethod
    def from_dict(cls, doc: dict) -> CycleRecord:
        states = [DependencyState.from_dict(d) for d in doc["dependencies"]]
        return cls(doc["pid"], doc["last_cycle_at"], doc["last_success_at"],
                   doc["last_problem"], {s.dependency: s for s in states})


def path_in(state_path: str | Path) -> Path:
    return Path(state_path) / FILENAME


def write(path: Path, record: CycleRecord) -> None:
    write_private(path, json.dumps(record.as_dict(), sort_keys=True) + "\n")


def read(path: Path) -> CycleRecord | None:
    """The record, None when no cycle has ended here yet. Raises
    RecordUnreadable naming the file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RecordUnreadable(f"{path}: cannot be read: {e.strerror}") from None
    try:
        return CycleRecord.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        raise RecordUnreadable(f"{path}: not a cycle record ({type(e).__name__}: "
                               f"{e})") from None


def last_success_recorded(path: Path | None) -> float | None:
    """When the last successful cycle of an earlier run ended, so that a
    restart does not forget it; None when unknown."""
    try:
        record = read(path) if path is not None else None
    except RecordUnreadable as e:
        LOG.warning("%s: starting a new record", e)
        return None
    return None if record is None else record.last_success_at


class Recorder:
    """The update loop's record, replaced after each cycle in ``path``
    (None: not written, for an agent opened beside a running one). A file
    that cannot be written is one line, until it can be again."""

    def __init__(self, path: Path | None):
        self.path = path
        self.last_success_at = last_success_recorded(path)
        self._failing = False

    def cycle_ended(self, ok: bool, problem: str,
                    dependencies: dict[Dependency, DependencyState]) -> None:
        if ok:
            self.last_success_at = time.time()
        if self.path is None:
            return
        record = CycleRecord(os.getpid(), time.time(), self.last_success_at,
                             "" if ok else problem, dependencies)
        try:
            write(self.path, record)
        except OSError as e:
            if not self._failing:
                LOG.warning("Cannot record the cycle in %s: %s", self.path, e.strerror)
            self._failing = True
        else:
            self._failing = False
