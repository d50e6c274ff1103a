"""What the driver interface (compute_agent/drivers/driver.py) gives every
driver that does not answer for itself, seen through the fake driver,
which keeps the interface's own guest_is_running."""
import uuid

import pytest

from compute_agent.drivers.base import GuestSpec
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.fake import FakeDriver

INSTANCE = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01"


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


def test_a_spawned_guest_is_running(driver):
    driver.spawn(GuestSpec(INSTANCE, "g", 2, 512))
    assert driver.guest_is_running(INSTANCE) is True


def test_a_guest_powered_off_is_not_running(driver):
    driver.spawn(GuestSpec(INSTANCE, "g", 2, 512))
    driver.power_off(INSTANCE)
    assert driver.guest_state(INSTANCE) is not None  # still defined
    assert driver.guest_is_running(INSTANCE) is False


def test_a_guest_that_is_not_here_is_not_running(driver):
    assert driver.guest_is_running(INSTANCE) is False


def test_the_boot_id_is_the_kernels_for_this_boot(driver):
    # The interface's own reading, which a driver without a boot id of
    # its own keeps: the kernel writes a UUID and a newline.
    boot_id = ComputeDriver.boot_id(driver)
    assert str(uuid.UUID(boot_id)) == boot_id
    assert ComputeDriver.boot_id(driver) == boot_id
