"""The services the agent depends on, and what it says about them.

Each dependency (libvirt, Keystone, Placement, the message broker) has a
DependencyState. An observation (it answered, or it failed with a cause)
moves the state by a pure transition, which also says whether a line is
due: one line when a dependency goes away, one when it comes back, and in
between nothing but a counter (kept for ``compute-agent-manage status``
and metrics). An outage is never repeated every cycle.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

LOG = logging.getLogger(__name__)

# An operator reads the line in a journal: the dependency, its URL and the
# cause fit on one screen line.
LINE_LIMIT = 160


class Dependency(str, enum.Enum):
    """What the agent needs, by the name an operator knows it by."""

    LIBVIRT = "libvirt"
    KEYSTONE = "Keystone"
    PLACEMENT = "Placement"
    BROKER = "the message broker"


@dataclass(frozen=True)
class Unknown:
    """A fact that could not be read, and why."""

    why: str


@dataclass(frozen=True)
class Probe:
    """One dependency asked now. ``problem``: None when it answered, else
    what went wrong as a verb phrase; ``detail``: what it said it is."""

    dependency: Dependency
    url: str
    problem: str | None = None
    detail: str = ""


class Health(str, enum.Enum):
    UNKNOWN = "unknown"  # not observed yet
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class DependencyState:
    dependency: Dependency
    health: Health = Health.UNKNOWN
    url: str = ""
    # While down: what it said the last time it failed.
    problem: str = ""
    # Failed observations since it went down (0 while up).
    failures: int = 0
    # Failed observations since the process started.
    total_failures: int = 0
    # Wall-clock time of the last change of health.
    since: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dependency": self.dependency.value,
                "health": self.health.value}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> DependencyState:
        return cls(**{**doc, "dependency": Dependency(doc["dependency"]),
                      "health": Health(doc["health"])})


def shortened(text: str, limit: int = LINE_LIMIT) -> str:
    """``text`` on one line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def describe(dependency: Dependency, url: str, problem: str) -> str:
    """The one line naming the dependency, where it is and what is wrong:
    ``problem`` is a verb phrase ("did not answer (connection refused)")."""
    where = f" at {url}" if url else ""
    return shortened(f"{dependency.value}{where} {problem}")


def failed(state: DependencyState, url: str, problem: str, now: float
           ) -> tuple[DependencyState, str | None]:
    """A failed observation: the line is due only when it was not down
    already (a change of cause while down is counted, not said)."""
    went_down = state.health is not Health.DOWN
    new = replace(state, health=Health.DOWN, url=url or state.url, problem=problem,
                  failures=state.failures + 1, total_failures=state.total_failures + 1,
                  since=now if went_down else state.since)
    return new, describe(state.dependency, new.url, problem) if went_down else None


def answered(state: DependencyState, now: float, url: str = ""
             ) -> tuple[DependencyState, str | None]:
    """A successful observation: the line is due only when it was down."""
    new = replace(state, health=Health.UP, url=url or state.url, problem="",
                  failures=0, since=now if state.health is not Health.UP else state.since)
    if state.health is not Health.DOWN:
        return new, None
    return new, back_line(state, now)


def back_line(down: DependencyState, now: float) -> str:
    where = f" at {down.url}" if down.url else ""
    cycles = f"{down.failures} failed cycle{'' if down.failures == 1 else 's'}"
    lasted = "" if down.since is None else f", {now - down.since:.0f} s"
    return shortened(f"{down.dependency.value}{where} is back after {cycles}{lasted}")


def reached_before(failed_at: Dependency | None, path: tuple[Dependency, ...]
                   ) -> tuple[Dependency, ...]:
    """The dependencies of ``path`` (asked in that order) that answered,
    given the one it failed at (None: all answered). After the failure
    nothing was asked, so nothing is known about the rest."""
    if failed_at is None or failed_at not in path:
        return path
    return path[:path.index(failed_at)]


class Dependencies:
    """The states of every dependency, moved by observations from any
    thread; each due line is logged here, at WARNING going down and INFO
    coming back."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 log: logging.Logger = LOG):
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self._states = {d: DependencyState(d) for d in Dependency}

    def failed(self, dependency: Dependency, url: str, problem: str) -> None:
        with self._lock:
            state, line = failed(self._states[dependency], url, problem, self._clock())
            self._states[dependency] = state
        if line is None:
            self._log.debug("%s (failure %d)", describe(dependency, state.url, problem),
                            state.failures)
        else:
            self._log.warning("%s", line)

    def answered(self, dependency: Dependency, url: str = "") -> None:
        with self._lock:
            state, line = answered(self._states[dependency], self._clock(), url)
            self._states[dependency] = state
        if line is not None:
            self._log.info("%s", line)

    def observe_path(self, path: tuple[Dependency, ...],
                     failed_at: Dependency | None = None, url: str = "",
                     problem: str = "", urls: Mapping[Dependency, str] | None = None) -> None:
        """One pass over ``path`` (a cycle asks libvirt, then Keystone,
        then Placement): those before ``failed_at`` answered (at ``urls``,
        where known)."""
        for dependency in reached_before(failed_at, path):
            self.answered(dependency, (urls or {}).get(dependency, ""))
        if failed_at is not None:
            self.failed(failed_at, url, problem)

    def snapshot(self) -> dict[Dependency, DependencyState]:
        with self._lock:
            return dict(self._states)
