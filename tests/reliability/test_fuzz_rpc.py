"""Short fuzzing of RPC payloads through the machine's RabbitMQ to one
agent daemon (the long run: tools/reliability_cases/fuzz.py)."""
from __future__ import annotations

import pytest

from tests.reliability.exploring import Tally, explore
from tests.reliability.rpc_fuzz import FuzzedAgent, calls

EXAMPLES = 400


@pytest.fixture(scope="module")
def agent(tmp_path_factory, placement, services):
    fuzzed = FuzzedAgent(tmp_path_factory.mktemp("rpc-fuzz"), placement.url)
    yield fuzzed
    fuzzed.close()


def test_every_call_is_answered_as_declared_and_a_refusal_changes_nothing(agent):
    tally = Tally("RPC payloads")
    explore(tally, calls(agent.facts), agent.check, EXAMPLES)
    assert tally.inputs >= EXAMPLES and tally.results and tally.refusals
    # Unknown methods and versions among them: each one warning line.
    assert "Traceback" not in agent.daemon.log.read_text()
    print(f"{tally.inputs} calls ({tally.results} taken) in {tally.seconds:.1f} s, "
          f"{tally.rate:.0f}/s")
