"""What the RPC endpoints need of the agent they serve: the daemon's Agent
(compute_agent/daemon/service.py), which the rpc package must not import.
ServedAgent is what the calls' endpoint (compute_agent/rpc/server.py)
needs, HeartbeatAgent what the heartbeat's (compute_agent/rpc/heartbeat.py)
needs. Each Protocol lists exactly the members its endpoint uses, and the
endpoint reaches nothing else: tests/unit/rpc/test_served.py
reads these modules and fails on a path of ``self._agent`` not declared
here.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from compute_agent.claims.model import Assignment, DeviceUse, Migration
from compute_agent.tree.provider_tree import ProviderTree


class ServedPolicy(Protocol):
    """The host the agent serves."""

    @property
    def host(self) -> str: ...

    @property
    def root_uuid(self) -> str: ...


class ServedTracker(Protocol):
    """The views the endpoint answers from the agent's records."""

    def snapshot(self) -> tuple[dict[str, dict], list[Assignment], dict[str, Migration]]: ...

    def device_uses(self) -> list[tuple[DeviceUse, bool]]: ...


class ServedManager(Protocol):
    """The instance operations the calls are, one each."""

    @property
    def tracker(self) -> ServedTracker: ...


    def get_instance(self, instance_uuid: str) -> dict: ...

    def build_instance(self, instance_uuid: str, spec: dict, allocations: dict) -> dict: ...

    def delete_instance(self, instance_uuid: str) -> dict: ...

    def prep_resize(self, migration_uuid: str, instance_uuid: str, spec: dict,
                    allocations: dict) -> dict: ...

    def resize_instance(self, migration_uuid: str, instance_uuid: str) -> dict: ...

    def finish_resize(self, migration_uuid: str, instance_uuid: str) -> dict: ...

    def confirm_resize(self, migration_uuid: str, instance_uuid: str) -> dict: ...

    def revert_resize(self, migration_uuid: str, instance_uuid: str) -> dict: ...

    def check_can_live_migrate_source(self, migration_uuid: str, instance_uuid: str,
                                      destination_host: str) -> dict: ...

    def rollback_live_migration_at_source(self, migration_uuid: str,
                                          instance_uuid: str) -> dict: ...

    def check_can_live_migrate_destination(self, migration_uuid: str, instance_uuid: str,
                                           spec: dict, allocations: dict) -> dict: ...

    def live_migrate(self, migration_uuid: str, instance_uuid: str,
                     destination: dict | None = None) -> dict: ...

    def post_live_migration_at_destination(self, migration_uuid: str,
                                           instance_uuid: str) -> dict: ...

    def rollback_live_migration_at_destination(self, migration_uuid: str,
                                               instance_uuid: str) -> dict: ...

    def rebuild_instance(self, migration_uuid: str, instance_uuid: str, spec: dict,
                         allocations: dict,
                         fence: Callable[[], None] | None = None) -> dict: ...

    def accept_rebuild(self, migration_uuid: str, instance_uuid: str, spec: dict,
                       allocations: dict, fence: Callable[[], None] | None = None) -> dict: ...

    def finish_rebuild(self, migration_uuid: str) -> dict | None: ...


class ServedCleaner(Protocol):
    """One-time-use devices' cleanings, as an operator drives them."""

    def running(self, address: str) -> bool: ...

    def clean_again(self, address: str) -> None: ...

    def give_back(self, address: str) -> None: ...


class ServedAgent(Protocol):
    """The agent the endpoint serves."""

    @property
    def manager(self) -> ServedManager: ...

    @property
    def policy(self) -> ServedPolicy: ...

    @property
    def cleaner(self) -> ServedCleaner: ...

    # Placement's view after the last cycle that reached it.
    last_tree: ProviderTree

    def wake(self) -> None: ...


class HeartbeatTracker(Protocol):
    """What the heartbeat tells of the agent's records."""

    def instance_count(self) -> int: ...


class HeartbeatManager(Protocol):
    @property
    def tracker(self) -> HeartbeatTracker: ...


class HeartbeatAgent(Protocol):
    """The agent the heartbeat says is alive."""

    @property
    def policy(self) -> ServedPolicy: ...

    @property
    def manager(self) -> HeartbeatManager: ...


class HostTracker(ServedTracker, HeartbeatTracker, Protocol):
    """The tracker both endpoints of the host's server read."""


class HostManager(ServedManager, HeartbeatManager, Protocol):
    @property
    def tracker(self) -> HostTracker: ...


class HostAgent(ServedAgent, HeartbeatAgent, Protocol):
    """What the host's one server (compute_agent/rpc/host_server.py) needs:
    what both of its endpoints need."""

    @property
    def manager(self) -> HostManager: ...
