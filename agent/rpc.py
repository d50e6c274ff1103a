"""The RPC server conductors call: topic ``compute-agent``, server = this
host, oslo.messaging's default (threading) executor.

Versioning. The API is 1.0. A new method, or a new optional argument,
raises the minor version (1.1, 1.2, ...) and is listed below with its
version; the server keeps answering every older 1.x call unchanged, so an
N-1 conductor keeps working. Clients send a new method only when their
``[upgrade_levels] compute_agent`` cap allows it (``can_send_version``).
A change that breaks 1.x callers would be 2.0, served beside 1.x for a
release.

Every payload is checked against its schema before anything is read or
changed; every method that changes state is idempotent on the instance and
migration uuids, so a conductor may retry after a timeout.
"""
from __future__ import annotations

import logging
from typing import Callable

from agent import rpc_schemas as schemas
from agent.exception import AgentError
from agent.messaging import TOPIC, messaging, transport
from agent.provider_tree import tree_as_dicts

LOG = logging.getLogger(__name__)
VERSION = "1.0"


def _host_info(agent, _payload: dict) -> dict:
    instances, live, _ = agent.manager.tracker.snapshot()
    return {"host": agent.policy.host, "root_uuid": agent.policy.root_uuid,
            "rpc_version": VERSION, "instances": len(instances),
            "assignments": len(live), "providers": len(agent.last_tree)}


# method -> (schema, call(agent, payload)); each is served as
# method(ctxt, **payload).
METHODS: dict[str, tuple[dict, Callable]] = {
    "get_host_info": (schemas.NOTHING, _host_info),
    "get_provider_tree": (schemas.NOTHING, lambda a, p: tree_as_dicts(a.last_tree)),
    "get_instance": (schemas.INSTANCE,
                     lambda a, p: a.manager.get_instance(p["instance_uuid"])),
    "build_instance": (schemas.CLAIM, lambda a, p: a.manager.build_instance(
        p["instance_uuid"], p["spec"], p["allocations"])),
    "delete_instance": (schemas.INSTANCE,
                        lambda a, p: a.manager.delete_instance(p["instance_uuid"])),
    "prep_resize": (schemas.MOVE_CLAIM, lambda a, p: a.manager.prep_resize(
        p["migration_uuid"], p["instance_uuid"], p["spec"], p["allocations"])),
    "check_can_live_migrate_destination": (
        schemas.MOVE_CLAIM, lambda a, p: a.manager.check_can_live_migrate_destination(
            p["migration_uuid"], p["instance_uuid"], p["spec"], p["allocations"])),
    "rebuild_instance": (schemas.MOVE_CLAIM, lambda a, p: a.manager.rebuild_instance(
        p["migration_uuid"], p["instance_uuid"], p["spec"], p["allocations"])),
}
for _name in ("resize_instance", "finish_resize", "confirm_resize", "revert_resize",
              "live_migrate", "post_live_migration_at_destination",
              "rollback_live_migration_at_destination"):
    METHODS[_name] = (schemas.MOVE, lambda a, p, _name=_name: getattr(a.manager, _name)(
        p["migration_uuid"], p["instance_uuid"]))


class ComputeAgentEndpoint:
    target = messaging.Target(version=VERSION)

    def __init__(self, agent):
        self.agent = agent

    def __getattr__(self, name: str):
        if name not in METHODS:
            raise AttributeError(name)
        schema, call = METHODS[name]

        # The caller's mistakes are answered, not logged as our failures.
        @messaging.expected_exceptions(AgentError)
        def serve(ctxt, **payload):
            schemas.validate(schema, payload)
            LOG.debug("RPC %s", name)
            return call(self.agent, payload)

        return serve


def make_server(conf, agent):
    """The server; ``start()`` it beside the update loop, ``stop()`` and
    ``wait()`` on the way out."""
    target = messaging.Target(topic=TOPIC, server=conf.host)
    return messaging.get_rpc_server(
        transport(conf), target, [ComputeAgentEndpoint(agent)],
        access_policy=messaging.DefaultRPCAccessPolicy)
