"""The conductor's side of an evacuation (compute_agent/conductor/
evacuation.py): which write refusal is worth fresh candidates; then the
Evacuator between the Placement stand-in of placements.py and the agents'
answers (heartbeats, rebuild_instance, get_instance): the hosts it lists,
each instance moved and rebuilt or why not, what an earlier run left, and
the wait until the rebuilt guests run, on a clock that sleeps at once."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from compute_agent.conductor import evacuation
from compute_agent.conductor.errors import NoSuchHost
from compute_agent.conductor.evacuation import WRITE_ATTEMPTS, Evacuation, Evacuator, lost_a_race
from compute_agent.exception import (
    AgentError,
    GenerationConflict,
    InvalidRequest,
    NoSuchInstance,
    PlacementError,
    SourceHostUp,
)
from compute_agent.messaging import messaging
from compute_agent.moves.evacuation import evacuation_migration_uuid
from compute_agent.rpc.heartbeat import HostState, Liveness
from tests.unit.clocks import SleepingClock
from tests.unit.conductor.placements import Held, Placement


def test_only_a_409_on_the_allocation_write_is_worth_fresh_candidates():
    capacity = PlacementError("Placement answered 409 to POST /allocations: Unable to "
                              "allocate inventory", 409, "placement.undefined_code")
    assert lost_a_race(capacity)
    assert lost_a_race(GenerationConflict("POST /allocations: consumer generation", 409,
                                          "placement.concurrent_update"))
    assert not lost_a_race(PlacementError("Placement answered 400 to POST "
                                          "/allocations: bad", 400, None))


# --- the Evacuator, between a Placement stand-in and the agents' answers --------

SRC, SRC_CELL, DST, DST_CELL, FAR, FAR_CELL = (str(uuid.uuid4()) for _ in range(6))
RESOURCES = {"VCPU": 2, "MEMORY_MB": 1024}
REPORT = {"time": 1700000000.0, "instances": 7}


def three_hosts() -> Placement:
    """Hosts src, dst and far, each a root with one NUMA cell; dst has room."""
    placement = Placement(room=[DST])
    for name, root, cell in (("src", SRC, SRC_CELL), ("dst", DST, DST_CELL),
                             ("far", FAR, FAR_CELL)):
        placement.add(root, name, None, frozenset({"COMPUTE_NODE"}))
        placement.add(cell, f"{name}_numa_0", root, frozenset({"HW_NUMA_ROOT"}))
    return placement


class Agents:
    """The agents as the conductor reaches them: their heartbeats (the hosts
    in ``up`` answer), their answers to rebuild_instance and get_instance.
    An accepted rebuild's guest runs at once; ``views`` holds what each
    destination has of each instance."""

    down_after = 60.0

    def __init__(self, up: set[str]) -> None:
        self.up = up
        self.heartbeats: list[list[str]] = []
        self.rebuilds: list[tuple] = []
        self.refusals: dict[str, Exception] = {}  # host -> what rebuild_instance raises
        self.silent: set[str] = set()  # hosts whose get_instance times out
        self.views: dict[tuple[str, str], dict] = {}

    def check_many(self, hosts: list[str]) -> dict[str, Liveness]:
        self.heartbeats.append(list(hosts))
        return {h: Liveness(h, HostState.UP if h in self.up else HostState.DOWN, 0.0,
                            REPORT if h in self.up else None) for h in hosts}

    def rebuild_instance(self, host: str, migration: str, instance: str, spec: dict,
                         allocations: dict, source_host: str, force: bool) -> dict:
        self.rebuilds.append((host, migration, instance, spec, allocations, source_host,
                              force))
        if host in self.refusals:
            raise self.refusals[host]
        self.views[(host, instance)] = view(migration, "confirmed", running=True)
        return {"migration_uuid": migration, "state": "accepted"}

    def get_instance(self, host: str, instance: str) -> dict:
        if host in self.silent:
            raise messaging.MessagingTimeout(f"get_instance to {host}: no answer")
        found = self.views.get((host, instance))
        if found is None:
            raise NoSuchInstance(instance)
        return found


def view(migration: str, state: str, running: bool) -> dict:
    """An agent's get_instance answer of an instance with one move."""
    return {"running": running, "migrations": [{"uuid": migration, "state": state}]}


@dataclass
class Cloud:
    placement: Placement
    agents: Agents
    evacuator: Evacuator

    def instance_on_src(self, resources: dict[str, int] = RESOURCES) -> str:
        instance = str(uuid.uuid4())
        self.placement.consumers[instance] = Held({SRC_CELL: dict(resources)})
        return instance

    def evacuated(self, source: str = "src", **kwargs) -> tuple[Evacuation, list[tuple]]:
        """The evacuation, and what progress was told: (instance, state)."""
        told: list[tuple] = []
        result = self.evacuator.evacuate(
            source, progress=lambda o: told.append((o.instance, o.state)), **kwargs)
        return result, told


@pytest.fixture
def cloud() -> Cloud:
    placement, agents = three_hosts(), Agents(up={"dst", "far"})
    return Cloud(placement, agents, Evacuator(placement, agents, agents, parallel=1))


def migration_of(instance: str) -> str:
    return evacuation_migration_uuid(instance, SRC)


def test_hosts_are_up_or_down_by_their_heartbeat_asked_once_for_all(cloud):
    instance = cloud.instance_on_src()
    # An earlier evacuation's hold on the down host is not its instance.
    cloud.placement.consumers["hold"] = Held({SRC_CELL: {"VCPU": 1}}, "MIGRATION")
    assert cloud.evacuator.hosts() == [
        {"host": "dst", "root_uuid": DST, "state": "up", "last_seen": REPORT["time"],
         "instances": 7},
        {"host": "far", "root_uuid": FAR, "state": "up", "last_seen": REPORT["time"],
         "instances": 7},
        {"host": "src", "root_uuid": SRC, "state": "down", "last_seen": None,
         "instances": 1}]
    assert cloud.agents.heartbeats == [["dst", "far", "src"]]
    # Only the down host's consumers are read, one request each.
    assert sorted(r for r in cloud.placement.requests if r.startswith("GET /alloc")) == \
        sorted(f"GET /allocations/{c}" for c in ("hold", instance))


def test_a_host_placement_does_not_have_is_refused_by_name(cloud):
    with pytest.raises(NoSuchHost, match="^SOURCE: no compute host named 'nope' in "
                                         "Placement$"):
        cloud.evacuated("nope")
    with pytest.raises(NoSuchHost, match="'elsewhere'"):
        cloud.evacuated(target="elsewhere")


def test_an_up_source_is_evacuated_only_when_forced_and_never_to_itself(cloud):
    instance = cloud.instance_on_src()
    cloud.agents.up.add("src")
    with pytest.raises(SourceHostUp, match="src is up"):
        cloud.evacuated()
    assert "POST /allocations" not in cloud.placement.requests
    cloud.placement.room = [SRC, DST]  # the source has room, and answers
    result, _ = cloud.evacuated(force=True)
    assert [(o.instance, o.state, o.destination) for o in result.outcomes] == [
        (instance, "running", "dst")]
    assert cloud.agents.rebuilds[0][-2:] == ("src", True)


def test_each_instance_is_moved_rebuilt_and_followed_until_it_runs(cloud):
    first, second = sorted(cloud.instance_on_src() for _ in range(2))
    cloud.evacuator.parallel = 4
    result, told = cloud.evacuated()
    assert result.ok and result.as_dict() == {"source": "src", "ok": True, "instances": [
        {"instance": i, "state": "running", "destination": "dst",
         "migration": migration_of(i), "error": None} for i in (first, second)]}
    for instance in (first, second):
        # The swap: the instance holds the destination, its move the source.
        assert cloud.placement.allocations_of(instance) == {DST_CELL: RESOURCES}
        assert cloud.placement.allocations_of(migration_of(instance)) == {SRC_CELL: RESOURCES}
        assert cloud.placement.consumers[migration_of(instance)].consumer_type == "MIGRATION"
        assert told.index((instance, "accepted")) < told.index((instance, "running"))
    assert sorted(cloud.agents.rebuilds) == sorted(
        ("dst", migration_of(i), i, {"name": f"instance-{i}", "vcpus": 2, "memory_mb": 1024},
         {DST_CELL: {"resources": RESOURCES}}, "src", False) for i in (first, second))
    # Each host's heartbeat asked once, whatever the number of workers.
    assert sorted(h for asked in cloud.agents.heartbeats for h in asked) == ["dst", "src"]


def test_the_first_candidate_on_an_up_host_other_than_the_source_is_taken(cloud):
    instance = cloud.instance_on_src()
    cloud.agents.up = {"dst"}
    cloud.placement.room = [SRC, FAR, DST]
    result, _ = cloud.evacuated()
    assert [o.destination for o in result.outcomes] == ["dst"]
    assert cloud.placement.allocations_of(instance) == {DST_CELL: RESOURCES}
    # The candidates' hosts asked together: a down one costs one deadline.
    assert [asked for asked in cloud.agents.heartbeats if asked] == [["src"], ["dst", "far"]]


def test_a_target_restricts_the_candidates_to_its_tree(cloud):
    cloud.instance_on_src()
    cloud.placement.room = [DST, FAR]
    result, _ = cloud.evacuated(target="far")
    assert [o.destination for o in result.outcomes] == ["far"]
    (asked,) = [r for r in cloud.placement.requests if r.startswith("GET /allocation_c")]
    assert f"in_tree_CELL0={FAR}" in asked


def test_no_room_on_an_up_host_fails_the_instance_and_moves_nothing(cloud):
    instance = cloud.instance_on_src()
    cloud.agents.up = set()
    result, told = cloud.evacuated()
    assert not result.ok
    [outcome] = result.outcomes
    assert (outcome.state, outcome.destination) == ("failed", None)
    assert outcome.error.startswith("no up host has room for it")
    assert told == [(instance, "failed")]
    assert cloud.placement.allocations_of(instance) == {SRC_CELL: RESOURCES}
    assert "POST /allocations" not in cloud.placement.requests


def test_a_destination_s_refusal_moves_the_allocations_back_to_the_source(cloud):
    instance = cloud.instance_on_src()
    cloud.agents.refusals["dst"] = InvalidRequest(
        "instance_uuid", instance, "has a guest on this host\nsecond line")
    result, _ = cloud.evacuated()
    [outcome] = result.outcomes
    assert (outcome.state, outcome.destination) == ("failed", "dst")
    assert outcome.error == "instance_uuid: has a guest on this host"
    assert cloud.placement.allocations_of(instance) == {SRC_CELL: RESOURCES}
    assert cloud.placement.allocations_of(migration_of(instance)) is None


def test_a_lost_answer_leaves_the_destination_holding_the_instance(cloud):
    instance = cloud.instance_on_src()
    cloud.agents.refusals["dst"] = messaging.MessagingTimeout("no reply")
    result, _ = cloud.evacuated()
    [outcome] = result.outcomes
    assert outcome.state == "failed"
    assert outcome.error.startswith("no answer from dst: if it accepted the rebuild it "
                                    "owns it and resumes it; evacuate src again")
    assert cloud.placement.allocations_of(instance) == {DST_CELL: RESOURCES}


def conflict() -> PlacementError:
    return PlacementError("Placement answered 409 to POST /allocations: Unable to allocate "
                          "inventory", 409, "placement.undefined_code")


def test_a_write_that_lost_a_race_asks_for_candidates_again(cloud):
    instance = cloud.instance_on_src()
    cloud.placement.write_errors = [conflict(), conflict()]
    result, _ = cloud.evacuated()
    assert [o.state for o in result.outcomes] == ["running"]
    assert sum(r.startswith("GET /allocation_candidates") for r in
               cloud.placement.requests) == 3
    assert cloud.placement.allocations_of(instance) == {DST_CELL: RESOURCES}


@pytest.mark.parametrize("errors, error", [
    ([conflict()] * WRITE_ATTEMPTS, "allocations not written: Placement answered 409 to "
                                    "POST /allocations: Unable to allocate inventory"),
    ([PlacementError("Placement answered 400 to POST /allocations: bad\nmore", 400)],
     "allocations not written: Placement answered 400 to POST /allocations: bad"),
])
def test_a_write_refused_or_lost_at_each_attempt_fails_the_instance(cloud, errors, error):
    instance = cloud.instance_on_src()
    cloud.placement.write_errors = list(errors)
    result, _ = cloud.evacuated()
    [outcome] = result.outcomes
    assert (outcome.state, outcome.error) == ("failed", error)
    assert cloud.placement.write_errors == [] and cloud.agents.rebuilds == []
    assert cloud.placement.allocations_of(instance) == {SRC_CELL: RESOURCES}


def test_an_instance_in_a_move_is_skipped_which_fails_nothing(cloud):
    moving = cloud.instance_on_src()
    cloud.placement.consumers[moving].allocations[FAR_CELL] = {"VCPU": 1}
    result, _ = cloud.evacuated()
    assert [(o.instance, o.state, o.error) for o in result.outcomes] == [
        (moving, "skipped", "holds allocations on another host too (in a move)")]
    assert result.ok and cloud.agents.rebuilds == []


def test_an_instance_without_memory_is_not_one_to_rebuild(cloud):
    instance = cloud.instance_on_src({"VCPU": 2})
    result, _ = cloud.evacuated()
    [outcome] = result.outcomes
    assert outcome.state == "failed" and not result.ok
    assert outcome.error == (f"instance {instance}: its allocations hold no CPU or no "
                             "memory; not an instance this agent can rebuild")
    assert cloud.agents.rebuilds == []


# --- what an earlier run left ---------------------------------------------------

def left_by_an_earlier_run(cloud: Cloud, instance: str | None = None) -> str:
    """An instance whose allocations an earlier evacuation of src moved to
    dst (its move holding src's) before the conductor went away."""
    instance = instance or str(uuid.uuid4())
    cloud.placement.consumers[instance] = Held({DST_CELL: dict(RESOURCES)})
    cloud.placement.consumers[migration_of(instance)] = Held({SRC_CELL: dict(RESOURCES)},
                                                             "MIGRATION")
    return instance


def test_a_rebuild_the_destination_never_took_is_asked_again(cloud):
    instance = left_by_an_earlier_run(cloud)
    result, told = cloud.evacuated()
    assert [(o.instance, o.state, o.destination) for o in result.outcomes] == [
        (instance, "running", "dst")]
    [rebuild] = cloud.agents.rebuilds
    assert rebuild[:4] == ("dst", migration_of(instance), instance,
                           {"name": f"instance-{instance}", "vcpus": 2, "memory_mb": 1024})
    assert rebuild[4] == {DST_CELL: {"resources": RESOURCES}}
    assert told == [(instance, "accepted"), (instance, "running")]
    # Nothing is evacuated twice: no new candidates, no new write.
    assert not [r for r in cloud.placement.requests
                if r.startswith(("GET /allocation_candidates", "POST"))]


def test_the_outcomes_are_listed_by_instance_whichever_pass_found_them(cloud):
    fresh = "ffffffff-0000-4000-8000-000000000000"
    cloud.placement.consumers[fresh] = Held({SRC_CELL: dict(RESOURCES)})
    earlier = left_by_an_earlier_run(cloud, "00000000-0000-4000-8000-000000000000")
    result, told = cloud.evacuated()
    assert [o.instance for o in result.outcomes] == [earlier, fresh]
    assert told[:2] == [(fresh, "accepted"), (earlier, "accepted")]


def test_a_rebuild_the_destination_finished_is_not_reported_again(cloud):
    instance = left_by_an_earlier_run(cloud)
    cloud.agents.views[("dst", instance)] = view(migration_of(instance), "confirmed", True)
    result, told = cloud.evacuated()
    assert result.outcomes == [] and told == [] and cloud.agents.rebuilds == []


@pytest.mark.parametrize("state, running, found, error", [
    # Accepted, not running yet when the deadline passed.
    ("active", False, "accepted", None),
    # The instance is there, but not by this move: hands off.
    (None, True, "failed", "dst has the instance but not its evacuation {migration}; see "
                           "compute-agent-ctl show dst {instance}"),
])
def test_what_the_destination_has_of_an_earlier_rebuild_is_reported(
        cloud, state, running, found, error):
    instance = left_by_an_earlier_run(cloud)
    migration = migration_of(instance)
    cloud.agents.views[("dst", instance)] = (
        view(migration, state, running) if state else {"running": running, "migrations": []})
    result, _ = cloud.evacuated(deadline=0)
    [outcome] = result.outcomes
    assert (outcome.state, outcome.destination, outcome.migration) == (found, "dst", migration)
    assert outcome.error == (error and error.format(migration=migration, instance=instance))
    assert cloud.agents.rebuilds == []


def test_an_earlier_rebuild_on_a_down_or_silent_destination_is_left_to_it(cloud):
    instance = left_by_an_earlier_run(cloud)
    cloud.agents.up = set()
    result, _ = cloud.evacuated()
    [outcome] = result.outcomes
    assert outcome.state == "failed" and outcome.error.startswith(
        "dst is down and holds its allocations: if it accepted the rebuild it resumes it")
    cloud.agents.up = {"dst"}
    cloud.agents.silent = {"dst"}
    cloud.evacuator = Evacuator(cloud.placement, cloud.agents, cloud.agents, parallel=1)
    result, _ = cloud.evacuated()
    assert [(o.state, o.error) for o in result.outcomes] == [("failed", "no answer from dst")]
    assert cloud.agents.rebuilds == []
    assert cloud.placement.allocations_of(instance) == {DST_CELL: RESOURCES}


# --- waiting until the rebuilt guests run ---------------------------------------

class Poll:
    """The agents' get_instance as the progress poll sees it: each answer
    from ``answers`` in turn (an exception is raised), the last repeated."""

    def __init__(self, agents: Agents, answers: list) -> None:
        self.agents = agents
        self.answers = answers
        self.asked: list[tuple[str, str]] = []

    def get_instance(self, host: str, instance: str) -> dict:
        self.asked.append((host, instance))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer == "view":
            return self.agents.views[(host, instance)]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def clock(monkeypatch) -> SleepingClock:
    clock = SleepingClock()
    monkeypatch.setattr(evacuation, "time", SimpleNamespace(monotonic=clock,
                                                            sleep=clock.sleep))
    return clock


def polled(cloud: Cloud, answers: list) -> Poll:
    poll = Poll(cloud.agents, answers)
    cloud.evacuator = Evacuator(cloud.placement, cloud.agents, cloud.agents, poll=poll,
                                parallel=1)
    return poll


def test_a_destination_silent_for_a_round_is_asked_again_after_a_pause(cloud, clock):
    instance = cloud.instance_on_src()
    poll = polled(cloud, [messaging.MessagingTimeout("slow"), AgentError("store busy"),
                          "view"])
    result, _ = cloud.evacuated()
    assert [o.state for o in result.outcomes] == ["running"]
    assert poll.asked == [("dst", instance)] * 3 and clock.slept == [0.2, 0.2]


def test_a_silent_destination_is_asked_once_a_round_whatever_its_instances(cloud, clock):
    """A destination that does not answer costs one timeout a round, not
    one per instance it took."""
    instances = sorted(cloud.instance_on_src() for _ in range(3))
    timeout = messaging.MessagingTimeout("slow")
    poll = polled(cloud, [timeout, timeout, "view"])
    result, _ = cloud.evacuated()
    assert [o.state for o in result.outcomes] == ["running"] * 3
    assert poll.asked == [("dst", instances[0])] * 2 + [("dst", i) for i in instances]
    assert clock.slept == [0.2, 0.2]


def test_instances_not_running_by_the_deadline_stay_accepted(cloud, clock):
    instance = cloud.instance_on_src()
    poll = polled(cloud, [view(migration_of(instance), "active", running=False)])
    result, told = cloud.evacuated(deadline=clock() + 1.0)
    assert [o.state for o in result.outcomes] == ["accepted"]
    assert told == [(instance, "accepted")] and not result.ok
    assert clock.slept == [0.2] * 5 and len(poll.asked) == 5
