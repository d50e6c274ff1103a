"""The calls in flight and the stop's drain over them
(compute_agent/rpc/in_flight.py)."""
from __future__ import annotations

import threading

from compute_agent.rpc.in_flight import Call, CallsInFlight, call_of


def test_a_call_is_named_by_its_method_and_instance():
    assert call_of({"method": "finish_resize", "args": {"migration_uuid": "m-1",
                                                        "instance_uuid": "i-1"}}) == \
        Call("finish_resize", "i-1")


def test_a_call_about_the_host_or_malformed_has_no_instance():
    assert call_of({"method": "get_host_info", "args": {}}) == Call("get_host_info", None)
    assert call_of({"method": "build_instance", "args": "x"}) == Call("build_instance", None)
    assert call_of({"method": "build_instance", "args": {"instance_uuid": 7}}) == \
        Call("build_instance", None)


def test_no_call_is_taken_once_closed_and_close_counts_those_in_flight():
    calls = CallsInFlight()
    calls.take(Call("build_instance", "i-1"))
    done = calls.take(Call("delete_instance", "i-2"))
    assert done is not None
    calls.done(done)
    assert calls.close() == 1
    assert calls.take(Call("build_instance", "i-3")) is None
    assert calls.count == 1


def test_the_wait_ends_when_the_last_call_is_done():
    calls = CallsInFlight()
    tickets = [calls.take(Call("prep_resize", f"i-{n}")) for n in range(2)]
    calls.close()
    ending = threading.Thread(target=lambda: [calls.done(t) for t in tickets if t is not None])
    ending.start()
    # A bound that would hold the test for an hour if waited out.
    assert calls.wait(3600) == ()
    ending.join()


def test_the_wait_gives_the_calls_still_in_flight_at_its_bound_oldest_first():
    calls = CallsInFlight()
    first = calls.take(Call("live_migrate", "i-1"))
    calls.take(Call("finish_resize", "i-2"))
    calls.take(Call("build_instance", "i-3"))
    assert first is not None
    calls.done(first)
    assert calls.wait(0.01) == (Call("finish_resize", "i-2"), Call("build_instance", "i-3"))
