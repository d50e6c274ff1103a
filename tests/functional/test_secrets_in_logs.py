"""A password set in the config, and the transport URL's, never appear in
the daemon's log, at debug level included (issue 15): a real daemon
authenticating through Keystone (a stand-in that issues tokens) and
talking to the machine's RabbitMQ, with every option logged at start."""
from __future__ import annotations

from compute_agent.cmd.common import load_config
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.testing.local_placement import free_port
from tests.functional.keystone_standin import KeystoneStandin
from tests.functional.test_rpc import AgentDaemon
from tests.functional.test_status import rewrite

PLACEMENT_PASSWORD = "s3cret-placement-pw"
BROKER_PASSWORD = "guest"  # the machine's RabbitMQ: guest/guest


def test_no_password_in_the_log_at_debug_level(tmp_path, placement, services):
    keystone = KeystoneStandin(free_port(), placement.url).start()
    agent = AgentDaemon(tmp_path, placement.url)
    try:
        rewrite(agent.conf, DEFAULT={"debug": "true"},
                placement={"auth_type": "password", "auth_url": keystone.auth_url,
                           "username": "compute-agent", "password": PLACEMENT_PASSWORD,
                           "project_name": "service", "user_domain_name": "Default",
                           "project_domain_name": "Default", "endpoint": None})
        api = ComputeAgentAPI(load_config(["--config-file", str(agent.conf)]), timeout=10)
        try:
            agent.start(api)
            api.get_host_info(agent.name)
        finally:
            agent.stop()
            api.close()
        log = agent.log.read_text()
        assert keystone.token_requests >= 1  # it did authenticate
        assert "DEBUG" in log and "transport_url" in log  # options were logged
        assert PLACEMENT_PASSWORD not in log
        assert f":{BROKER_PASSWORD}@" not in log
    finally:
        keystone.stop()
