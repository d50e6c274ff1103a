"""The run of the VF restore against a driver and a store: a start in a
new boot writes each PF's VF count, a start in the same boot writes
nothing (the boot ID is what tells them apart)."""
from __future__ import annotations

import pytest

from compute_agent.drivers.base import HostInventory, PciDevice, PciKind
from compute_agent.drivers.fake import FakeDriver
from compute_agent.health.vf_restore_run import VfRestore
from compute_agent.store.store import Store

PF = "0000:81:00.0"


class CountingDriver(FakeDriver):
    """The fake driver, keeping every write of a PF's VF count."""

    def __init__(self) -> None:
        super().__init__(HostInventory(
            cpus=frozenset(range(4)), memory_mb=8192, disk_gb=100,
            pci_devices=(PciDevice(PF, "8086", "10fb", PciKind.PF, 0, total_vfs=8),)))
        self.writes: list[tuple[str, int]] = []

    def set_num_vfs(self, pf_address: str, count: int) -> None:
        self.writes.append((pf_address, count))
        super().set_num_vfs(pf_address, count)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def test_a_start_in_the_same_boot_writes_no_vf_count(store):
    driver = CountingDriver()
    VfRestore(driver, store, ((PF, 4),)).restore("boot-1")
    assert driver.writes == [(PF, 4)]
    # Someone sets another count by hand; the agent restarts, same boot.
    driver.set_num_vfs(PF, 0)
    driver.set_num_vfs(PF, 2)
    driver.writes.clear()

    VfRestore(driver, store, ((PF, 4),)).restore("boot-1")
    assert driver.writes == []
    assert driver.sriov_functions(PF).pf.num_vfs == 2


def test_a_start_in_a_new_boot_writes_the_vf_count(store):
    driver = CountingDriver()
    VfRestore(driver, store, ((PF, 4),)).restore("boot-1")
    driver.reboot("boot-2")
    driver.writes.clear()

    VfRestore(driver, store, ((PF, 4),)).restore("boot-2")
    assert driver.writes == [(PF, 4)]
    assert driver.sriov_functions(PF).pf.num_vfs == 4
