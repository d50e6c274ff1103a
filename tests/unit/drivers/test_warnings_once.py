"""A driver's warnings about unreadable devices, logged once while they
last (compute_agent/drivers/warnings_once.py)."""
import logging

import pytest

from compute_agent.drivers.warnings_once import WarningsOnce

LOGGER = "tests.warnings_once"
NUMVFS = "0000:81:00.0: sriov_numvfs: not an integer (value: 'many')"
VENDOR = "0000:06:00.0: vendor: No such file or directory (value: '/sys/...')"


@pytest.fixture
def once(caplog) -> WarningsOnce:
    caplog.set_level(logging.WARNING, LOGGER)
    return WarningsOnce(logging.getLogger(LOGGER))


def logged(caplog) -> list[str]:
    """The warnings logged since the last call."""
    lines = [r.getMessage() for r in caplog.records
             if r.name == LOGGER and r.levelno == logging.WARNING]
    caplog.clear()
    return lines


def test_a_warning_is_logged_in_its_first_cycle_only(once, caplog):
    once.log_cycle([NUMVFS, VENDOR])
    assert logged(caplog) == [NUMVFS, VENDOR]
    once.log_cycle([VENDOR, NUMVFS])
    once.log_cycle([NUMVFS, VENDOR])
    assert logged(caplog) == []


def test_a_new_warning_beside_old_ones_is_logged_alone(once, caplog):
    once.log_cycle([NUMVFS])
    logged(caplog)
    once.log_cycle([NUMVFS, VENDOR])
    assert logged(caplog) == [VENDOR]


def test_the_same_device_with_another_reason_is_logged_again(once, caplog):
    once.log_cycle([NUMVFS])
    logged(caplog)
    other = NUMVFS.replace("'many'", "'-1'").replace("not an integer", "out of range")
    once.log_cycle([other])
    assert logged(caplog) == [other]


def test_a_warning_back_after_a_cycle_without_it_is_logged_again(once, caplog):
    once.log_cycle([NUMVFS])
    once.log_cycle([])  # the device recovered
    once.log_cycle([NUMVFS])  # and failed again
    assert logged(caplog) == [NUMVFS, NUMVFS]


def test_a_warning_twice_in_one_cycle_is_logged_once(once, caplog):
    once.log_cycle(iter([NUMVFS, NUMVFS]))
    assert logged(caplog) == [NUMVFS]

