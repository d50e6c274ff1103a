"""Running a fuzzed surface: hypothesis generates the inputs, a check
function answers each one, and a Tally counts what happened.

A check returns the Outcome of one input (a result, or the declared
error) and lets anything else escape: hypothesis then shrinks the input
and the test fails with it. The long runner (tools/reliability_cases)
runs the same surfaces in batches for a time, recording each failure as a
violation and carrying on with a fresh seed.
"""
from __future__ import annotations

import enum
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st


class Outcome(str, enum.Enum):
    RESULT = "result"      # the input was taken
    REFUSED = "refused"    # the declared error, naming what was wrong


@dataclass
class Tally:
    """What one surface met: inputs tried, how each ended, and every
    violation (anything but a result or the declared error)."""
    surface: str
    inputs: int = 0
    results: int = 0
    refusals: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def count(self, outcome: Outcome) -> None:
        self.inputs += 1
        if outcome is Outcome.RESULT:
            self.results += 1
        else:
            self.refusals += 1

    @property
    def rate(self) -> float:
        """Inputs a second."""
        return self.inputs / self.seconds if self.seconds else 0.0

    def row(self) -> dict:
        """One row of tools/reliability's table."""
        return {"scenario": f"fuzz {self.surface}", "seconds": self.seconds,
                "ops": self.inputs, "faults": 0,
                "violations": len(self.violations),
                "notes": f"{self.results} taken, {self.refusals} refused, "
                         f"{self.rate:.0f}/s",
                "problems": self.violations}


def _settings(examples: int) -> settings:
    # No example database: a long run must not replay old inputs, and a
    # failure is reported with its input, not stored. No deadline: a call
    # through the broker may wait on a busy machine.
    return settings(max_examples=examples, deadline=None, database=None,
                    phases=[Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck))


def explore(tally: Tally, strategy: st.SearchStrategy,
            check: Callable[[object], Outcome], examples: int,
            seed_value: int | None = None) -> None:
    """Try ``examples`` inputs; the first one whose check raises is shrunk
    and its exception re-raised."""
    def counted(value) -> None:
        tally.count(check(value))

    test = _settings(examples)(given(strategy)(counted))
    if seed_value is not None:
        test = seed(seed_value)(test)
    began = time.monotonic()
    try:
        test()
    finally:
        tally.seconds += time.monotonic() - began


def explore_for(tally: Tally, strategy: st.SearchStrategy,
                check: Callable[[object], Outcome], seconds: float,
                batch: int = 500) -> Tally:
    """Batches of fresh inputs until ``seconds`` have passed; a failing
    batch is one violation, its shrunk input and error recorded."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            explore(tally, strategy, check, batch, random.getrandbits(64))
        except Exception as error:
            tally.violations.append(
                f"{tally.surface}: {type(error).__name__}: "
                f"{' '.join(str(error).split())[:300]}\n"
                + "".join(traceback.format_exception(error)[-3:]))
    return tally
