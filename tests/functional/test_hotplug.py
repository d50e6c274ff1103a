"""A device appearing reaches Placement on libvirt's node-device event, not
at the next periodic cycle: a running agent (update loop and health watch
threads, update_interval an hour) on the libvirt test driver over a fake
sysfs tree, and the session's real Placement.

This machine has no PCI hot-plug, and the test driver sends node-device
lifecycle events for one kind of device only: a vHBA created or destroyed
through it. So the host changes in sysfs (a GPU's vendor driver binds and
the GPU becomes an mdev parent, or unbinds), then a vHBA created or
destroyed on the agent's own connection (each file-based test-driver
connection is a private copy of the host) makes libvirt send the event, as
libvirtd sends one when udev reports a device.
"""
from __future__ import annotations

import pytest

from compute_agent.drivers.fake_sysfs import vhba_xml
from compute_agent.tree.host_tree import gpu_provider_name
from tests.functional.helpers import get, providers_named, wait_for
from tests.functional.libvirt_host import Host

# A second GPU, plain PCI until its vendor driver binds.
LATE_GPU = "0000:07:00.0"
# Far under update_interval (an hour), so only the event can start the
# cycle in time, and far over a cycle on a loaded machine: how soon is
# tools/bench hotplug's business.
BOUND_S = 60.0


@pytest.fixture
def host(tmp_path, placement):
    h = Host(tmp_path, placement.url)
    h.build_default()
    h.sys.add_pci_device(LATE_GPU, "10de", "13f2", "030000", numa_node=0)
    h.hba = h.sys.add_npiv_hba(5)
    h.make_agent(default={"update_interval": 3600})
    h.agent.start()
    yield h
    h.agent.stop()


def late_gpu(host: Host, resources: str = "") -> list[dict]:
    return providers_named(host.url, gpu_provider_name(host.name, LATE_GPU), resources)


def on_event(host: Host, event, reached) -> None:
    """Make libvirt send the event (``event(conn)`` on the agent's own
    connection); Placement shows ``reached`` within BOUND_S."""
    host.agent.driver._conn.call(event)
    wait_for(reached, timeout=BOUND_S, interval=0.05)


def test_a_gpu_bound_then_unbound_reaches_placement_on_the_node_device_event(host):
    assert late_gpu(host) == []
    host.sys.bind_mdev_driver(LATE_GPU, {"nvidia-35": ("GRID M60-2Q", 4)})
    vhbas = []
    on_event(host, lambda conn: vhbas.append(conn.nodeDeviceCreateXML(vhba_xml(host.hba, 1), 0)),
             lambda: late_gpu(host, "VGPU:4"))
    provider = late_gpu(host)[0]["uuid"]
    assert get(host.url, f"/resource_providers/{provider}/inventories")[
        "inventories"]["VGPU"]["total"] == 4

    host.sys.unbind_mdev_driver(LATE_GPU)
    on_event(host, lambda conn: vhbas.pop().destroy(), lambda: late_gpu(host) == [])
