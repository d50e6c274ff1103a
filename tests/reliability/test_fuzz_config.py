"""Short fuzzing of config files through the agent's start-up read (the
long run: tools/reliability_cases/fuzz.py)."""
from __future__ import annotations

from tests.reliability.config_fuzz import ConfigSweep, FuzzedConfig
from tests.reliability.exploring import Tally, explore

EXAMPLES = 150


def test_config_files_are_taken_or_refused_in_one_line(tmp_path):
    config = FuzzedConfig(tmp_path)
    tally = Tally("config files")
    explore(tally, config.inputs(), config.check, EXAMPLES)
    assert tally.inputs >= EXAMPLES and tally.results and tally.refusals


def test_the_sweep_refuses_each_mistake_in_its_line_and_takes_other_versions_names(tmp_path):
    """Misspelt options and sections, names of another version, and each
    class of value that cannot work; the counts go in the closing note."""
    counts = ConfigSweep(tmp_path).run()
    print(f"\nconfig sweep: {counts.cases} cases, {counts.right} handled right, "
          f"{counts.accepted_wrongly} accepted wrongly, {counts.refused_wrongly} refused "
          f"wrongly, {counts.badly_refused} refused badly, {counts.escaped} escaped")
    assert counts.wrong == []
