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
