"""A move's source tree read from Placement, as the destination request
needs it (compute_agent.moves.request.move_request): every provider with its
parent, the NUMA cells marked, and the traits of the device providers the
instance uses. Evacuate and live-migrate both read it this way."""
from __future__ import annotations

from collections.abc import Iterable

import os_traits

from compute_agent.moves.request import SourceProvider
from compute_agent.placement.client import PlacementClient


def read_source_tree(placement: PlacementClient, root_uuid: str) -> dict[str, SourceProvider]:
    """The tree of ``root_uuid``, its NUMA cells marked; no device
    provider's traits yet (read_device_traits): two requests."""
    cells = {p["uuid"] for p in placement.get_providers(
        in_tree=root_uuid, required=os_traits.HW_NUMA_ROOT)}
    return {p["uuid"]: SourceProvider(
        p["uuid"], p["parent_provider_uuid"],
        frozenset({os_traits.HW_NUMA_ROOT}) if p["uuid"] in cells else frozenset())
        for p in placement.get_tree(root_uuid)}


def read_device_traits(placement: PlacementClient, providers: dict[str, SourceProvider],
                       used: Iterable[str]) -> None:
    """Put in ``providers`` the traits of each device provider in ``used``
    (neither the root nor a NUMA cell, whose traits say nothing of a
    device): one request each."""
    for uuid in used:
        p = providers[uuid]
        if p.parent_uuid is not None and os_traits.HW_NUMA_ROOT not in p.traits:
            _, traits = placement.get_traits(uuid)
            providers[uuid] = SourceProvider(uuid, p.parent_uuid, traits)
