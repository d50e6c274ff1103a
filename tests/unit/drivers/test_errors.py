"""The drivers' errors (compute_agent/drivers/errors.py): the messages an
operator reads, the fields code reads, and the bases callers catch."""
import pytest

from compute_agent.drivers.base import MigrationFailure
from compute_agent.drivers.errors import (
    DriverError,
    DriverUnavailable,
    InvalidFakeHost,
    InvalidHostData,
    InvalidMigrationTarget,
    LiveMigrationError,
    MdevError,
    MigrationXmlError,
    SriovError,
)

PF = "0000:81:00.0"


def test_host_data_names_device_field_reason_and_value():
    error = InvalidHostData(PF, "sriov_numvfs", "not an integer", "many\n")
    assert str(error) == "0000:81:00.0: sriov_numvfs: not an integer (value: 'many\\n')"
    assert (error.device, error.field, error.reason, error.value) == (
        PF, "sriov_numvfs", "not an integer", "many\n")


def test_a_long_value_is_cut_in_the_message_and_kept_whole_on_the_error():
    value = "x" * 200
    error = InvalidHostData(PF, "vendor", "not a 4-digit hex id", value)
    shown = str(error).split("(value: ", 1)[1][:-1]
    assert shown == repr(value)[:77] + "..."
    assert len(shown) == 80
    assert error.value == value


def test_a_value_of_exactly_the_limit_is_shown_whole():
    value = "x" * 78  # its repr, quotes included, is 80 characters
    error = InvalidHostData(PF, "vendor", "not a 4-digit hex id", value)
    assert str(error).endswith(f"(value: {value!r})")


def test_an_unreachable_hypervisor_says_where_and_what_went_wrong():
    error = DriverUnavailable("cannot connect", "qemu:///system",
                              "did not answer (Connection refused)")
    assert (str(error), error.where, error.problem) == (
        "cannot connect", "qemu:///system", "did not answer (Connection refused)")


def test_an_unreachable_hypervisor_without_a_problem_says_it_failed_with_the_message():
    assert DriverUnavailable("libvirtd restarting").problem == "failed (libvirtd restarting)"


def test_a_failed_migration_leads_with_its_cause():
    error = LiveMigrationError(MigrationFailure.DESTINATION_UNREACHABLE,
                               "guest g1 to qemu+tcp://dest/system: unable to connect")
    assert error.cause is MigrationFailure.DESTINATION_UNREACHABLE
    assert str(error) == ("destination_unreachable: guest g1 to qemu+tcp://dest/system: "
                          "unable to connect")


def test_a_bad_migration_target_names_the_field_and_the_value():
    error = InvalidMigrationTarget("target.moves[0].source.amount", "2",
                                   "must be a whole number from 1")
    # The value as it came, quoted: a string "2" is told from the number.
    assert str(error) == "target.moves[0].source.amount: '2': must be a whole number from 1"
    assert (error.field, error.value) == ("target.moves[0].source.amount", "2")


@pytest.mark.parametrize("error", [
    InvalidHostData(PF, "vendor", "not a 4-digit hex id"),
    InvalidMigrationTarget("target", [], "must be an object"),
    MigrationXmlError("no <devices>"),
    InvalidFakeHost("pci_devices[0].address: not a PCI address"),
])
def test_a_bad_value_is_caught_as_a_value_error_and_as_a_driver_error(error):
    with pytest.raises(ValueError):
        raise error
    with pytest.raises(DriverError):
        raise error


@pytest.mark.parametrize("error", [
    DriverUnavailable("down"),
    MdevError("cannot create mdev"),
    SriovError("cannot set 2 VFs"),
    LiveMigrationError(MigrationFailure.ABORTED, "guest g1"),
])
def test_a_failure_of_the_host_is_a_driver_error_and_no_value_error(error):
    assert isinstance(error, DriverError)
    assert not isinstance(error, ValueError)
