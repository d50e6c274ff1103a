"""The libvirt connection: opened lazily, reopened when libvirtd restarts,
and the source of node-device and domain lifecycle events.

Events need libvirt's default event loop, run here on one native daemon
thread per process (never eventlet).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import libvirt

from compute_agent.drivers.errors import DriverUnavailable

LOG = logging.getLogger(__name__)
T = TypeVar("T")
# kind ("nodedev" or "domain"), object name, libvirt's event number.
EventCallback = Callable[[str, str, int], None]

_CONNECTION_ERRORS = frozenset({
    libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_INTERNAL_ERROR,
    libvirt.VIR_ERR_NO_CONNECT, libvirt.VIR_ERR_INVALID_CONN})
_CONNECTION_DOMAINS = frozenset({libvirt.VIR_FROM_REMOTE,
                                 libvirt.VIR_FROM_RPC})

_loop_lock = threading.Lock()
_loop_started = False
_errors_silenced = False


def silence_default_error_printing() -> None:
    """libvirt prints every error to stderr ("libvirt: XML-RPC error :
    ...") unless a handler is registered. Each error also reaches us as a
    libvirtError, which we handle and log once, so the print is noise: a
    libvirtd restart would otherwise add lines outside the agent's log."""
    global _errors_silenced
    with _loop_lock:
        if not _errors_silenced:
            libvirt.registerErrorHandler(_ignore_error, None)
            _errors_silenced = True


def _ignore_error(ctx, error) -> None:
    pass


def start_event_loop() -> None:
    """Register libvirt's default event implementation and run it, once per
    process. libvirt requires the registration before any connection that
    wants events is opened."""
    global _loop_started
    with _loop_lock:
        if _loop_started:
            return
        libvirt.virEventRegisterDefaultImpl()
        threading.Thread(target=_run_event_loop, name="libvirt-events",
                         daemon=True).start()
        _loop_started = True


def _run_event_loop() -> None:
    while True:
        if libvirt.virEventRunDefaultImpl() < 0:
            LOG.error("libvirt event loop iteration failed")


def is_connection_error(exc: libvirt.libvirtError) -> bool:
    return (exc.get_error_code() in _CONNECTION_ERRORS
            or exc.get_error_domain() in _CONNECTION_DOMAINS)


class Connection:
    """Call libvirt through ``call(fn)``: ``fn`` gets a live virConnect.

    A call that fails because the connection broke is retried once on a
    fresh connection. ``generation`` grows with every open, so callers can
    drop what they cached from an older connection."""

    def __init__(self, uri: str, on_event: EventCallback | None = None,
                 open_fn: Callable[[str], libvirt.virConnect] = libvirt.open
                 ) -> None:
        self.uri = uri
        self.generation = 0
        self._on_event = on_event
        self._open_fn = open_fn
        self._conn: libvirt.virConnect | None = None
        self._lock = threading.Lock()
        self._unsupported_logged: set[str] = set()
        self._callback_ids: list[tuple[str, int]] = []

    def call(self, fn: Callable[[libvirt.virConnect], T]) -> T:
        conn = self._get()
        try:
            return fn(conn)
        except libvirt.libvirtError as exc:
            if not self._broken(conn, exc):
                raise
            # DEBUG: an outage is the dependency's one line each way
            # (compute_agent/dependencies.py); this one, when a call met the
            # break before the close callback did, was a third.
            LOG.debug("libvirt connection to %s lost (%s); reconnecting",
                      self.uri, exc)
        self._drop(conn)
        conn = self._get()
        try:
            return fn(conn)
        except libvirt.libvirtError as exc:
            if not self._broken(conn, exc):
                raise
            self._drop(conn)
            raise DriverUnavailable(
                f"libvirt at {self.uri} failed again after reconnecting: "
                f"{exc}", self.uri, f"failed again after reconnecting: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._close_quietly(self._conn)
                self._conn = None

    def _get(self) -> libvirt.virConnect:
        with self._lock:
            if self._conn is not None and self.is_alive(self._conn):
                return self._conn
            if self._conn is not None:
                self._close_quietly(self._conn)
                self._conn = None
            silence_default_error_printing()
            if self._on_event is not None:
                start_event_loop()
            try:
                conn = self._open_fn(self.uri)
            except libvirt.libvirtError as exc:
                raise DriverUnavailable(
                    f"cannot connect to libvirt at {self.uri}: {exc}", self.uri,
                    f"did not answer ({exc.get_error_message()})") from exc
            if conn is None:
                raise DriverUnavailable(
                    f"cannot connect to libvirt at {self.uri}", self.uri,
                    "did not answer")
            self._register_events(conn)
            self._conn = conn
            self.generation += 1
            return conn

    def _drop(self, conn: libvirt.virConnect) -> None:
        with self._lock:
            # Another thread may already have replaced it.
            if self._conn is conn:
                self._conn = None
                self._close_quietly(conn)

    @staticmethod
    def is_alive(conn: libvirt.virConnect) -> bool:
        try:
            return bool(conn.isAlive())
        except libvirt.libvirtError:
            return False

    def _broken(self, conn: libvirt.virConnect,
                exc: libvirt.libvirtError) -> bool:
        return is_connection_error(exc) or not self.is_alive(conn)

    def _close_quietly(self, conn: libvirt.virConnect) -> None:
        callback_ids, self._callback_ids = self._callback_ids, []
        try:
            for kind, callback_id in callback_ids:
                if kind == "nodedev":
                    conn.nodeDeviceEventDeregisterAny(callback_id)
                else:
                    conn.domainEventDeregisterAny(callback_id)
            conn.close()
        except libvirt.libvirtError:
            pass  # already dead: nothing left to release

    def _register_events(self, conn: libvirt.virConnect) -> None:
        if self._on_event is None:
            return
        self._register(
            conn, "nodedev", lambda: conn.nodeDeviceEventRegisterAny(
                None, libvirt.VIR_NODE_DEVICE_EVENT_ID_LIFECYCLE,
                self._node_device_event, None))
        self._register(conn, "domain", lambda: conn.domainEventRegisterAny(
            None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
            self._domain_event, None))

    def _register(self, conn: libvirt.virConnect, kind: str,
                  register: Callable[[], int]) -> None:
        try:
            self._callback_ids.append((kind, register()))
        except libvirt.libvirtError as exc:
            if kind not in self._unsupported_logged:
                self._unsupported_logged.add(kind)
                LOG.debug("%s events not available from %s: %s", kind,
                          self.uri, exc)

    def _node_device_event(self, conn, dev, event, detail, opaque) -> None:
        self._deliver("nodedev", dev.name(), event)

    def _domain_event(self, conn, dom, event, detail, opaque) -> None:
        self._deliver("domain", dom.name(), event)

    def _deliver(self, kind: str, name: str, event: int) -> None:
        # An exception escaping into libvirt's event loop would be lost
        # there; log it here instead.
        on_event = self._on_event
        if on_event is None:  # events are registered only with a handler
            return
        try:
            on_event(kind, name, event)
        except Exception:
            LOG.exception("libvirt %s event handler failed", kind)
