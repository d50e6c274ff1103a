"""Which cause a failed migrateToURI3 is reported with, from libvirt's
error code and domain as libvirt 9.0 raised them in
tests/functional/test_live_migration_libvirt.py and the contract."""
import libvirt
import pytest

from compute_agent.drivers.base import MigrationFailure
from compute_agent.drivers.libvirt.guests import migration_failure


def error(code: int, domain: int) -> libvirt.libvirtError:
    exc = libvirt.libvirtError("migration failed")
    exc.err = (code, domain, "migration failed", libvirt.VIR_ERR_ERROR, "", None, None,
               0, 0)
    return exc


@pytest.mark.parametrize("code, domain, cause", [
    # "domain is not running"
    (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_FROM_DOMAIN,
     MigrationFailure.NO_RUNNING_GUEST),
    # the test driver: "p2p migration is not supported by the source host"
    (libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED, libvirt.VIR_FROM_DOMAIN,
     MigrationFailure.UNSUPPORTED),
    # "Target domain uuid ... does not match source", an ABI change
    (libvirt.VIR_ERR_CONFIG_UNSUPPORTED, libvirt.VIR_FROM_DOMAIN,
     MigrationFailure.DEFINITION_REFUSED),
    (libvirt.VIR_ERR_XML_DETAIL, libvirt.VIR_FROM_DOMAIN,
     MigrationFailure.DEFINITION_REFUSED),
    # "Failed to connect socket to ..." the destination's libvirtd
    (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC,
     MigrationFailure.DESTINATION_UNREACHABLE),
    # the destination's QEMU cannot open its backing file
    (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_SECURITY, MigrationFailure.ABORTED),
    # the destination's QEMU killed mid-way
    (libvirt.VIR_ERR_OPERATION_FAILED, libvirt.VIR_FROM_QEMU, MigrationFailure.ABORTED),
    # "Attempt to migrate guest to the same host"
    (libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU, MigrationFailure.ABORTED),
])
def test_cause_of_a_failure_reported_by_a_live_source(code, domain, cause):
    assert migration_failure(error(code, domain), source_alive=True) is cause


def test_a_lost_source_connection_leaves_the_outcome_unknown_whatever_the_error():
    for code, domain in ((libvirt.VIR_ERR_OPERATION_FAILED, libvirt.VIR_FROM_QEMU),
                         (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC)):
        assert (migration_failure(error(code, domain), source_alive=False)
                is MigrationFailure.OUTCOME_UNKNOWN)
