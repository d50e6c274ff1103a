"""The agent's typed errors. Each message names the field and the value."""


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""


class ConfigError(AgentError):
    """A configuration value is invalid; the message names the option."""


class PlacementUnavailable(AgentError):
    """Placement did not answer, or answered 5xx; the cycle is abandoned and
    the next one tries again."""


class PlacementError(AgentError):
    """Placement refused a request for a reason a retry will not fix."""

    def __init__(self, message: str, status: int | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class GenerationConflict(PlacementError):
    """A write lost a race with another writer (409 concurrent_update)."""


class InvalidRequest(AgentError):
    """A request (RPC payload, claim) is malformed; nothing was changed."""

    def __init__(self, field: str, value, reason: str):
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field}: {reason} (value: {shown})")
        self.field = field
        self.reason = reason


class ClaimFailed(AgentError):
    """The host cannot give what was asked; nothing was changed."""

    def __init__(self, provider_uuid: str, resource_class: str, wanted: int,
                 available: int):
        super().__init__(f"cannot claim {wanted} {resource_class} from provider "
                         f"{provider_uuid}: {available} free")
        self.provider_uuid = provider_uuid
        self.resource_class = resource_class


class NoSuchInstance(AgentError):
    def __init__(self, instance_uuid: str):
        super().__init__(f"no such instance: {instance_uuid}")
        self.instance_uuid = instance_uuid


class MoveInProgress(AgentError):
    """The instance is in another move; finish or revert it first."""

    def __init__(self, instance_uuid: str, migration_uuid: str):
        super().__init__(f"instance {instance_uuid} is in move {migration_uuid}")
        self.instance_uuid = instance_uuid
        self.migration_uuid = migration_uuid
