from dataclasses import replace

from compute_agent.daemon.probes import Phase, ProbeFacts, liveness, readiness

SERVING = ProbeFacts(phase=Phase.SERVING, loop_running=True, turn_seconds=None,
                     turn_limit=120, dead_threads=(), cycle_succeeded=True,
                     last_problem="", store_problem="")


def test_a_serving_daemon_waiting_for_its_next_cycle_is_alive_and_ready():
    assert liveness(SERVING) == (200, "alive: the update loop waits for its next cycle")
    assert readiness(SERVING).code == 200


def test_a_turn_within_its_limit_is_alive_beyond_it_stuck():
    assert liveness(replace(SERVING, turn_seconds=120)) == (
        200, "alive: the update loop's turn has run 120 s")
    assert liveness(replace(SERVING, turn_seconds=121)) == (
        503, "the update loop's turn has run 121 s, beyond its limit of 120 s "
        "([metrics] healthz_turn_limit)")


def test_a_dead_thread_or_a_loop_that_does_not_run_is_not_alive():
    died = replace(SERVING, dead_threads=("update-provider-tree: OverflowError: x",))
    assert liveness(died) == (503, "thread update-provider-tree: OverflowError: x died")
    assert liveness(replace(SERVING, loop_running=False)) == (
        503, "the update loop does not run")


def test_a_starting_daemon_is_neither_alive_nor_ready():
    starting = replace(SERVING, phase=Phase.STARTING, loop_running=False)
    assert liveness(starting).code == 503
    assert readiness(starting) == (503, "starting: RPC is not served yet")
    assert readiness(replace(starting, cycle_succeeded=False)) == (
        503, "no cycle has reached Placement yet: the first cycle runs")


def test_not_ready_until_a_cycle_reached_placement_saying_why():
    failing = replace(SERVING, cycle_succeeded=False,
                      last_problem="Placement at http://p did not answer")
    assert readiness(failing) == (
        503, "no cycle has reached Placement yet: Placement at http://p did not answer")
    # Not a restart's matter: the loop goes on.
    assert liveness(failing).code == 200


def test_ready_stays_while_placement_is_down_once_a_cycle_reached_it():
    assert readiness(replace(SERVING, last_problem="Placement down")).code == 200


def test_a_closed_store_or_a_stopping_daemon_is_not_ready():
    assert readiness(replace(SERVING, store_problem="store /s was removed")) == (
        503, "the store is not open: store /s was removed")
    assert readiness(replace(SERVING, phase=Phase.STOPPING)) == (503, "stopping")
