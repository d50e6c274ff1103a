"""What ``compute-agent-manage status`` concludes (pure): the facts gathered
about a host (its dependencies answering now, the store, the update loop's
record, unhealed classes, the audit) turned into one line per check and an
exit code: 0 healthy, 1 warnings, 2 broken.

Each rule is a named function of the facts. What could not be read is
never taken for good: a fact left unknown is at least a warning, with why.
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from compute_agent.daemon.cycle_record import CycleRecord
from compute_agent.dependencies import Health, Probe, Unknown, describe
from compute_agent.health.rules import UnhealthyProvider

# A cycle ends every update_interval (plus jitter) seconds. The record is
# late after this many of them (a slow cycle, a Placement that times out),
# and the loop is taken for stopped (the agent not running, or its update
# thread stuck) after this many.
LATE_CYCLES = 3
STOPPED_CYCLES = 10
# Added to both: a cycle's own length, and a clock step.
CYCLE_SLACK_SECONDS = 30


class Level(enum.IntEnum):
    """A check's outcome; the command exits with the worst."""

    OK = 0
    WARNING = 1
    BROKEN = 2


STATUS_WORDS = {Level.OK: "healthy", Level.WARNING: "warnings", Level.BROKEN: "broken"}


@dataclass(frozen=True)
class StoreHealth:
    path: str
    # None when the file opens as a compute-agent store; else why not.
    problem: str | None
    schema_version: int | None = None
    # PRAGMA integrity_check's rows (["ok"] when sound); None: not run.
    integrity: tuple[str, ...] | None = None


@dataclass(frozen=True)
class StatusFacts:
    now: float  # wall clock, as the record's times
    cycle_seconds: float  # update_interval + update_jitter
    code_schema_version: int
    # None: the fake driver, which has no hypervisor to ask.
    hypervisor: Probe | None
    # None: the auth plugin does not use Keystone (placement_noauth2).
    keystone: Probe | None
    placement: Probe | Unknown
    broker: Probe | Unknown
    store: StoreHealth
    # None: no cycle has ended on this host yet.
    cycle: CycleRecord | Unknown | None
    unhealed: tuple[str, ...] | Unknown
    # The audit's unfixed findings, one line each.
    audit: tuple[str, ...] | Unknown
    # The providers Placement shows out of scheduling for a device's
    # health (compute_agent/health/rules.py), as the running agent marked them.
    device_health: tuple[UnhealthyProvider, ...] | Unknown = ()


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    line: str


@dataclass(frozen=True)
class Status:
    checks: tuple[Check, ...]
    facts: StatusFacts = field(repr=False)

    @property
    def level(self) -> Level:
        return max((c.level for c in self.checks), default=Level.OK)

    def lines(self) -> list[str]:
        return ([f"{c.level.name:<8}{c.line}" for c in self.checks]
                + [STATUS_WORDS[self.level]])

    def as_dict(self) -> dict:
        cycle = self.facts.cycle
        return {
            "status": STATUS_WORDS[self.level],
            "exit_code": int(self.level),
            "checks": [{"check": c.name, "level": c.level.name.lower(), "line": c.line}
                       for c in self.checks],
            "last_cycle": cycle.as_dict() if isinstance(cycle, CycleRecord) else None,
            "last_success_age_seconds": success_age(self.facts),
            "schema_version": self.facts.store.schema_version,
            "unhealed": (None if isinstance(self.facts.unhealed, Unknown)
                         else list(self.facts.unhealed)),
            "unhealthy_devices": (None if isinstance(self.facts.device_health, Unknown)
                                  else [u.to_json() for u in self.facts.device_health]),
        }


def probe_check(name: str, probe: Probe) -> Check:
    if probe.problem is not None:
        return Check(name, Level.BROKEN, describe(probe.dependency, probe.url, probe.problem))
    said = f" ({probe.detail})" if probe.detail else ""
    return Check(name, Level.OK, describe(probe.dependency, probe.url, f"answered{said}"))


def unknown_check(name: str, what: str, unknown: Unknown,
                  level: Level = Level.WARNING) -> Check:
    return Check(name, level, f"{what}: unknown ({unknown.why})")


# --- the rules -----------------------------------------------------------

def hypervisor(f: StatusFacts) -> list[Check]:
    if f.hypervisor is None:
        return [Check("hypervisor", Level.OK, "the fake driver: no hypervisor to ask")]
    return [probe_check("hypervisor", f.hypervisor)]


def keystone(f: StatusFacts) -> list[Check]:
    return [] if f.keystone is None else [probe_check("keystone", f.keystone)]


def placement(f: StatusFacts) -> list[Check]:
    if isinstance(f.placement, Unknown):
        return [unknown_check("placement", "Placement", f.placement)]
    return [probe_check("placement", f.placement)]


def broker(f: StatusFacts) -> list[Check]:
    if isinstance(f.broker, Unknown):
        return [unknown_check("broker", "the message broker", f.broker)]
    return [probe_check("broker", f.broker)]


def store_opens(f: StatusFacts) -> list[Check]:
    if f.store.problem is not None:
        return [Check("store", Level.BROKEN, f"store {f.store.path}: {f.store.problem}")]
    return [Check("store", Level.OK, f"store {f.store.path}: opens")]


def store_schema(f: StatusFacts) -> list[Check]:
    """An older schema is migrated by the agent at its start; a newer one
    is a newer agent's, which this code must not serve."""
    version = f.store.schema_version
    if version is None:
        return []
    line = f"store schema version {version}"
    if version > f.code_schema_version:
        return [Check("store_schema", Level.BROKEN, f"{line}, newer than this code's "
                      f"{f.code_schema_version}: run the newer agent")]
    if version < f.code_schema_version:
        return [Check("store_schema", Level.WARNING, f"{line}, older than this code's "
                      f"{f.code_schema_version}: the agent migrates it when it starts")]
    return [Check("store_schema", Level.OK, line)]


def store_integrity(f: StatusFacts) -> list[Check]:
    rows = f.store.integrity
    if rows is None:
        return []
    if list(rows) == ["ok"]:
        return [Check("store_integrity", Level.OK, "store integrity_check: ok")]
    return [Check("store_integrity", Level.BROKEN,
                  f"store integrity_check: {len(rows)} problems, first: {rows[0]}")]


def success_age(f: StatusFacts) -> float | None:
    cycle = f.cycle
    if not isinstance(cycle, CycleRecord) or cycle.last_success_at is None:
        return None
    return max(0.0, f.now - cycle.last_success_at)


def last_cycle(f: StatusFacts) -> list[Check]:
    """The update loop reports the host to Placement: how long since it
    last did, against the cycle's length."""
    if isinstance(f.cycle, Unknown):
        return [unknown_check("last_cycle", "the last cycle", f.cycle)]
    if f.cycle is None:
        return [Check("last_cycle", Level.BROKEN,
                      "no cycle recorded: the agent has not run on this host")]
    age = success_age(f)
    if age is None:
        return [Check("last_cycle", Level.BROKEN, "no cycle has succeeded yet; the "
                      f"latest failed: {f.cycle.last_problem}")]
    line = f"last successful cycle {age:.0f} s ago"
    if age > STOPPED_CYCLES * f.cycle_seconds + CYCLE_SLACK_SECONDS:
        return [Check("last_cycle", Level.BROKEN, f"{line}: the agent is not running, "
                      "or its update loop is stuck")]
    if age > LATE_CYCLES * f.cycle_seconds + CYCLE_SLACK_SECONDS:
        return [Check("last_cycle", Level.WARNING,
                      f"{line}: late (every {f.cycle_seconds:g} s expected)")]
    return [Check("last_cycle", Level.OK, line)]


def agent_sees_down(f: StatusFacts) -> list[Check]:
    """What the running agent's own cycles found: a dependency it has seen
    fail since it went away, with the count (a flapping or slow service
    that answers a probe but fails the agent's cycles shows here)."""
    if not isinstance(f.cycle, CycleRecord):
        return []
    return [Check("agent_sees", Level.WARNING,
                  f"the agent's cycles: {describe(s.dependency, s.url, s.problem)} "
                  f"({s.failures} failed cycles)")
            for s in f.cycle.dependencies.values() if s.health is Health.DOWN]


def unhealed(f: StatusFacts) -> list[Check]:
    if isinstance(f.unhealed, Unknown):
        return [unknown_check("unhealed", "unhealed classes", f.unhealed)]
    if f.unhealed:
        return [Check("unhealed", Level.WARNING,
                      f"unhealed for {', '.join(f.unhealed)}: held reserved until "
                      "'compute-agent-manage heal' (see 'tree')")]
    return [Check("unhealed", Level.OK, "unhealed for no class")]


def audit(f: StatusFacts) -> list[Check]:
    if isinstance(f.audit, Unknown):
        return [unknown_check("audit", "audit", f.audit)]
    if f.audit:
        return [Check("audit", Level.WARNING, f"audit: {len(f.audit)} inconsistencies, "
                      f"first: {f.audit[0]} (see 'audit')")]
    return [Check("audit", Level.OK, "audit: consistent")]


def device_health(f: StatusFacts) -> list[Check]:
    """A device out of scheduling is a warning: guests holding it keep it,
    but the host offers less until it recovers."""
    if isinstance(f.device_health, Unknown):
        return [unknown_check("device_health", "device health", f.device_health)]
    if not f.device_health:
        return [Check("device_health", Level.OK, "no device out of scheduling")]
    return [Check("device_health", Level.WARNING, u.describe()) for u in f.device_health]


RULES: tuple[Callable[[StatusFacts], list[Check]], ...] = (
    hypervisor, keystone, placement, broker, store_opens, store_schema,
    store_integrity, last_cycle, agent_sees_down, unhealed, audit, device_health)


def judge(f: StatusFacts) -> Status:
    return Status(tuple(check for rule in RULES for check in rule(f)), f)
