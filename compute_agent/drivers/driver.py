"""The driver contract: what the agent needs from a hypervisor driver.
compute_agent/drivers/fake.py and compute_agent/drivers/libvirt/driver.py implement it, and
tests/contract/ holds both to it. The host's and guests' data types are in
compute_agent/drivers/base.py, a live migration's in compute_agent/drivers/migration.py."""
from __future__ import annotations

import abc
from collections.abc import Callable, Collection

from compute_agent.drivers.base import (
    ForeignGuest,
    GuestHolding,
    GuestSpec,
    GuestState,
    HostInventory,
    PciHealthSignals,
    SriovFunctions,
)
from compute_agent.drivers.migration import LiveMigrationTarget


class ComputeDriver(abc.ABC):
    """What the agent needs from a hypervisor driver."""

    def init_host(self) -> None:  # noqa: B027 - a driver may leave it
        """Connect and prepare; called once before the first cycle."""

    @abc.abstractmethod
    def get_host_inventory(self) -> HostInventory:
        """Discover the host. Raises DriverUnavailable when the hypervisor
        cannot be reached; unreadable devices are skipped with a warning."""

    def register_change_listener(self, callback: Callable[[], None]) -> None:  # noqa: B027 - a driver may leave it
        """Ask to be told when the host's devices change between periods.
        Drivers without change events ignore this."""

    def device_health(self, addresses: Collection[str]
                      ) -> dict[str, PciHealthSignals]:
        """Each PCI device's health signals, read now (cheap: a few small
        files each; called every second or two). A driver that cannot tell
        returns nothing for a device, which then goes unjudged."""
        return {}

    def cleanup(self) -> None:  # noqa: B027 - a driver may leave it
        """Release connections and threads."""

    # --- guests: called outside the tracker's lock -----------------------

    @abc.abstractmethod
    def spawn(self, guest: GuestSpec) -> None:
        """Create missing mdevs, define the guest with its devices and the
        assignment ids in its metadata, and start it if it is stopped.
        Idempotent. A guest that is already running is redefined and keeps
        running on the devices it was started with: only a stop and a
        start (``power_off``, then ``spawn``) changes a live guest's
        devices."""

    @abc.abstractmethod
    def update_guest(self, guest: GuestSpec) -> None:
        """Redefine the guest with these devices, leaving it running or
        stopped as it was; a running guest keeps its live devices."""

    @abc.abstractmethod
    def power_off(self, instance_uuid: str) -> None:
        """Stop the guest, keeping its definition; a stopped or missing
        guest is left as it is."""

    @abc.abstractmethod
    def destroy(self, instance_uuid: str) -> None:
        """Stop and undefine the guest, if it exists."""

    @abc.abstractmethod
    def list_guests(self) -> dict[str, GuestState]:
        """Every guest this agent defined, by instance uuid, with its live
        and saved devices told apart."""

    def describe_guest(self, instance_uuid: str) -> GuestSpec | None:
        """The guest as its definition records it: name, vCPUs, memory,
        and for each device the assignment id, kind and device id its
        metadata carries (nothing else of a device is read back). None
        when there is no such guest of ours. Rebuilding a lost store
        (compute-agent-manage rebuild-store) reads this."""
        return None

    @abc.abstractmethod
    def guest_state(self, instance_uuid: str) -> GuestState | None:
        """One guest's state, or None when there is no guest of ours."""

    def guest_definition(self, instance_uuid: str, live: bool = False,
                         migratable: bool = False) -> str | None:
        """The hypervisor's own definition of the guest (libvirt: its domain
        XML; with ``live``, what a running guest runs with), for operators
        and tests; None when there is none. With ``migratable`` (and
        ``live``), in the form a destination accepts for a live migration
        (libvirt: without what only this host's daemon added), which the
        migration's rewrite starts from."""
        return None

    def guest_is_running(self, instance_uuid: str) -> bool:
        """Whether the guest exists and is running."""
        state = self.guest_state(instance_uuid)
        return state is not None and state.running

    @abc.abstractmethod
    def guest_holdings(self, reread: bool = False) -> dict[str, GuestHolding]:
        """Every guest defined or running here, ours and others' alike, by
        its domain's uuid, with the host resources it holds (compute_agent/drivers/base.py
        GuestHolding). Claims ask before they choose, so it answers as the
        hypervisor is at the call: a guest defined, started, stopped or
        undefined before the call, by this driver or behind its back, is
        seen as it is now; one redefined behind its back, once the
        hypervisor's event for it has arrived. A driver may keep what it
        read of a guest it knows unchanged; ``reread`` trusts nothing kept
        (the update loop asks so once a cycle). Raises DriverUnavailable
        when the hypervisor cannot be asked, and InvalidHostData naming the
        guest whose definition cannot be read: a guest whose devices are
        unknown is not one without devices."""

    # --- guests of others: adoption -----------------------------------------

    @abc.abstractmethod
    def list_foreign_guests(self) -> dict[str, ForeignGuest]:
        """Every guest defined here that is not ours (``list_guests`` does
        not list it), by instance uuid. Raises DriverUnavailable when the
        hypervisor cannot be asked, and InvalidHostData (compute_agent.drivers.errors)
        naming the guest whose definition cannot be read: a guest whose
        devices are unknown is not one without devices."""

    @abc.abstractmethod
    def ensure_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        """Create the mdev if it does not exist (after a reboot, say).
        Raises MdevError when the parent does not offer the type."""

    @abc.abstractmethod
    def remove_mdev(self, mdev_uuid: str) -> None:
        """Remove the mdev if it exists."""

    @abc.abstractmethod
    def set_vgpu_type(self, vf_address: str, type_id: str) -> None:
        """Give a VF in NVIDIA's vendor-specific VFIO layout the vGPU type
        ``type_id`` ("nvidia-557"); nothing to do when it has it. Raises
        MdevError, the VF left as it was, when it does not take it: not a
        type it can create now, another type set, or the write refused."""

    @abc.abstractmethod
    def clear_vgpu_type(self, vf_address: str, type_id: str) -> None:
        """Remove the VF's vGPU type when it is ``type_id``; nothing to do
        when it has none or another (not the one given at claim time: left
        to whoever set it). Raises MdevError when the driver refuses (a
        guest still holds the VF)."""

    @abc.abstractmethod
    def sriov_functions(self, pf_address: str) -> SriovFunctions | None:
        """The PF and the VFs that exist behind it, read from the host
        itself now (after a write of its VF count the hypervisor's device
        list learns of new VFs later). None when there is no device at that
        address; a device that is no PF has no VFs."""

    @abc.abstractmethod
    def set_num_vfs(self, pf_address: str, count: int) -> None:
        """Write the PF's VF count (sysfs ``sriov_numvfs``), as the kernel
        takes it: the VFs exist once it returns; a non-zero count while
        VFs exist is refused (EBUSY), so changing one count to another is
        two writes, 0 first, which the caller decides. Raises SriovError
        with the kernel's answer."""

    def boot_id(self) -> str:
        """Changes at every host boot; claims record it."""
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()

    # --- live migration --------------------------------------------------

    @abc.abstractmethod
    def live_migrate(self, instance_uuid: str, dest_uri: str,
                     target: LiveMigrationTarget) -> None:
        """Move the running guest, while it runs, to the hypervisor at
        ``dest_uri``, where it runs with ``target``'s destination devices in
        place of its own (the driver rewrites its own definition of the
        running guest for them) and is defined persistently. Returns once
        the source holds nothing of the guest, neither running nor
        defined. Raises LiveMigrationError naming the cause; a target that
        does not describe the running guest's devices is
        DEFINITION_REFUSED. For every cause but OUTCOME_UNKNOWN the guest
        still runs here as before and the destination holds nothing."""

    @abc.abstractmethod
    def migrating_out(self, instance_uuid: str) -> bool:
        """Whether the hypervisor is migrating the guest to another host
        right now. A migration can outlive the process that started it
        (libvirt's peer-to-peer migrations run inside libvirtd): an agent
        restarted mid-way finds its own still going. False for a guest
        that is not here."""

    @abc.abstractmethod
    def migration_uri(self) -> str:
        """Where a source's hypervisor reaches this one to migrate a guest
        here (libvirt: the destination libvirtd's URI)."""
