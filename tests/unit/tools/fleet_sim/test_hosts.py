"""The fleet's configs: an agent's, and the run's callers', on a broker of
one node (oslo.messaging's defaults) or on a cluster (its options)."""
from __future__ import annotations

from compute_agent.cmd.common import load_config
from tests.functional.private_services import CLUSTER_RABBIT_OPTIONS
from tools.fleet_sim.hosts import Timing, write_agent_conf
from tools.fleet_sim.scenarios import ctl_conf

URL = "rabbit://guest:guest@127.0.0.1:5001,guest:guest@127.0.0.1:5002/"


def test_an_agent_on_a_cluster_takes_its_options_and_on_one_node_the_defaults(tmp_path):
    on_cluster = load_config(["--config-file", str(write_agent_conf(
        tmp_path / "a", "fleet-00000", 0, "http://placement", URL, Timing(),
        rabbit=CLUSTER_RABBIT_OPTIONS))])
    rabbit = on_cluster.oslo_messaging_rabbit
    assert (rabbit.rabbit_quorum_queue, rabbit.rabbit_transient_quorum_queue,
            rabbit.rabbit_stream_fanout, rabbit.use_queue_manager) == (True, True, True, True)
    assert rabbit.heartbeat_timeout_threshold == int(
        CLUSTER_RABBIT_OPTIONS["heartbeat_timeout_threshold"])
    assert (on_cluster.host, on_cluster.transport_url) == ("fleet-00000", URL)

    on_one_node = load_config(["--config-file", str(write_agent_conf(
        tmp_path / "b", "fleet-00001", 1, "http://placement", URL, Timing()))])
    assert not on_one_node.oslo_messaging_rabbit.rabbit_quorum_queue
    assert not on_one_node.oslo_messaging_rabbit.use_queue_manager


def test_the_runs_callers_take_the_agents_options_but_name_their_reply_queues_at_random(
        tmp_path):
    path, conf = ctl_conf(tmp_path, "http://placement", URL, 20, CLUSTER_RABBIT_OPTIONS)
    assert conf.oslo_messaging_rabbit.rabbit_quorum_queue
    assert conf.oslo_messaging_rabbit.rabbit_transient_quorum_queue
    # The queue manager fails every call where the run's process group
    # leader has exited.
    assert not conf.oslo_messaging_rabbit.use_queue_manager
    assert "use_queue_manager = true" in path.read_text()  # the operator's file, as written
    assert not ctl_conf(tmp_path, "http://placement", URL, 20)[1].oslo_messaging_rabbit \
        .rabbit_quorum_queue
