"""systemd's notify protocol (sd_notify(3)), spoken directly: one datagram
of ``KEY=VALUE`` lines to the AF_UNIX socket named by $NOTIFY_SOCKET, and
the watchdog's period read from $WATCHDOG_USEC / $WATCHDOG_PID as
sd_watchdog_enabled(3) does. Outside systemd every call is a no-op."""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

LOG = logging.getLogger(__name__)


def notify_address(value: str) -> str | None:
    """The socket address $NOTIFY_SOCKET names: a path, or with a leading
    '@' a name in the abstract namespace; None for what we cannot reach
    (systemd's newer vsock: addresses among them)."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def notify(*assignments: str) -> bool:
    """Send ``assignments`` (e.g. "READY=1") in one datagram; True when a
    manager was there to receive them."""
    value = os.environ.get("NOTIFY_SOCKET")
    if not value:
        return False
    address = notify_address(value)
    if address is None:
        LOG.debug("NOTIFY_SOCKET=%s is not a socket path: not notifying", value)
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.sendto("\n".join(assignments).encode(), address)
        except OSError as e:
            LOG.debug("sd_notify %s to %s failed: %s", assignments, value, e)
            return False
    return True


@dataclass(frozen=True)
class Watchdog:
    """The watchdog systemd keeps on this process (WatchdogSec=): ping it
    at least every ``interval`` seconds while the process is healthy."""
    timeout: float  # seconds after the last ping that systemd kills us

    @property
    def interval(self) -> float:
        # Half the timeout, as sd_watchdog_enabled(3) recommends: one late
        # ping is not yet a restart.
        return self.timeout / 2

    @staticmethod
    def ping() -> None:
        notify("WATCHDOG=1")


def watchdog_from_environment() -> Watchdog | None:
    """The watchdog systemd set for this process, or None: none set, a
    value that is not a positive number of microseconds, or one meant for
    another process (WATCHDOG_PID)."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        timeout = int(usec)
    except ValueError:
        LOG.warning("WATCHDOG_USEC=%s is not a whole number: no watchdog pings", usec)
        return None
    if timeout <= 0:
        LOG.warning("WATCHDOG_USEC=%s is not positive: no watchdog pings", usec)
        return None
    return Watchdog(timeout / 1_000_000)
