"""The RPC API conductors call: topic ``compute-agent``, server = this
host, served with the heartbeat by the host's one server
(compute_agent/rpc/host_server.py).

Each call is one method of ComputeAgentEndpoint, marked with the API
version it appeared in; compute_agent/rpc/versions.py is the ledger of versions
and says how they may change. Only the marked methods are served: the
endpoint's own attributes are not calls.

A call's payload is checked whole before the manager is asked anything
(compute_agent/rpc/schemas.py): its shape, its schema, uuids made lower case, the
move's two uuids told apart. Every method that changes state is idempotent
on the instance and migration uuids, so a conductor may retry after a
timeout. Every error a call raises is one of compute_agent.exception's, which the
caller gets as the same type: its own mistakes as they are, a failing
store as StoreUnavailable, and anything else, logged here once with its
traceback, as InternalError. A call of a method or version this agent does
not serve is the caller's mistake, answered by oslo.messaging as
NoSuchMethod or UnsupportedVersion and logged here as one warning line.
"""
from __future__ import annotations

import functools
import logging
import sqlite3
import threading
from collections.abc import Callable
from enum import Enum

from compute_agent.claims.model import Assignment, AssignmentState, Migration
from compute_agent.exception import AgentError, InternalError, InvalidRequest, StoreUnavailable
from compute_agent.messaging import messaging, sent_as_before
from compute_agent.rpc import schemas, versions
from compute_agent.rpc.heartbeat import SourceFence
from compute_agent.rpc.served import ServedAgent
from compute_agent.rpc.versions import VERSION
from compute_agent.store.errors import StoreError
from compute_agent.tree.provider_tree import tree_as_dicts

LOG = logging.getLogger(__name__)
# What the caller is told of an error it cannot act on; the log has all.
REASON_LENGTH = 200
# Where oslo.messaging's RPC server logs a call its dispatcher refused.
DISPATCH_LOGGER = "oslo_messaging.rpc.server"


def short(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= REASON_LENGTH else text[:REASON_LENGTH - 3] + "..."


def rpc_method(since: str, schema: dict) -> Callable[[Callable], Callable]:
    """Serve the decorated endpoint method as an RPC call that appeared in
    API version ``since``, its payload checked against ``schema`` (and
    made canonical) before the method runs."""
    versions.known(since)
    checker = schemas.validator(schema)

    def serve_as_call(method: Callable) -> Callable:
        name = method.__name__

        # AgentError is the caller's to see, not logged as our failure.
        @messaging.expected_exceptions(AgentError)
        def serve(self: ComputeAgentEndpoint, ctxt: dict, **payload: object) -> object:
            try:
                arguments = schemas.checked(checker, payload)
                LOG.debug("RPC %s", name)
                return method(self, ctxt, **arguments)
            # Before AgentError: StoreError is one, but not one a caller
            # can rebuild (compute_agent.store.errors is not on the wire).
            except (StoreError, sqlite3.Error) as e:
                LOG.error("RPC %s: the store failed: %s", name, short(e))
                raise StoreUnavailable(name, short(e)) from None
            except AgentError as e:
                raise sent_as_before(e) from None
            except Exception as e:
                LOG.exception("RPC %s failed", name)
                raise InternalError(name, short(e)) from None

        served = messaging.expose(functools.wraps(method)(serve))
        served.since = since
        served.schema = schema
        return served

    return serve_as_call


class InstanceState(str, Enum):
    BUILDING = "building"  # claimed; its guest not yet started
    ACTIVE = "active"
    MOVING = "moving"  # in a move that is still open on this host


def listed_instances(instances: dict[str, dict], live: list[Assignment],
                     migrations: dict[str, Migration]) -> list[dict]:
    """Each instance this host holds, by uuid, with its state."""
    building = {a.instance_uuid for a in live
                if a.state is AssignmentState.CLAIMING and a.migration_uuid is None}
    moving = {m.instance_uuid: m.uuid for m in migrations.values() if m.open}
    out = []
    for uuid in sorted(instances):
        state = (InstanceState.MOVING if uuid in moving
                 else InstanceState.BUILDING if uuid in building
                 else InstanceState.ACTIVE)
        out.append({"uuid": uuid, "name": instances[uuid]["name"],
                    "state": state.value, "migration_uuid": moving.get(uuid)})
    return out


class ComputeAgentEndpoint:
    target = messaging.Target(version=VERSION)

    def __init__(self, agent: ServedAgent, fence: SourceFence | None = None):
        self._agent = agent
        # An evacuation's source must be down; None: not asked.
        self._fence = fence

    # --- views ----------------------------------------------------------

    @rpc_method("1.0", schemas.NOTHING)
    def get_host_info(self, ctxt: dict) -> dict:
        """Since 1.0. This host, its root provider, the API version it
        serves, and how many instances and assignments it holds."""
        instances, live, _ = self._agent.manager.tracker.snapshot()
        return {"host": self._agent.policy.host, "root_uuid": self._agent.policy.root_uuid,
                "rpc_version": VERSION, "instances": len(instances),
                "assignments": len(live), "providers": len(self._agent.last_tree)}

    @rpc_method("1.0", schemas.NOTHING)
    def get_provider_tree(self, ctxt: dict) -> list[dict]:
        """Since 1.0. The provider tree as the agent last saw it in
        Placement, by Placement's field names; ``parent_uuid``, 1.0's name
        for ``parent_provider_uuid``, stays for the clients that read it."""
        return [{**p, "parent_uuid": p["parent_provider_uuid"]}
                for p in tree_as_dicts(self._agent.last_tree)]

    @rpc_method("1.0", schemas.INSTANCE)
    def get_instance(self, ctxt: dict, instance_uuid: str) -> dict:
        """Since 1.0. An instance: spec, assignments, moves, its guest."""
        return self._agent.manager.get_instance(instance_uuid)

    @rpc_method("1.1", schemas.NOTHING)
    def list_instances(self, ctxt: dict) -> list[dict]:
        """Since 1.1. Every instance this host holds, with its state."""
        return listed_instances(*self._agent.manager.tracker.snapshot())

    # --- one-time-use devices --------------------------------------------

    def _device_uses(self, address: str | None = None) -> list[dict]:
        return [{"address": use.address, "state": use.state.value, "reason": use.reason,
                 "held": held, "cleaning": self._agent.cleaner.running(use.address)}
                for use, held in self._agent.manager.tracker.device_uses()
                if address in (None, use.address)]

    @rpc_method("1.6", schemas.NOTHING)
    def list_device_uses(self, ctxt: dict) -> list[dict]:
        """Since 1.6. Every one-time-use device used and not clean: its
        state (used, cleaning_failed), why its cleaning failed, whether an
        instance holds it, whether its cleaning runs now."""
        return self._device_uses()

    @rpc_method("1.6", schemas.DEVICE)
    def clean_device(self, ctxt: dict, address: str) -> dict:
        """Since 1.6. Run a used device's cleaning again (after one that
        failed, say); answered once it started, with the device's entry
        as list_device_uses gives it."""
        self._agent.cleaner.clean_again(address)
        return next(iter(self._device_uses(address)), {"address": address,
                                                       "state": "clean"})

    @rpc_method("1.6", schemas.DEVICE)
    def release_device(self, ctxt: dict, address: str) -> dict:
        """Since 1.6. Give back a used device an operator cleaned by hand
        (on disk before the answer); the update loop reports it free."""
        self._agent.cleaner.give_back(address)
        self._agent.wake()
        return {"address": address, "state": "clean"}

    # --- build and delete -----------------------------------------------

    @rpc_method("1.0", schemas.CLAIM)
    def build_instance(self, ctxt: dict, instance_uuid: str, spec: dict, allocations: dict) -> dict:
        """Since 1.0. Claim devices for a new instance, define and start
        its guest."""
        return self._agent.manager.build_instance(instance_uuid, spec, allocations)

    @rpc_method("1.0", schemas.INSTANCE)
    def delete_instance(self, ctxt: dict, instance_uuid: str) -> dict:
        """Since 1.0. Remove the guest and give its devices back."""
        return self._agent.manager.delete_instance(instance_uuid)

    # --- resize and cold migration --------------------------------------

    @rpc_method("1.0", schemas.MOVE_CLAIM)
    def prep_resize(self, ctxt: dict, migration_uuid: str, instance_uuid: str, spec: dict,
                    allocations: dict) -> dict:
        """Since 1.0. Destination: claim the new flavor's devices."""
        return self._agent.manager.prep_resize(migration_uuid, instance_uuid, spec,
                                               allocations)

    @rpc_method("1.0", schemas.MOVE)
    def resize_instance(self, ctxt: dict, migration_uuid: str, instance_uuid: str) -> dict:
        """Since 1.0. Source: the migration takes over the instance's
        devices."""
        return self._agent.manager.resize_instance(migration_uuid, instance_uuid)

    @rpc_method("1.0", schemas.MOVE)
    def finish_resize(self, ctxt: dict, migration_uuid: str, instance_uuid: str) -> dict:
        """Since 1.0. Destination: the guest gets its new devices."""
        return self._agent.manager.finish_resize(migration_uuid, instance_uuid)

    @rpc_method("1.0", schemas.MOVE)
    def confirm_resize(self, ctxt: dict, migration_uuid: str, instance_uuid: str) -> dict:
        """Since 1.0. Source: give back the old devices."""
        return self._agent.manager.confirm_resize(migration_uuid, instance_uuid)

    @rpc_method("1.0", schemas.MOVE)
    def revert_resize(self, ctxt: dict, migration_uuid: str, instance_uuid: str) -> dict:
        """Since 1.0. Either side: new devices back, old ones to the
        instance."""
        return self._agent.manager.revert_resize(migration_uuid, instance_uuid)

    # --- live migration -------------------------------------------------

    @rpc_method("1.4", schemas.SOURCE_CHECK)
    def check_can_live_migrate_source(self, ctxt: dict, migration_uuid: str, instance_uuid: str,
                                      destination_host: str) -> dict:
        """Since 1.4. Source, first of all steps, before the conductor swaps
        the allocations: refuse what cannot move from here, else record the
        move as announced (on disk before the answer)."""
        if destination_host == self._agent.policy.host:
            raise InvalidRequest("destination_host", destination_host,
                                 "is this host; a live migration moves the "
                                 "instance to another")
        return self._agent.manager.check_can_live_migrate_source(
            migration_uuid, instance_uuid, destination_host)

    @rpc_method("1.4", schemas.MOVE)
    def rollback_live_migration_at_source(self, ctxt: dict, migration_uuid: str,
                                          instance_uuid: str) -> dict:
        """Since 1.4. Source: end the move; the guest runs on here with its
        devices. Refused once the guest has left."""
        return self._agent.manager.rollback_live_migration_at_source(
            migration_uuid, instance_uuid)

    @rpc_method("1.0", schemas.MOVE_CLAIM)
    def check_can_live_migrate_destination(self, ctxt: dict, migration_uuid: str, instance_uuid: str,
                                           spec: dict, allocations: dict) -> dict:
        """Since 1.0. Destination: claim, run the pre-check, create the
        claimed mdevs; answer the devices claimed. Since 1.2 the answer
        also has ``claimed`` and ``migration_uri``, live_migrate's
        ``destination``; a pre-check refusal is LiveMigrationRefused."""
        return self._agent.manager.check_can_live_migrate_destination(
            migration_uuid, instance_uuid, spec, allocations)

    @rpc_method("1.2", schemas.LIVE_MIGRATE)
    def live_migrate(self, ctxt: dict, migration_uuid: str, instance_uuid: str,
                     destination: dict | None = None) -> dict:
        """Since 1.2. Source: ``destination`` is the destination's answer;
        the source migrates the running guest to its claimed devices and
        gives its own back once it is gone. 1.0's form, without
        ``destination``, only moved records: it is refused, naming the
        field. LiveMigrationFailed when
        the hypervisor's migration fails (the guest stays here)."""
        return self._agent.manager.live_migrate(migration_uuid, instance_uuid,
                                                destination)

    @rpc_method("1.0", schemas.MOVE)
    def post_live_migration_at_destination(self, ctxt: dict, migration_uuid: str,
                                           instance_uuid: str) -> dict:
        """Since 1.0. Destination: the guest runs here; the move is
        settled."""
        return self._agent.manager.post_live_migration_at_destination(
            migration_uuid, instance_uuid)

    @rpc_method("1.0", schemas.MOVE)
    def rollback_live_migration_at_destination(self, ctxt: dict, migration_uuid: str,
                                               instance_uuid: str) -> dict:
        """Since 1.0. Destination: give back what the check claimed."""
        return self._agent.manager.rollback_live_migration_at_destination(
            migration_uuid, instance_uuid)

    # --- evacuation -----------------------------------------------------

    @rpc_method("1.0", schemas.REBUILD)
    def rebuild_instance(self, ctxt: dict, migration_uuid: str, instance_uuid: str, spec: dict,
                         allocations: dict, source_host: str | None = None, force: bool = False) -> dict:
        """Since 1.0. Destination of an evacuation: claim, build, settle,
        then answer. From 1.3, with ``source_host``: refused while the
        source's agent answers a heartbeat (unless ``force``); answered as
        soon as the move and the claim are on disk, from when on this host
        alone owns the rebuild, which goes on here (safe to cast)."""
        if source_host is None:
            return self._agent.manager.rebuild_instance(migration_uuid, instance_uuid,
                                                        spec, allocations)
        source_fence = self._fence
        fence = None if force or source_fence is None else (
            lambda: source_fence.require_down(source_host))
        accepted = self._agent.manager.accept_rebuild(migration_uuid, instance_uuid, spec,
                                                      allocations, fence)
        threading.Thread(target=self._rebuild, args=(migration_uuid,), daemon=True,
                         name=f"rebuild-{migration_uuid[:8]}").start()
        return accepted

    def _rebuild(self, migration_uuid: str) -> None:
        try:
            self._agent.manager.finish_rebuild(migration_uuid)
        except Exception as e:  # noqa: BLE001 - the update loop resumes it
            LOG.warning("Evacuation %s: the rebuild failed, resumed at the next "
                        "cycle: %s", migration_uuid, short(e))


class UnservedCallsAsWarnings(logging.Filter):
    """oslo.messaging logs a call of a method or version no endpoint serves
    (its dispatcher's NoSuchMethod, UnsupportedVersion) as an ERROR with
    its traceback, though the fault is the caller's and the caller is
    told. Such a record becomes one WARNING line; every other record
    passes as it is. oslo.log's formatter ends a warning logged while an
    exception is handled with that exception's one-line summary, which
    names the method or the version: the message does not repeat it."""

    UNSERVED = (messaging.NoSuchMethod, messaging.UnsupportedVersion)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, self.UNSERVED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "RPC call refused: this agent does not serve it"
            record.args = ()
            record.exc_info = record.exc_text = None
        return True


def warn_of_unserved_calls() -> None:
    """Install UnservedCallsAsWarnings on oslo.messaging's server logger,
    once per process."""
    dispatch_log = logging.getLogger(DISPATCH_LOGGER)
    if not any(isinstance(f, UnservedCallsAsWarnings) for f in dispatch_log.filters):
        dispatch_log.addFilter(UnservedCallsAsWarnings())
