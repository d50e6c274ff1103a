"""The agent's typed errors. Each message names the field and the value.

oslo.messaging sends an error to the caller as its class, ``args`` and
``kwargs``, and rebuilds it there as ``cls(*args, **kwargs)`` when this
module is in ``allowed_remote_exmods``. So every error here keeps in
``args`` exactly what its constructor takes, all of it JSON-safe, and the
caller gets the same type back.
"""
from __future__ import annotations

from compute_agent.dependencies import Dependency, describe


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""


class ConfigError(AgentError):
    """A configuration value is invalid; the message names the option."""


class DependencyUnavailable(AgentError):
    """A service the agent depends on did not answer, or refused it. The
    message is one short line: the service, its URL and ``problem`` (a verb
    phrase: "did not answer (connection refused)")."""

    dependency: Dependency  # set by each subclass

    def __init__(self, url: str, problem: str):
        super().__init__(url, problem)
        self.url = url
        self.problem = problem

    def __str__(self) -> str:
        return describe(self.dependency, self.url, self.problem)


class PlacementUnavailable(DependencyUnavailable):
    """Placement did not answer, or answered 5xx; the cycle is abandoned and
    the next one tries again."""

    dependency = Dependency.PLACEMENT


class KeystoneUnavailable(PlacementUnavailable):
    """Placement cannot be asked: Keystone did not answer, refused the
    agent's credentials or has no Placement endpoint in its catalog. To a
    caller it is as if Placement did not answer (its answer is unknown);
    the message names Keystone and its URL."""

    dependency = Dependency.KEYSTONE


class BrokerUnavailable(DependencyUnavailable):
    """The message broker did not take a message the call needed to send
    (the evacuation fence's heartbeat question): what it would have found
    is unknown; the call may be retried."""

    dependency = Dependency.BROKER


class PlacementError(AgentError):
    """Placement refused a request for a reason a retry will not fix."""

    def __init__(self, message: str, status: int | None = None,
                 code: str | None = None):
        super().__init__(message, status, code)
        self.status = status
        self.code = code

    def __str__(self) -> str:
        return self.args[0]


class GenerationConflict(PlacementError):
    """A write lost a race with another writer (409 concurrent_update)."""


def shown(value) -> str:
    """A value as an error line shows it: its repr, cut after 77
    characters with its length given, so that a line stays a line."""
    text = repr(value)
    if len(text) <= 80:
        return text
    length = len(value) if isinstance(value, (str, bytes)) else len(text)
    return f"{text[:77]}... ({length} characters)"


class InvalidRequest(AgentError):
    """A request (RPC payload, claim) is malformed; nothing was changed.
    Across RPC the value itself is not sent back, only how it was shown."""

    def __init__(self, field: str, value, reason: str, value_shown: str | None = None):
        self.field = field
        self.value = value
        self.reason = reason
        self.value_shown = shown(value) if value_shown is None else value_shown
        super().__init__(field, None, reason, self.value_shown)

    def __str__(self) -> str:
        return f"{self.field}: {self.reason} (value: {self.value_shown})"


class RetryMismatch(InvalidRequest):
    """A call names a record (an instance, a move) that an earlier call
    made or ended here, but asks for something else: it is not that call's
    retry, so it is not answered from the record. ``fields``: what differs
    from the recorded call (payload fields, or ``method`` for a move ended
    by the other step); ``recorded``: what the record says. Nothing was
    changed; another request takes another uuid."""

    def __init__(self, uuid: str, fields: list[str], recorded: str):
        AgentError.__init__(self, uuid, fields, recorded)
        self.uuid = uuid
        self.fields = fields
        self.recorded = recorded
        # InvalidRequest's attributes, for a caller that reads those.
        self.field = ", ".join(fields)
        self.value = self.value_shown = uuid
        self.reason = "not as in the call recorded"

    def __str__(self) -> str:
        return (f"{self.recorded}; this call differs from that one in "
                f"{', '.join(self.fields)}: it is not its retry, and nothing was "
                "changed (another request takes another uuid)")


class ClaimFailed(AgentError):
    """The host cannot give what was asked; nothing was changed."""

    def __init__(self, provider_uuid: str, resource_class: str, wanted: int,
                 available: int):
        super().__init__(provider_uuid, resource_class, wanted, available)
        self.provider_uuid = provider_uuid
        self.resource_class = resource_class

    def __str__(self) -> str:
        provider, rc, wanted, available = self.args
        return f"cannot claim {wanted} {rc} from provider {provider}: {available} free"


class NoSuchInstance(AgentError):
    def __init__(self, instance_uuid: str):
        super().__init__(instance_uuid)
        self.instance_uuid = instance_uuid

    def __str__(self) -> str:
        return f"no such instance: {self.instance_uuid}"


class MoveInProgress(AgentError):
    """The instance is in another move; finish or revert it first."""

    def __init__(self, instance_uuid: str, migration_uuid: str):
        super().__init__(instance_uuid, migration_uuid)
        self.instance_uuid = instance_uuid
        self.migration_uuid = migration_uuid

    def __str__(self) -> str:
        return f"instance {self.instance_uuid} is in move {self.migration_uuid}"


class SourceHostUp(AgentError):
    """An evacuation's source answered its heartbeat: it is not down, so
    its instances are not rebuilt elsewhere (unless the caller forces it)."""

    def __init__(self, host: str, down_after: float):
        super().__init__(host, down_after)
        self.host = host

    def __str__(self) -> str:
        host, down_after = self.args
        return (f"source_host: {host} is up (its agent answered a heartbeat within "
                f"{down_after:g} s); evacuate only a down host, or force it")


class DevicesInUse(AgentError):
    """Devices about to be given back are still in a running guest's live
    definition; nothing was given back."""

    def __init__(self, instance_uuid: str, devices: list[str]):
        super().__init__(instance_uuid, devices)
        self.instance_uuid = instance_uuid
        self.devices = devices

    def __str__(self) -> str:
        return (f"instance {self.instance_uuid}: its running guest still uses "
                f"{', '.join(self.devices)}; nothing was given back")


class CallFailed(AgentError):
    """An RPC call failed on the agent's side, not for anything wrong in
    the request. ``reason`` is short; the agent's log has the rest."""

    failure = "failed"

    def __init__(self, method: str, reason: str):
        super().__init__(method, reason)
        self.method = method
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.method}: {self.failure}: {self.reason}"


class StoreUnavailable(CallFailed):
    """The agent's store could not be read or written. A retry may succeed
    once an operator has fixed the store."""

    failure = "the agent's store failed"


class InternalError(CallFailed):
    """The agent failed in a way it did not foresee; its log has the
    traceback."""

    failure = "internal error in the agent"


class VersionCapped(AgentError):
    """A call this client may not send: its ``[upgrade_levels]
    compute_agent`` cap is below the version the call needs. Raised in the
    client; nothing was sent."""

    def __init__(self, method: str, needed: str, cap: str):
        super().__init__(method, needed, cap)
        self.method = method
        self.needed = needed
        self.cap = cap

    def __str__(self) -> str:
        return (f"{self.method} needs RPC API {self.needed}, but [upgrade_levels] "
                f"compute_agent caps this client at {self.cap}")


class LiveMigrationRefused(AgentError):
    """A live migration's pre-check refused it before anything moved; on
    the destination nothing stays claimed. ``side``: the MigrationRole
    that refused (SOURCE or DESTINATION; a str enum, which this module,
    below the claim model, takes as the str it is), kept as its value,
    "source" or "destination"; ``reasons``: one line per device in the way."""

    def __init__(self, instance_uuid: str, side: str, reasons: list[str]):
        # The value, a plain string, in args: that is what crosses RPC and
        # what the caller rebuilds this error from.
        side = getattr(side, "value", side)
        super().__init__(instance_uuid, side, reasons)
        self.instance_uuid = instance_uuid
        self.side = side
        self.reasons = reasons

    def __str__(self) -> str:
        return (f"live migration of instance {self.instance_uuid} refused on the "
                f"{self.side}: {'; '.join(self.reasons)}")


class LiveMigrationFailed(AgentError):
    """The hypervisor's live migration failed. ``cause`` is the driver's
    (compute_agent.drivers.base.MigrationFailure value); for every cause but
    outcome_unknown the guest still runs on the source, which kept its
    devices, and the destination's claim is the conductor's to roll back."""

    def __init__(self, instance_uuid: str, migration_uuid: str, cause: str,
                 reason: str):
        super().__init__(instance_uuid, migration_uuid, cause, reason)
        self.instance_uuid = instance_uuid
        self.migration_uuid = migration_uuid
        self.cause = cause
        self.reason = reason

    def __str__(self) -> str:
        where = ("where the guest runs is unknown: look on both hosts before "
                 "releasing anything" if self.cause == "outcome_unknown"
                 else "the guest still runs on the source with its devices")
        return (f"live migration {self.migration_uuid} of instance "
                f"{self.instance_uuid} failed: {self.reason}; {where}")


class LiveMigrationOutcomeUnknown(AgentError):
    """A conductor could not learn from a live migration's source whether
    the guest moved (no answer, or one that does not say), so it undid
    nothing: the destination keeps its claim, the allocations stay as they
    are. Raised in the client. ``last``: the source's last answer."""

    def __init__(self, instance_uuid: str, migration_uuid: str, source: str,
                 destination: str, last: str):
        super().__init__(instance_uuid, migration_uuid, source, destination, last)
        self.instance_uuid = instance_uuid
        self.migration_uuid = migration_uuid

    def __str__(self) -> str:
        instance, migration, source, destination, last = self.args
        return (f"live migration {migration} of instance {instance}: whether the guest "
                f"left {source} is unknown ({last}); nothing was rolled back: "
                f"{destination} keeps its claim and the allocations stay as they are "
                f"(the instance's on {destination}, the migration's on {source}). Once "
                f"{source} answers, run the same live migration again with --migration "
                f"{migration}: it finishes the move or rolls it back")
