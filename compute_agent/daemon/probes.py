"""Whether the daemon is alive and whether it is ready: the rules behind
/healthz and /readyz on the metrics listener ([metrics] listen), which
Kubernetes' liveness and readiness probes ask. Pure: the daemon gathers
the facts (``Agent.probe_facts``) from its own state, never from
Placement, and each rule answers an HTTP status and one line."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

OK = 200
UNAVAILABLE = 503


class Phase(enum.Enum):
    """Where the daemon is in its life."""

    STARTING = "starting"  # the first cycle, start-up reconciliation, RPC's start
    SERVING = "serving"  # the update loop runs and RPC is served
    STOPPING = "stopping"  # asked to stop, or a thread died


@dataclass(frozen=True)
class ProbeFacts:
    phase: Phase
    # The update loop's thread is alive.
    loop_running: bool
    # How long the loop's current turn (a cycle, and a reconciliation every
    # reconcile_interval cycles) has run; None while it waits for the next.
    turn_seconds: float | None
    # [metrics] healthz_turn_limit: a turn running longer is stuck.
    turn_limit: float
    # Each thread that died of an exception, "<name>: <error>".
    dead_threads: tuple[str, ...]
    # A cycle of this run has reached Placement and synced the tree.
    cycle_succeeded: bool
    # The latest cycle's failure, one line; "" when it succeeded or none ran.
    last_problem: str
    # Why the store is not open ("" while it is).
    store_problem: str


class ProbeAnswer(NamedTuple):
    code: int
    reason: str


def liveness(facts: ProbeFacts) -> ProbeAnswer:
    """/healthz: alive while the update loop and the RPC servers run and
    the loop's turn in progress is within its limit. A restart is what a
    failure asks for, so a dependency that is down (Placement, libvirt)
    never fails it: the cycles fail and the loop goes on."""
    if facts.dead_threads:
        return ProbeAnswer(UNAVAILABLE, f"thread {facts.dead_threads[0]} died")
    if facts.phase is Phase.STARTING:
        return ProbeAnswer(UNAVAILABLE, "starting: the update loop and RPC do not "
                           "run yet")
    if not facts.loop_running:
        return ProbeAnswer(UNAVAILABLE, "the update loop does not run")
    if facts.turn_seconds is not None and facts.turn_seconds > facts.turn_limit:
        return ProbeAnswer(UNAVAILABLE, f"the update loop's turn has run "
                           f"{facts.turn_seconds:.0f} s, beyond its limit of "
                           f"{facts.turn_limit:g} s ([metrics] healthz_turn_limit)")
    if facts.turn_seconds is None:
        return ProbeAnswer(OK, "alive: the update loop waits for its next cycle")
    return ProbeAnswer(OK, f"alive: the update loop's turn has run "
                       f"{facts.turn_seconds:.0f} s")


def readiness(facts: ProbeFacts) -> ProbeAnswer:
    """/readyz: ready once a cycle of this run has reached Placement, RPC
    is served and the store is open. Once ready it stays so while
    Placement is down: the agent still serves claims from its store."""
    if facts.phase is Phase.STOPPING:
        return ProbeAnswer(UNAVAILABLE, "stopping")
    if facts.store_problem:
        return ProbeAnswer(UNAVAILABLE, f"the store is not open: {facts.store_problem}")
    if not facts.cycle_succeeded:
        return ProbeAnswer(UNAVAILABLE, "no cycle has reached Placement yet: "
                           + (facts.last_problem or "the first cycle runs"))
    if facts.phase is Phase.STARTING:
        return ProbeAnswer(UNAVAILABLE, "starting: RPC is not served yet")
    return ProbeAnswer(OK, "ready: a cycle reached Placement, RPC is served, the "
                       "store is open")
