"""Fixtures shared by unit and functional tests."""
import logging
import subprocess
from pathlib import Path

import libvirt
import pytest
from hypothesis import HealthCheck, settings

from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.private_services import PrivateLibvirtd, PrivateRabbitMQ, running_libvirtd_pair

# The suite runs on several workers on a shared 2-core machine, where how
# long an example takes to draw or to run says nothing about the code
# under test: no deadline and no too-slow health check (a test may still
# set its own).
settings.register_profile("suite", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


def _pytests_own(handler: logging.Handler) -> bool:
    """pytest's capture handlers, which it adds and removes around each
    phase of a test itself."""
    return type(handler).__module__ == "_pytest.logging"


@pytest.fixture(autouse=True)
def logging_as_it_was():
    """A test that runs a console script in this process (oslo.log's setup
    replaces the root logger's handlers and sets it to INFO) leaves logging
    as it found it: a test then sees the same logging whichever tests ran
    before it on its worker."""
    root = logging.getLogger()
    handlers = [h for h in root.handlers if not _pytests_own(h)]
    levels = {logger: logger.level for logger in
              [root, *logging.Logger.manager.loggerDict.values()]
              if isinstance(logger, logging.Logger)}
    yield
    for handler in root.handlers[:]:
        if not _pytests_own(handler) and handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    for logger, level in levels.items():
        logger.setLevel(level)


@pytest.fixture(scope="session")
def placement(tmp_path_factory):
    """A real openstack-placement on SQLite, shared by the session. Tests
    keep apart by using their own host names (so their own trees)."""
    server = LocalPlacement(tmp_path_factory.mktemp("placement")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def services():
    """The real libvirtd and RabbitMQ running, started by the project's own
    script when they are not."""
    subprocess.run([str(Path(__file__).resolve().parents[1] / "tools" / "services")],
                   check=True, stdout=subprocess.DEVNULL, timeout=300)


@pytest.fixture(scope="session")
def libvirtd(services):
    """Yields this machine's capabilities XML and getInfo()."""
    conn = libvirt.open("qemu:///system")
    try:
        yield conn.getCapabilities(), conn.getInfo()
    finally:
        conn.close()


@pytest.fixture
def private_libvirtd(tmp_path_factory):
    """A libvirtd (QEMU/KVM) of the test's own, for a test that stops or
    restarts it; it is gone, with its guests, after the test."""
    daemon = PrivateLibvirtd(tmp_path_factory.mktemp("libvirtd"))
    try:
        yield daemon.start()
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def two_private_libvirtds(tmp_path_factory):
    """Two libvirtds (QEMU/KVM) of the module's own, as two hosts a guest
    live-migrates between: distinct host UUIDs, their own directories and
    migration ports. Shared by the module's tests (a start is 1-8 s); they
    are gone, with their guests, after it."""
    with running_libvirtd_pair(tmp_path_factory.mktemp("libvirtd-pair")) as pair:
        yield pair


@pytest.fixture
def private_rabbitmq():
    """A RabbitMQ node of the test's own, for a test that stops its broker."""
    node = PrivateRabbitMQ()
    try:
        yield node.start()
    finally:
        node.close()


# The long jobs, each a CI step of its own outside the suite's 10-minute
# budget, collected only when asked for: the upgrade tests (tests/upgrade,
# tools/test --upgrade) install earlier versions and run for minutes; the
# fleet tests (tests/fleet, tools/test --fleet) run a dozen agents at once.
LONG_JOBS = {"upgrade": "upgrades from earlier versions",
             "fleet": "a small fleet of agents on one Placement",
             "cluster": "agents on a cluster of three RabbitMQ nodes"}
TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser):
    for job, what in LONG_JOBS.items():
        parser.addoption(f"--{job}", action="store_true",
                         help=f"collect tests/{job} ({what})")


def pytest_ignore_collect(collection_path, config):
    if any(collection_path == TESTS / job and not config.getoption(f"--{job}")
           for job in LONG_JOBS):
        return True
    return None
