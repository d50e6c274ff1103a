"""The host CPU's features, its named model's own included.

Capabilities XML names the host CPU's model ("Skylake-Client") and lists
only the features beyond it, so sse4.2 or avx2 inside the model would be
missing. libvirt's ``baselineCPU`` with ``VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES``
lists every feature of the CPU it is given (those the guest's OS governs,
like osxsave, aside: the listed ones are kept too). It is asked once per
host CPU definition, the answer kept while the definition stays the same.

A connection that cannot baseline (a driver without it, a model its CPU map
lacks) leaves the listed features, with one warning: it never fails
discovery.
"""
from __future__ import annotations

import logging

import libvirt

from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.libvirt import capabilities
from compute_agent.drivers.libvirt.connection import Connection

LOG = logging.getLogger(__name__)
BASELINE = "baselineCPU"


def expand(conn: libvirt.virConnect, definition: str) -> frozenset[str]:
    """Every feature of the CPU ``definition`` (a ``<cpu>`` element)."""
    text = conn.baselineCPU([definition],
                            libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES)
    return capabilities.cpu_features(capabilities.parse_xml(text, BASELINE))


class HostCpuFeatures:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        # The host <cpu> definition -> its expanded features.
        self._expanded: dict[str, frozenset[str]] = {}
        self._warned = False

    def features(self, caps: capabilities.Capabilities) -> frozenset[str]:
        definition = caps.cpu_definition
        if definition is None:
            return caps.cpu_features
        known = self._expanded.get(definition)
        if known is not None:
            return known
        try:
            known = self._conn.call(lambda conn: expand(conn, definition))
        except (libvirt.libvirtError, InvalidHostData) as exc:
            if not self._warned:
                self._warned = True
                LOG.warning("libvirt at %s cannot expand the host CPU model's "
                            "features (%s): only the features its capabilities "
                            "list are reported as CPU traits", self._conn.uri, exc)
            return caps.cpu_features
        # With the listed ones: libvirt's baseline leaves out some that the
        # capabilities list (osxsave, which the guest's OS sets).
        known |= caps.cpu_features
        self._expanded = {definition: known}
        return known
