"""The fleet's count of what the agents hold on the broker: the broker's
lists, as rabbitmqctl prints them, less the run's own callers."""
from __future__ import annotations

from tools.fleet_sim.broker import (
    BrokerCounts,
    Connection,
    FramesInWindow,
    agents_frames_received,
    broker_counts,
    frames_in_window,
    pairs,
    parse_connections,
)

RUN_PID = 4242
NODE_A, NODE_B = "<rabbit-a@localhost.1796676192", "<rabbit-b@localhost.1796676189"


def properties(name: str | None) -> str:
    """A connection's client properties as rabbitmqctl prints them."""
    named = f'{{"connection_name","{name}"}},' if name else ""
    return (f'[{{"product","py-amqp"}},{{"product_version","5.4.2"}},{named}'
            '{"capabilities",[{"consumer_cancel_notify",true},{"connection.blocked",true}]}]')


def test_a_connection_row_gives_its_pid_frames_and_name():
    rows = [f"{NODE_A}.1137.0>\t7\t{properties('worker.py:17:9f2c')}",
            f"{NODE_B}.1606.0>\t12\t{properties(None)}"]
    assert parse_connections(rows) == [
        Connection(f"{NODE_A}.1137.0>", 7, "worker.py:17:9f2c"),
        Connection(f"{NODE_B}.1606.0>", 12, None)]


def test_a_connection_is_the_runs_when_its_name_carries_the_runs_pid():
    def by_run(name: str | None) -> bool:
        return Connection("<p>", 0, name).opened_by(RUN_PID)

    assert by_run(f"fleet.py:{RUN_PID}:0c3e-11")
    assert not by_run(f"worker.py:{RUN_PID}1:0c3e-11")
    assert not by_run(f"fleet.py:1{RUN_PID}:0c3e-11")
    assert not by_run(str(RUN_PID))
    assert not by_run(None)


def connection(pid: str, owner: int, frames: int = 0) -> Connection:
    return Connection(pid, frames, f"{'fleet' if owner == RUN_PID else 'worker'}.py:{owner}:u")


def test_the_agents_share_leaves_out_the_runs_connections_and_the_queues_consumed_on_them():
    # One agent (on node A) with its two queues; the run's API and
    # heartbeat clients on node B, each with its reply queue; a queue
    # nobody consumes.
    connections = [connection(f"{NODE_A}.1.0>", 17), connection(f"{NODE_A}.2.0>", 17),
                   connection(f"{NODE_B}.1.0>", RUN_PID), connection(f"{NODE_B}.2.0>", RUN_PID)]
    channels = pairs([f"{NODE_A}.11.0>\t{NODE_A}.1.0>", f"{NODE_A}.21.0>\t{NODE_A}.2.0>",
                      f"{NODE_B}.11.0>\t{NODE_B}.1.0>", f"{NODE_B}.21.0>\t{NODE_B}.2.0>"])
    consumers = pairs([f"compute-agent.h1\t{NODE_A}.11.0>",
                       f"compute-agent-heartbeat.h1\t{NODE_A}.11.0>",
                       f"reply_0f3a\t{NODE_B}.11.0>", f"reply_77b1\t{NODE_B}.21.0>"])
    queues = ["compute-agent.h1", "compute-agent-heartbeat.h1", "reply_0f3a", "reply_77b1",
              "reply_h1:worker.py:1"]
    counts = broker_counts(queues, connections, channels, consumers, RUN_PID)
    assert counts == BrokerCounts(queues=5, connections=4, agents_queues=3,
                                  agents_connections=2)
    assert broker_counts(queues, connections, channels, consumers, 1) == BrokerCounts(5, 4, 5, 4)


def test_the_per_host_figures_are_the_agents_share_over_the_hosts():
    assert BrokerCounts(queues=205, connections=226, agents_queues=200,
                        agents_connections=203).as_dict(hosts=100) == {
        "broker_queues": 205, "broker_connections": 226,
        "broker_queues_per_host": 2.0, "broker_connections_per_host": 2.03}


def test_the_agents_frames_leave_out_the_runs_connections():
    assert agents_frames_received([connection("<a>", 17, frames=30),
                                   connection("<b>", 18, frames=12),
                                   connection("<c>", RUN_PID, frames=500)], RUN_PID) == {
        "<a>": 30, "<b>": 12}


def test_bug_the_frames_went_negative_when_connections_were_made_again_in_the_window():
    before = {"<a>": 30, "<b>": 400}
    after = {"<a>": 42, "<d>": 5}  # <b> closed, <d> opened between the looks
    assert frames_in_window(before, after) == FramesInWindow(frames=12 + 5, connections_lost=1)
