"""What of our providers the agent owns, and so may change (pure).

Placement is shared: nova's scheduler, neutron's agents, Cyborg and the
operator write to the same providers. The agent changes only what it owns:

- **Traits.** The agent owns the traits it reports now and every trait of
  the families only it sets: ``HW_NUMA_ROOT``, ``COMPUTE_NODE``,
  ``COMPUTE_MANAGED_PCI_DEVICE``, the host CPU's feature traits, the owner
  traits (``OWNER_*``), ``CUSTOM_MDEV_TYPE_*`` and ``CUSTOM_PHYSNET_*``.
  So a trait it stops reporting (a CPU feature gone, an mdev type changed)
  is removed. Every other trait found on our providers is kept on every
  write, as nova keeps "externally defined traits": ``COMPUTE_STATUS_DISABLED``,
  an operator's ``CUSTOM_*`` marks, neutron's or nova's capability traits.
  The rule is over names, not a memory of what the agent once wrote: it
  gives the same answer after a restart, after a lost store, and on a host
  that nova-compute registered (whose CPU traits become the agent's at
  first sight). Its one blind spot: a trait a ``[pci] device_spec`` entry
  stops naming, while no entry names it any more, is no longer told apart
  from an operator's, and stays.
- **Reserved.** On VCPU, PCPU, MEMORY_MB and DISK_GB, ``reserved`` comes
  from the agent's config. On every other (device) class it is the
  operator's: Placement's value is kept. The agent raises it only for its
  own reasons (a device gone but still allocated; new inventory not yet
  healed), and its reasons always reserve the whole inventory. So a device
  inventory found wholly reserved while the agent has no reason is its own
  mark left from a reason that has ended, and goes back to 0; an operator
  who wants a whole device out of service takes it out of
  ``[pci] device_spec`` instead. When a total shrinks below an operator's
  reserved, the reserved is lowered to one below the new total.
- **Device health.** A provider whose device the health watch finds bad
  (compute_agent/health/rules.py) carries ``CUSTOM_HW_DEVICE_UNHEALTHY`` and a
  reason trait of that family, both the agent's; while it carries them in
  Placement, its device inventories' reserved is the agent's too (the bad
  units), so it goes back to the agent's value, 0, once the device
  recovers. An operator's reservation on such a provider is not kept.
- **One-time-use devices.** ``HW_PCI_ONE_TIME_USE`` (nova's) is the
  agent's, and so is ``CUSTOM_HW_DEVICE_CLEANING_FAILED``, on a provider
  whose used device's cleaning failed (compute_agent/cleaning/rules.py). On a
  provider that carries ``HW_PCI_ONE_TIME_USE`` in Placement, the device
  inventories' reserved is the agent's (its used units), as nova makes it
  its own there: it goes back to 0 once they are clean.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import os_resource_classes as orc
import os_traits

from compute_agent.tree.cpu_traits import CPU_FEATURE_TRAITS

# Classes whose reserved the config sets: the host's own share.
AGENT_RESERVED_CLASSES = frozenset({orc.VCPU, orc.PCPU, orc.MEMORY_MB, orc.DISK_GB})

AGENT_TRAITS = frozenset({os_traits.HW_NUMA_ROOT, os_traits.COMPUTE_NODE,
                          os_traits.COMPUTE_MANAGED_PCI_DEVICE,
                          os_traits.HW_PCI_ONE_TIME_USE}
                         ) | CPU_FEATURE_TRAITS | frozenset(os_traits.get_traits("OWNER_"))
# On a provider whose device is out of service for its health; every
# trait of the family is the agent's, the reasons included.
UNHEALTHY_TRAIT = "CUSTOM_HW_DEVICE_UNHEALTHY"
# On a provider whose one-time-use device's cleaning failed.
CLEANING_FAILED_TRAIT = "CUSTOM_HW_DEVICE_CLEANING_FAILED"
AGENT_TRAIT_PREFIXES = ("CUSTOM_MDEV_TYPE_", "CUSTOM_PHYSNET_", UNHEALTHY_TRAIT,
                        CLEANING_FAILED_TRAIT)
# A provider carrying one of these in Placement has the agent's reserved.
AGENT_RESERVED_TRAITS = frozenset({UNHEALTHY_TRAIT, os_traits.HW_PCI_ONE_TIME_USE})


def agent_owns_trait(trait: str, reported: frozenset[str]) -> bool:
    """Whether the agent may remove ``trait`` from one of its providers;
    ``reported`` is every trait it reports anywhere in its tree now (so a
    device spec's trait moved from one device to another leaves the first)."""
    return (trait in reported or trait in AGENT_TRAITS
            or trait.startswith(AGENT_TRAIT_PREFIXES))


def traits_to_write(current: frozenset[str], desired: frozenset[str],
                    reported: frozenset[str]) -> frozenset[str]:
    """The agent's traits as it reports them, and every other one kept."""
    return desired | frozenset(t for t in current
                               if not agent_owns_trait(t, reported))


def reserved_to_write(resource_class: str, desired: Mapping[str, Any],
                      current: Mapping[str, Any] | None, held_for_agent: bool = False
                      ) -> int:
    """The ``reserved`` of one inventory record the agent writes;
    ``held_for_agent``: its provider carries one of AGENT_RESERVED_TRAITS
    in Placement, so the reserved found there is the agent's."""
    ours: int = desired.get("reserved", 0)
    if (current is None or resource_class in AGENT_RESERVED_CLASSES
            or held_for_agent):
        return ours
    theirs: int = current.get("reserved", 0)
    if theirs >= current["total"]:
        theirs = 0  # the agent's own mark, from a reason that has ended
    # Below the whole even when the total shrank: a whole reservation
    # would read as the agent's own mark next cycle.
    total: int = desired["total"]
    return max(ours, min(theirs, total - 1))


def inventories_to_write(current: Mapping[str, Mapping[str, Any]],
                         desired: Mapping[str, dict[str, Any]],
                         current_traits: frozenset[str] = frozenset()
                         ) -> dict[str, dict[str, Any]]:
    """``desired`` with each device inventory's reserved as the operator
    left it, unless the agent has its own reason to hold more."""
    held = bool(AGENT_RESERVED_TRAITS & current_traits)
    return {rc: {**rec, "reserved": reserved_to_write(rc, rec, current.get(rc), held)}
            for rc, rec in desired.items()}
