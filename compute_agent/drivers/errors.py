"""The drivers' errors, all a DriverError. The drivers never import the
agent, so they have a base of their own.

The errors about a bad value (host data, a migration target, XML, a fake
host) stay ValueErrors too, as they were: what they report is a value of
the right type that cannot be used, and code reading a value catches
ValueError around it."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compute_agent.drivers.base import MigrationFailure

_MAX_VALUE_REPR = 80


class DriverError(Exception):
    """Base of every error a driver raises on purpose."""


class DriverUnavailable(DriverError):
    """The hypervisor cannot be reached right now; the cycle is skipped.
    ``where``: what was asked (libvirt's URI); ``problem``: what went
    wrong, as a verb phrase with the hypervisor's own words ("did not
    answer (...)")."""

    def __init__(self, message: str, where: str = "", problem: str = ""):
        super().__init__(message)
        self.where = where
        self.problem = problem or f"failed ({message})"


class MdevError(DriverError):
    """An mdev could not be created or removed; the message names the
    parent and type, or the mdev (and, on a real host, the file written)."""


class SriovError(DriverError):
    """A PF's VF count could not be set; the message names the PF, the
    count, the file written and the kernel's answer."""


class LiveMigrationError(DriverError):
    """A live migration failed; ``cause`` says why, the message names the
    guest, the destination and the hypervisor's own words."""

    def __init__(self, cause: MigrationFailure, message: str):
        super().__init__(f"{cause.value}: {message}")
        self.cause = cause


class InvalidHostData(DriverError, ValueError):
    """Input from the host (libvirt XML, sysfs, ndctl JSON) that cannot be
    used. ``device`` and ``field`` say where, so the warning an operator
    reads points at the exact thing to look at."""

    def __init__(self, device: str, field: str, reason: str,
                 value: object = None) -> None:
        self.device = device
        self.field = field
        self.reason = reason
        self.value = value
        shown = repr(value)
        if len(shown) > _MAX_VALUE_REPR:
            shown = shown[:_MAX_VALUE_REPR - 3] + "..."
        super().__init__(f"{device}: {field}: {reason} (value: {shown})")


class InvalidMigrationTarget(DriverError, ValueError):
    """A target that cannot be read or paired; the message names the field
    and the value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}: {value!r}: {reason}")


class MigrationXmlError(DriverError, ValueError):
    """The source's XML cannot be rewritten for this target; nothing was."""


class InvalidFakeHost(DriverError, ValueError):
    """The fake host description is malformed; the message names the field."""
