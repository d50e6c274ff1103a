"""The small sysfs host (tests/unit/drivers/sysfs_hosts.py) and its reader,
for the tests of the reader, the fake and the writers."""
import pytest

from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt.sysfs import SysfsReader
from tests.unit.drivers.sysfs_hosts import small_host


@pytest.fixture
def builder(tmp_path) -> SysfsBuilder:
    return small_host(tmp_path / "sys")


@pytest.fixture
def reader(builder: SysfsBuilder) -> SysfsReader:
    return SysfsReader(str(builder.root))
