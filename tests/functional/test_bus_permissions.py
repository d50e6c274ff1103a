"""A broker user per host, on a RabbitMQ node of the module's own
(tests/functional/private_services.py): each of two compute-agent daemons
(the libvirt test driver, the real Placement) connects as a user holding
exactly what ``compute-agent-manage bus-permissions HOST --json`` printed
for it; this process is the conductor, as ``guest``, with every
permission. Builds, a resize from one host to the other, the evacuation's
fence (each destination asks the source's heartbeat as its own user) and
an evacuation pass; what a host's user must not do, the broker refuses.

A live migration is not here: on the bus it is the conductor's calls of
each host, as a resize is (no agent calls another's compute-agent.HOST),
and it needs real QEMU guests on two private libvirtds
(test_live_migration_agents.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import amqp
import kombu
import pytest
from amqp import exceptions as amqp_exceptions
from keystoneauth1 import adapter, session

from compute_agent.cmd.common import load_config
from compute_agent.exception import NoSuchInstance, SourceHostUp
from compute_agent.messaging import TOPIC
from compute_agent.placement.allocations import move_allocations
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.heartbeat import TOPIC as HEARTBEAT_TOPIC
from tests.functional.helpers import put_allocations
from tests.functional.private_services import PrivateRabbitMQ
from tests.functional.test_rpc import BIGGER, SPEC, AgentDaemon
from tests.functional.test_status import rewrite
from tests.waiting import wait_for

PASSWORD = "its-own"
DOWN_AFTER = 2


def command(module: str, conf: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"compute_agent.cmd.{module}",
                           "--config-file", str(conf), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def broker():
    node = PrivateRabbitMQ()
    try:
        yield node.start()
    finally:
        node.close()


def agent_with_its_own_user(directory: Path, placement_url: str,
                            broker: PrivateRabbitMQ) -> AgentDaemon:
    """An agent (not started) whose transport_url names a user of its host's
    own, with the permissions bus-permissions prints for it."""
    agent = AgentDaemon(directory, placement_url)
    url = broker.add_user(agent.name, PASSWORD)
    agent.conf = agent.host.write_conf({"transport_url": url, "update_interval": 2,
                                        "service_down_time": DOWN_AFTER})
    printed = command("manage", agent.conf, "bus-permissions", agent.name, "--json")
    assert printed.returncode == 0, printed.stderr
    permissions = json.loads(printed.stdout)
    broker.set_permissions(agent.name, permissions["configure"], permissions["write"],
                           permissions["read"])
    for topic in permissions["topic"]:
        broker.set_topic_permissions(agent.name, topic["exchange"], topic["write"],
                                     topic["read"])
    return agent


class Cloud:
    """Agents A and B, each as its own user, and the conductor as guest."""

    def __init__(self, root: Path, placement_url: str, broker: PrivateRabbitMQ):
        self.url = placement_url
        self.broker = broker
        self.a = agent_with_its_own_user(root / "a", placement_url, broker)
        self.b = agent_with_its_own_user(root / "b", placement_url, broker)
        self.conductor_conf = root / "conductor.conf"
        self.conductor_conf.write_text(self.a.conf.read_text())
        rewrite(self.conductor_conf, DEFAULT={"transport_url": broker.url, "host": "conductor"})
        conf = load_config(["--config-file", str(self.conductor_conf)])
        self.control_exchange = conf.control_exchange
        self.api = ComputeAgentAPI(conf, timeout=30)
        self.placement = PlacementClient(adapter.Adapter(
            session.Session(auth=NoAuth2(placement_url)), service_type="placement"))
        for agent in (self.a, self.b):
            agent.start(self.api)

    def build(self, agent: AgentDaemon) -> str:
        instance = str(uuid.uuid4())
        wanted = agent.allocations()
        put_allocations(self.url, instance, wanted)
        assert self.api.build_instance(agent.name, instance, SPEC, wanted)["running"]
        return instance

    def connection(self, agent: AgentDaemon | None) -> kombu.Connection:
        """A connection of the agent's own user; with None, the conductor's."""
        user, password = (agent.name, PASSWORD) if agent else ("guest", "guest")
        found = kombu.Connection(hostname="127.0.0.1", port=self.broker.port,
                                 userid=user, password=password, virtual_host="/")
        found.connect()
        return found

    def close(self) -> None:
        for agent in (self.a, self.b):
            agent.stop()
        self.api.close()


@pytest.fixture(scope="module")
def cloud(tmp_path_factory, placement, services, broker):
    found = Cloud(tmp_path_factory.mktemp("bus-permissions"), placement.url, broker)
    yield found
    found.close()


def test_builds_a_resize_the_fence_and_an_evacuation_pass_with_a_user_per_host(cloud):
    a, b, api = cloud.a, cloud.b, cloud.api
    # On the host, as its user: its own agent, through RPC.
    device = command("manage", a.conf, "device", "list", "--json")
    assert (device.returncode, json.loads(device.stdout)) == (0, []), device.stdout + device.stderr

    # A resize from A to B, confirmed.
    moved = cloud.build(a)
    migration = str(uuid.uuid4())
    move_allocations(cloud.placement, moved, migration)
    bigger = b.allocations(vcpus=4, memory_mb=2048)
    put_allocations(cloud.url, moved, bigger)
    api.prep_resize(b.name, migration, moved, BIGGER, bigger)
    api.resize_instance(a.name, migration, moved)
    assert api.finish_resize(b.name, migration, moved)["running"]
    api.confirm_resize(a.name, migration, moved)
    with pytest.raises(NoSuchInstance):
        api.get_instance(a.name, moved)
    assert api.get_instance(b.name, moved)["spec"]["vcpus"] == 4

    # The fence: B asks A's heartbeat, A answers B's reply queue.
    evacuated = cloud.build(a)
    with pytest.raises(SourceHostUp, match=a.name):
        api.rebuild_instance(b.name, str(uuid.uuid4()), evacuated, SPEC, b.allocations(),
                             source_host=a.name)

    # A is down: the conductor's evacuation, B's fence waiting out A's silence.
    a.stop()
    done = command("ctl", cloud.conductor_conf, "--timeout", "30", "evacuate", a.name,
                   "--target", b.name, "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    [outcome] = json.loads(done.stdout)["instances"]
    assert (outcome["instance"], outcome["destination"]) == (evacuated, b.name)
    assert api.get_instance(b.name, evacuated)["running"]
    a.start(api)  # it gives the evacuated instance up, and serves again
    with pytest.raises(NoSuchInstance):
        api.get_instance(a.name, evacuated)


def refused(attempt) -> str:
    """The broker's refusal of what ``attempt`` does on a channel of its
    own (the refusal closes it), or "" when it went through."""
    try:
        attempt()
    except amqp_exceptions.AccessRefused as e:
        return str(e)
    return ""


def test_a_hosts_user_may_not_call_or_read_another_hosts_agent(cloud):
    a, b = cloud.a, cloud.b
    their_queue = f"{TOPIC}.{b.name}"
    with cloud.connection(a) as connection:
        def publish(routing_key: str) -> None:
            channel = connection.channel()
            channel.basic_publish(amqp.Message("{}"), exchange=cloud.control_exchange,
                                  routing_key=routing_key)
            # A refusal closes the channel, and arrives with the next answer.
            channel.queue_declare(their_queue, passive=True)
            channel.close()

        assert "403" in refused(lambda: publish(their_queue))
        assert "ACCESS_REFUSED" in refused(lambda: connection.channel().basic_consume(
            their_queue, callback=lambda message: None))
        assert "ACCESS_REFUSED" in refused(lambda: connection.channel().queue_bind(
            f"{TOPIC}.{a.name}", cloud.control_exchange, their_queue))
        # What it may: call a host's heartbeat (here a host with no agent).
        assert refused(lambda: publish(f"{HEARTBEAT_TOPIC}.nobody")) == ""


def cast_of(method: str, **args: object) -> dict:
    """An RPC cast as oslo.messaging's rabbit driver puts it on the wire."""
    message = {"method": method, "args": args, "version": "1.0",
               "_unique_id": uuid.uuid4().hex}
    return {"oslo.version": "2.0", "oslo.message": json.dumps(message)}


def test_a_request_put_in_another_hosts_queue_by_the_default_exchange_is_dropped(cloud):
    """The default exchange, which a host's user must write to to answer
    its callers, routes to any queue by its name: A's user can put a build
    in B's queue that way (the broker took it: 1 message held before this
    release's agents). B's agent drops what did not come through the
    control exchange; the same cast through it, the conductor's, builds."""
    b = cloud.b
    instance = str(uuid.uuid4())
    # Its VCPU and memory only: the module's builds hold B's VFs.
    wanted = {provider: {"resources": {rc: n for rc, n in held["resources"].items()
                                       if rc in ("VCPU", "MEMORY_MB")}}
              for provider, held in b.allocations().items()}
    wanted = {p: held for p, held in wanted.items() if held["resources"]}
    put_allocations(cloud.url, instance, wanted)
    build = cast_of("build_instance", instance_uuid=instance, spec=SPEC, allocations=wanted)
    with cloud.connection(cloud.a) as a:
        kombu.Producer(a.channel()).publish(build, exchange="", routing_key=f"{TOPIC}.{b.name}",
                                            serializer="json")
    wait_for(lambda: "published to exchange ''" in b.log.read_text(), 30)
    with pytest.raises(NoSuchInstance):
        cloud.api.get_instance(b.name, instance)
    with cloud.connection(None) as conductor:
        kombu.Producer(conductor.channel()).publish(
            build, exchange=cloud.control_exchange, routing_key=f"{TOPIC}.{b.name}",
            serializer="json")
    found = wait_for(lambda: answered(lambda: cloud.api.get_instance(b.name, instance)), 30)
    assert found["uuid"] == instance
    cloud.api.delete_instance(b.name, instance)


def answered(call):
    try:
        return call()
    except NoSuchInstance:
        return None
