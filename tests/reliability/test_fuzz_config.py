"""Short fuzzing of config files through the agent's start-up read (the
long run: tools/reliability_cases/fuzz.py)."""
from __future__ import annotations

from tests.reliability.config_fuzz import FuzzedConfig
from tests.reliability.exploring import Tally, explore

EXAMPLES = 150


def test_config_files_are_taken_or_refused_in_one_line(tmp_path):
    config = FuzzedConfig(tmp_path)
    tally = Tally("config files")
    explore(tally, config.inputs(), config.check, EXAMPLES)
    assert tally.inputs >= EXAMPLES and tally.results and tally.refusals
