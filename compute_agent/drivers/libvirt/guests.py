"""The ComputeDriver guest methods over libvirt.

Every libvirt step runs inside ``Connection.call``, which replays it whole
on a fresh connection when libvirtd restarted mid-call; so each step is
written to be safe to repeat (define is idempotent, start checks first).
"""
from __future__ import annotations

import logging
import threading
import uuid as uuid_lib
from dataclasses import dataclass

import libvirt

from compute_agent.drivers.base import (
    DeviceKind,
    ForeignGuest,
    GuestHolding,
    GuestSpec,
    GuestState,
    HostResource,
    MigrationFailure,
)
from compute_agent.drivers.errors import InvalidHostData, LiveMigrationError, MdevError
from compute_agent.drivers.libvirt.connection import Connection
from compute_agent.drivers.libvirt.guest_xml import (
    build_domain_xml,
    domain_identity,
    domain_name,
    parse_foreign,
    parse_holding,
    parse_live,
    parse_metadata,
)
from compute_agent.drivers.libvirt.mdev import MdevSysfs

LOG = logging.getLogger(__name__)

# Also drop a managed-save image, NVRAM and snapshot and checkpoint
# metadata, each of which would otherwise make the undefine fail. Drivers
# without NVRAM or checkpoints (the test driver among them) refuse those
# flags; such a domain has neither, so the next, smaller set is complete.
_UNDEFINE_FLAG_SETS = (
    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
    | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM,
    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA,
    0)
# What libvirt answers when asked to stop a guest that is not running.
_ALREADY_STOPPED = frozenset({libvirt.VIR_ERR_OPERATION_INVALID,
                              libvirt.VIR_ERR_NO_DOMAIN})


def started_meanwhile(dom: libvirt.virDomain) -> bool:
    """Whether a start that failed found the guest running: an earlier start
    of it finished in between. A build retried after its agent was killed
    while libvirtd was starting the guest finds it not active yet, and
    running by the time its own start arrives (found by the crash loop on
    QEMU, which calls it an invalid operation; the test driver an internal
    error: the guest's state is what tells)."""
    return bool(dom.isActive())


# What a hypervisor driver answers to flags it does not know.
_UNSUPPORTED = frozenset({libvirt.VIR_ERR_INVALID_ARG,
                          libvirt.VIR_ERR_NO_SUPPORT,
                          libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED})
# Live and peer to peer, as nova migrates: the source's libvirtd connects
# to the destination's itself and drives every phase, so the call needs no
# connection of ours to the destination. The destination defines the guest
# persistently and the source undefines it once it runs there.
_LIVE_MIGRATION_FLAGS = (libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
                         | libvirt.VIR_MIGRATE_PERSIST_DEST
                         | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE)


@dataclass(frozen=True)
class _Read:
    """What a domain held when it was last read, and the id it had then:
    a start gives a domain a new id, a stop takes it (-1)."""

    name: str
    domain_id: int
    holding: GuestHolding


class GuestManager:
    def __init__(self, connection: Connection, mdevs: MdevSysfs,
                 domain_type: str) -> None:
        self._conn = connection
        self._mdevs = mdevs
        self._domain_type = domain_type
        # guest_holdings' reads, by domain uuid, kept while nothing says
        # the domain changed: listing the domains costs 0.4 ms at 100,
        # reading each one's XML 35 ms (docs/benchmarks.md), and claims
        # ask before each choice. ``_changes`` counts what forgot a read,
        # so that a listing that raced a change keeps nothing it read.
        self._holdings_lock = threading.Lock()
        self._reads: dict[str, _Read] = {}
        self._reads_generation = 0
        self._changes = 0

    def spawn(self, guest: GuestSpec) -> None:
        models = self._prepare(guest)

        def define_and_start(conn: libvirt.virConnect) -> None:
            dom = self._define(conn, guest, models)
            if dom.isActive():
                return
            try:
                dom.create()
            except libvirt.libvirtError:
                if not started_meanwhile(dom):
                    raise
        self._changing(guest.instance_uuid, define_and_start)

    def update_guest(self, guest: GuestSpec) -> None:
        # A running guest keeps its live devices; the new definition takes
        # effect at its next start. A guest not defined here yet is defined
        # and left stopped.
        models = self._prepare(guest)
        self._changing(guest.instance_uuid, lambda conn: self._define(conn, guest, models))

    def _changing(self, instance_uuid: str, step) -> None:
        """Run a step that changes the guest; its holding is read afresh
        next time, whether the step got through or not."""
        try:
            self._conn.call(step)
        finally:
            self.forget(domain_uuid=instance_uuid)

    def forget(self, domain_uuid: str | None = None, name: str | None = None) -> None:
        """What was read of the domain of that uuid or name is read again
        at the next guest_holdings (a lifecycle event names the domain)."""
        with self._holdings_lock:
            self._changes += 1
            for key, read in list(self._reads.items()):
                if key == domain_uuid or read.name == name:
                    del self._reads[key]

    def guest_holdings(self, reread: bool = False) -> dict[str, GuestHolding]:
        def holdings(conn: libvirt.virConnect) -> dict[str, GuestHolding]:
            with self._holdings_lock:
                if reread or self._reads_generation != self._conn.generation:
                    self._reads.clear()
                    self._reads_generation = self._conn.generation
                kept, changes = dict(self._reads), self._changes
            found: dict[str, _Read] = {}
            for dom in conn.listAllDomains(0):
                domain_uuid, domain_id = dom.UUIDString(), dom.ID()
                read = kept.get(domain_uuid)
                if read is None or read.domain_id != domain_id:
                    holding = _read_holding(dom)
                    if holding is None:
                        continue  # undefined between listing and reading
                    read = _Read(dom.name(), domain_id, holding)
                found[domain_uuid] = read
            # Drawn before ``found`` is published: once it is the cache, a
            # forget() in another thread deletes from it.
            holdings = {u: read.holding for u, read in found.items()}
            with self._holdings_lock:
                if self._changes == changes:
                    self._reads = found
            return holdings
        return self._conn.call(holdings)

    def power_off(self, instance_uuid: str) -> None:
        def power_off(conn: libvirt.virConnect) -> None:
            dom = _lookup(conn, instance_uuid)
            try:
                if dom is not None and dom.isActive():
                    dom.destroy()
            except libvirt.libvirtError as exc:
                if exc.get_error_code() not in _ALREADY_STOPPED:
                    raise
        self._changing(instance_uuid, power_off)

    def destroy(self, instance_uuid: str) -> None:
        def destroy(conn: libvirt.virConnect) -> None:
            dom = _lookup(conn, instance_uuid)
            if dom is None:
                return
            try:
                if dom.isActive():
                    dom.destroy()
            except libvirt.libvirtError as exc:
                # Stopped meanwhile: its QEMU exited between the two calls
                # (found by the crash loop on QEMU, under load), or gone.
                if exc.get_error_code() not in _ALREADY_STOPPED:
                    raise
            try:
                if dom.isPersistent():
                    _undefine(dom)
            except libvirt.libvirtError as exc:
                # Gone meanwhile (a transient domain vanishes on destroy).
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                    raise
        self._changing(instance_uuid, destroy)

    def list_guests(self) -> dict[str, GuestState]:
        def list_guests(conn: libvirt.virConnect) -> dict[str, GuestState]:
            guests: dict[str, GuestState] = {}
            for dom in conn.listAllDomains(0):
                try:
                    read = _read_state(dom)
                except InvalidHostData as exc:
                    LOG.warning("domain %s: %s", dom.UUIDString(), exc)
                    continue
                if read is not None and read[0] is not None:
                    guests[read[0]] = read[1]
            return guests
        return self._conn.call(list_guests)

    def list_foreign_guests(self) -> dict[str, ForeignGuest]:
        def list_foreign(conn: libvirt.virConnect) -> dict[str, ForeignGuest]:
            guests: dict[str, ForeignGuest] = {}
            for dom in conn.listAllDomains(0):
                found = _read_foreign(dom)
                if found is not None:
                    guests[found.instance_uuid] = found
            return guests
        return self._conn.call(list_foreign)

    def guest_state(self, instance_uuid: str) -> GuestState | None:
        def guest_state(conn: libvirt.virConnect) -> GuestState | None:
            dom = _lookup(conn, instance_uuid)
            read = None if dom is None else _read_state(dom)
            return None if read is None else read[1]
        return self._conn.call(guest_state)

    def guest_xml(self, instance_uuid: str, live: bool = False,
                  migratable: bool = False) -> str | None:
        """The guest's saved definition, or with ``live`` what it runs with
        (the saved one when it is stopped), as libvirt has it; with
        ``migratable`` as a destination accepts it (libvirt's check that
        the guest's virtual hardware stays the same refuses the plain live
        XML)."""
        flags = 0 if live else libvirt.VIR_DOMAIN_XML_INACTIVE
        if migratable:
            flags |= libvirt.VIR_DOMAIN_XML_MIGRATABLE

        def xml(conn: libvirt.virConnect) -> str | None:
            dom = _lookup(conn, instance_uuid)
            return dom.XMLDesc(flags) if dom else None
        return self._conn.call(xml)

    # --- live migration ---------------------------------------------------

    def migrating_out(self, instance_uuid: str) -> bool:
        def migrating(conn: libvirt.virConnect) -> bool:
            dom = _lookup(conn, instance_uuid)
            return dom is not None and _migration_job_runs(dom)
        return self._conn.call(migrating)

    def live_migrate(self, instance_uuid: str, dest_uri: str, dest_xml: str) -> None:
        """migrateToURI3 with ``dest_xml`` as both the XML the destination
        starts the guest with and its persistent definition there. Returns
        once libvirt has confirmed the migration, which ends with the
        source's QEMU stopped and its definition removed, and this
        libvirtd no longer knows the guest."""
        what = f"{instance_uuid} to {dest_uri}"

        def migrate(conn: libvirt.virConnect) -> None:
            # Looking up is safe to replay on a new connection; from the
            # migration on, nothing is: a libvirt error is turned into
            # ours here rather than retried.
            dom = _lookup(conn, instance_uuid)
            if dom is None:
                raise LiveMigrationError(MigrationFailure.NO_RUNNING_GUEST,
                                         f"{what}: no such guest here")
            # Named by its uuid where it arrives: a guest an earlier version
            # named after its instance would clash with another of that name.
            params = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: dest_xml,
                      libvirt.VIR_MIGRATE_PARAM_PERSIST_XML: dest_xml,
                      libvirt.VIR_MIGRATE_PARAM_DEST_NAME: domain_name(instance_uuid)}
            try:
                dom.migrateToURI3(dest_uri, params, _LIVE_MIGRATION_FLAGS)
            except libvirt.libvirtError as exc:
                cause = migration_failure(exc, Connection.is_alive(conn))
                if _refused_for_another_migration(dom, cause):
                    cause = MigrationFailure.OUTCOME_UNKNOWN
                raise LiveMigrationError(cause, f"{what}: {exc}") from exc
            try:
                left = _lookup(conn, instance_uuid)
            except libvirt.libvirtError as exc:
                raise LiveMigrationError(
                    MigrationFailure.OUTCOME_UNKNOWN,
                    f"{what}: migrated, then the source could not be read: "
                    f"{exc}") from exc
            if left is not None:
                raise LiveMigrationError(
                    MigrationFailure.OUTCOME_UNKNOWN,
                    f"{what}: libvirt reported the migration done, yet the "
                    "guest is still defined here")
        self._changing(instance_uuid, migrate)

    def ensure_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        self._mdevs.create(mdev_uuid, parent, type_id)

    def remove_mdev(self, mdev_uuid: str) -> None:
        self._mdevs.remove(mdev_uuid)

    def _define(self, conn: libvirt.virConnect, guest: GuestSpec,
                models: dict[str, str]) -> libvirt.virDomain:
        """Define the guest, keeping the identity (name, VF MACs) of the
        domain it has: one defined by an earlier version, or moved here by
        a live migration, is defined again as it is named."""
        dom = _lookup(conn, guest.instance_uuid)
        saved = None if dom is None else _saved_xml(dom)
        identity = None if saved is None else domain_identity(saved)
        return conn.defineXML(build_domain_xml(guest, self._domain_type,
                                               mdev_models=models, identity=identity))

    def _prepare(self, guest: GuestSpec) -> dict[str, str]:
        """Create the guest's missing mdevs (gone after a host reboot);
        returns each mdev's model, read from its type."""
        models: dict[str, str] = {}
        for device in guest.devices:
            if DeviceKind(device.kind) is not DeviceKind.MDEV:
                continue
            parent, type_id = device.detail.mdev_parent, device.detail.mdev_type
            if parent and type_id:
                self._mdevs.create(device.device_id, parent, type_id)
                models[str(uuid_lib.UUID(device.device_id))] = (
                    self._mdevs.device_api(parent, type_id))
            elif not self._mdevs.exists(device.device_id):
                raise MdevError(
                    f"{guest.instance_uuid}: mdev {device.device_id} is "
                    "missing and its parent and type are unknown")
        return models


def _saved_xml(dom: libvirt.virDomain) -> str | None:
    """The domain's saved definition; None when it went away meanwhile."""
    try:
        return dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def _lookup(conn: libvirt.virConnect, instance_uuid: str
            ) -> libvirt.virDomain | None:
    try:
        return conn.lookupByUUIDString(instance_uuid)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def _migration_job_runs(dom: libvirt.virDomain) -> bool:
    """Whether libvirtd is migrating the guest out: a peer-to-peer
    migration goes on inside libvirtd after the client that asked for it
    is gone (an agent killed mid-way)."""
    try:
        job = dom.jobStats()
    except libvirt.libvirtError as exc:
        # Not running (or gone) is no migration; a hypervisor that keeps
        # no jobs (the test driver) migrates nothing.
        if exc.get_error_code() in _ALREADY_STOPPED | _UNSUPPORTED:
            return False
        raise
    return (job.get("type", libvirt.VIR_DOMAIN_JOB_NONE) != libvirt.VIR_DOMAIN_JOB_NONE
            and job.get("operation") == libvirt.VIR_DOMAIN_JOB_OPERATION_MIGRATION_OUT)


def _refused_for_another_migration(dom: libvirt.virDomain, cause: MigrationFailure
                                   ) -> bool:
    """libvirt refuses a migration while another of the guest runs ("another
    migration job is already running", an invalid operation, as for a guest
    that does not run): that one may still take the guest away."""
    if cause is not MigrationFailure.NO_RUNNING_GUEST:
        return False
    try:
        return _migration_job_runs(dom)
    except libvirt.libvirtError:
        return True  # unknown is not "none"


def migration_failure(exc: libvirt.libvirtError, source_alive: bool
                      ) -> MigrationFailure:
    """Why migrateToURI3 failed, from libvirt's error code and the part of
    libvirt that raised it. Only a broken connection to the source's own
    libvirtd leaves the outcome unknown: every other failure of a peer to
    peer migration is reported after the source's libvirtd has resumed
    the guest here and the destination's has dropped it."""
    if not source_alive:
        return MigrationFailure.OUTCOME_UNKNOWN
    code = exc.get_error_code()
    if code in (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_ERR_NO_DOMAIN):
        return MigrationFailure.NO_RUNNING_GUEST
    if code in (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED):
        return MigrationFailure.UNSUPPORTED
    if code in (libvirt.VIR_ERR_CONFIG_UNSUPPORTED, libvirt.VIR_ERR_XML_ERROR,
                libvirt.VIR_ERR_XML_DETAIL, libvirt.VIR_ERR_XML_INVALID_SCHEMA):
        return MigrationFailure.DEFINITION_REFUSED
    if exc.get_error_domain() in (libvirt.VIR_FROM_REMOTE, libvirt.VIR_FROM_RPC):
        return MigrationFailure.DESTINATION_UNREACHABLE
    return MigrationFailure.ABORTED


def _undefine(dom: libvirt.virDomain) -> None:
    for flags in _UNDEFINE_FLAG_SETS:
        try:
            dom.undefineFlags(flags)
            return
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in _UNSUPPORTED or flags == 0:
                raise


def _read_state(dom: libvirt.virDomain) -> tuple[str | None, GuestState] | None:
    """(instance uuid from our metadata, its state); None when the domain
    went away while it was read. Raises InvalidHostData when its XML
    cannot be read: a guest whose devices are unknown is not one without
    devices."""
    try:
        running = bool(dom.isActive())
        live_xml = dom.XMLDesc(0) if running else None
        saved_xml = (dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
                     if dom.isPersistent() else live_xml)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None  # undefined between listing and reading
        raise
    instance_uuid: str | None = None
    live: frozenset[str] = frozenset()
    saved: frozenset[str] = frozenset()
    resources: frozenset[HostResource] = frozenset()
    if live_xml is not None:
        instance_uuid, live, resources = parse_live(live_xml)
    if saved_xml is not None:
        saved_uuid, saved = parse_metadata(saved_xml)
        instance_uuid = instance_uuid or saved_uuid
    return instance_uuid, GuestState(running, live, saved, resources)


def _read_holding(dom: libvirt.virDomain) -> GuestHolding | None:
    """What the domain holds now, ours or not; None when it went away
    while it was read."""
    try:
        running = bool(dom.isActive())
        live_xml = dom.XMLDesc(0) if running else None
        saved_xml = (dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
                     if dom.isPersistent() else None)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise
    return parse_holding(dom.UUIDString(), live_xml, saved_xml)


def _read_foreign(dom: libvirt.virDomain) -> ForeignGuest | None:
    """The domain as a guest of someone else's, from what it holds now: its
    live definition while it runs, else its saved one (what it takes back
    at its next start). None when it is ours, or went away meanwhile."""
    try:
        running = bool(dom.isActive())
        xml = dom.XMLDesc(0 if running else libvirt.VIR_DOMAIN_XML_INACTIVE)
        saved = (dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
                 if running and dom.isPersistent() else xml)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise
    # Ours when either definition carries our metadata (a running guest
    # of ours redefined, say).
    if parse_metadata(saved)[0] is not None:
        return None
    return parse_foreign(xml, running)
