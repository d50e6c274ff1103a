"""The client conductors import: one method per RPC, with timeouts and a
version cap for rolling upgrades.

    api = ComputeAgentAPI(conf)
    api.build_instance("host-1", instance_uuid, spec, allocations)

Errors arrive as the agent's own types (compute_agent.exception): InvalidRequest,
NoSuchInstance, ClaimFailed, MoveInProgress, StoreUnavailable and
InternalError. A call newer than the client's version cap is refused here,
before it is sent, with VersionCapped. A call that gets no answer within
its timeout raises oslo.messaging's MessagingTimeout (NoAnswer, naming the
host), also while the broker cannot be reached (BrokerUnreachable): the
call may or may not have been done, and every call is safe to retry with
the same uuids. A client whose reply queue was lost has it declared again
after such a call (compute_agent/rpc/replies.py): the next call is
answered.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oslo_config import cfg

from compute_agent.exception import VersionCapped
from compute_agent.messaging import TOPIC, messaging, transport
from compute_agent.rpc.errors import NoAnswer
from compute_agent.rpc.outstanding import OutstandingCalls
from compute_agent.rpc.replies import ReplyQueue
from compute_agent.rpc.sending import SEND_RETRIES, BoundedSender, Notice
from compute_agent.rpc.versions import OLDEST, VERSION

# What the calls carry, as JSON: an answer, an instance's spec (name,
# vcpus, memory_mb) and its allocations in Placement's shape (provider
# uuid -> {"resources": {class: amount}}). The agent checks each payload
# whole (compute_agent/rpc/schemas.py).
Answer = dict[str, Any]
Spec = Mapping[str, Any]
PlacementAllocations = Mapping[str, Mapping[str, Mapping[str, int]]]


class ComputeAgentAPI:
    def __init__(self, conf: cfg.ConfigOpts, timeout: float = 60,
                 outstanding: OutstandingCalls | None = None,
                 on_wait: Notice | None = None) -> None:
        """``conf`` has the agent's options registered (compute_agent.config).
        ``outstanding`` is shared by clients one watchdog looks after;
        ``on_wait`` is told what a long call waits for (rpc/sending.py)."""
        self.timeout = timeout
        self.outstanding = outstanding or OutstandingCalls()
        self._conf = conf
        self._sender = BoundedSender(conf, on_wait)
        self.client = messaging.get_rpc_client(
            transport(conf), messaging.Target(topic=TOPIC, version=VERSION),
            version_cap=conf.upgrade_levels.compute_agent or VERSION, timeout=timeout,
            retry=SEND_RETRIES)
        self._replies = ReplyQueue(conf, self.client)

    def close(self) -> None:
        """Close the connection to the broker; delete the reply queue, if
        it called (rpc/broker.py close_client)."""
        self._replies.close()

    def can_send(self, version: str) -> bool:
        """Whether the version cap lets calls of API ``version`` go."""
        can_send: bool = self.client.can_send_version(version)  # oslo.messaging is untyped
        return can_send

    def _call(self, host: str, method: str, version: str = OLDEST,
              timeout: float | None = None, **payload: Any) -> Any:
        """Send ``method``, which appeared in API ``version``."""
        if not self.client.can_send_version(version):
            raise VersionCapped(method, version, self.client.version_cap)
        timeout = timeout or self.timeout
        with self.outstanding.one(timeout):
            return self._send(host, method, version, timeout, payload)

    def _send(self, host: str, method: str, version: str, timeout: float,
              payload: dict[str, Any]) -> Any:
        def send(seconds: float) -> Any:
            prepared = self.client.prepare(server=host, version=version, timeout=seconds)
            try:
                return prepared.call({}, method, **payload)
            except messaging.MessagingTimeout:
                # The answer may have been dropped for want of a reply queue.
                self._replies.mend_in_background()
                raise NoAnswer(host, method, timeout) from None
        return self._sender.call(host, method, timeout, send)

    # introspection
    def get_host_info(self, host: str) -> Answer:
        return self._call(host, "get_host_info")

    def get_provider_tree(self, host: str) -> list[Answer]:
        return self._call(host, "get_provider_tree")

    def get_instance(self, host: str, instance_uuid: str) -> Answer:
        return self._call(host, "get_instance", instance_uuid=instance_uuid)

    def list_instances(self, host: str) -> list[Answer]:
        """Every instance ``host`` holds: uuid, name, state (building,
        active, moving) and the open move's uuid. Needs API 1.1."""
        return self._call(host, "list_instances", version="1.1")

    # one-time-use devices
    def list_device_uses(self, host: str) -> list[Answer]:
        """The one-time-use devices ``host`` holds used and not clean.
        Needs API 1.6."""
        return self._call(host, "list_device_uses", version="1.6")

    def clean_device(self, host: str, address: str) -> Answer:
        """Start a used device's cleaning again. Needs API 1.6."""
        return self._call(host, "clean_device", version="1.6", address=address)

    def release_device(self, host: str, address: str) -> Answer:
        """Give back a used device cleaned by hand. Needs API 1.6."""
        return self._call(host, "release_device", version="1.6", address=address)

    # build and delete
    def build_instance(self, host: str, instance_uuid: str, spec: Spec,
                       allocations: PlacementAllocations) -> Answer:
        return self._call(host, "build_instance", instance_uuid=instance_uuid,
                          spec=spec, allocations=allocations)

    def delete_instance(self, host: str, instance_uuid: str) -> Answer:
        return self._call(host, "delete_instance", instance_uuid=instance_uuid)

    # moves: the destination's claims
    def prep_resize(self, host: str, migration_uuid: str, instance_uuid: str, spec: Spec,
                    allocations: PlacementAllocations) -> Answer:
        return self._call(host, "prep_resize", migration_uuid=migration_uuid,
                          instance_uuid=instance_uuid, spec=spec,
                          allocations=allocations)

    def check_can_live_migrate_destination(self, host: str, migration_uuid: str,
                                           instance_uuid: str, spec: Spec,
                                           allocations: PlacementAllocations) -> Answer:
        return self._call(host, "check_can_live_migrate_destination",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          spec=spec, allocations=allocations)

    def rebuild_instance(self, host: str, migration_uuid: str, instance_uuid: str, spec: Spec,
                         allocations: PlacementAllocations,
                         source_host: str | None = None, force: bool = False) -> Answer:
        """Without ``source_host`` (1.0): claim, build, settle, then answer.
        With it (1.3): ``source_host`` is asserted down, which ``host``
        checks by its heartbeat (SourceHostUp when it answers) unless
        ``force``; answered once the claim is on disk, the guest built
        after."""
        if source_host is None:
            return self._call(host, "rebuild_instance", migration_uuid=migration_uuid,
                              instance_uuid=instance_uuid, spec=spec,
                              allocations=allocations)
        return self._call(host, "rebuild_instance", version="1.3",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          spec=spec, allocations=allocations, source_host=source_host,
                          force=force)

    # moves: steps that name the move and the instance
    def _move(self, method: str, host: str, migration_uuid: str, instance_uuid: str) -> Answer:
        return self._call(host, method, migration_uuid=migration_uuid,
                          instance_uuid=instance_uuid)

    def resize_instance(self, host: str, migration_uuid: str, instance_uuid: str) -> Answer:
        return self._move("resize_instance", host, migration_uuid, instance_uuid)

    def finish_resize(self, host: str, migration_uuid: str, instance_uuid: str) -> Answer:
        return self._move("finish_resize", host, migration_uuid, instance_uuid)

    def confirm_resize(self, host: str, migration_uuid: str, instance_uuid: str) -> Answer:
        return self._move("confirm_resize", host, migration_uuid, instance_uuid)

    def revert_resize(self, host: str, migration_uuid: str, instance_uuid: str) -> Answer:
        return self._move("revert_resize", host, migration_uuid, instance_uuid)

    def check_can_live_migrate_source(self, host: str, migration_uuid: str, instance_uuid: str,
                                      destination_host: str) -> Answer:
        """The source refuses what cannot move from it, or records the move
        as announced; first of a live migration's steps, before the
        allocation swap. Needs API 1.4."""
        return self._call(host, "check_can_live_migrate_source", version="1.4",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          destination_host=destination_host)

    def rollback_live_migration_at_source(self, host: str, migration_uuid: str,
                                          instance_uuid: str) -> Answer:
        """The source ends the move; the guest stays. Needs API 1.4."""
        return self._call(host, "rollback_live_migration_at_source", version="1.4",
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid)

    def live_migrate(self, host: str, migration_uuid: str, instance_uuid: str,
                     destination: Mapping[str, Any], timeout: float | None = None) -> Answer:
        """The source migrates the guest; ``destination``: the ``claimed``
        and ``migration_uri`` of the destination's answer to
        check_can_live_migrate_destination. Needs API 1.2. Idempotent: a
        retry of a migration that is done answers "migrated", of one under
        way MoveInProgress, of one that failed or was rolled back
        InvalidRequest."""
        return self._call(host, "live_migrate", version="1.2", timeout=timeout,
                          migration_uuid=migration_uuid, instance_uuid=instance_uuid,
                          destination=destination)

    def post_live_migration_at_destination(self, host: str, migration_uuid: str,
                                           instance_uuid: str) -> Answer:
        return self._move("post_live_migration_at_destination", host, migration_uuid,
                          instance_uuid)

    def rollback_live_migration_at_destination(self, host: str, migration_uuid: str,
                                               instance_uuid: str) -> Answer:
        return self._move("rollback_live_migration_at_destination", host,
                          migration_uuid, instance_uuid)
