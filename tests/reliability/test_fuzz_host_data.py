"""Short fuzzing of the host-data parsers and of discovery (the long run:
tools/reliability_cases/fuzz.py): every input gets a result or
InvalidHostData, and discovery always answers."""
from __future__ import annotations

import pytest

from tests.reliability import host_data_fuzz as fuzz
from tests.reliability.exploring import Tally, explore

EXAMPLES = 300


def test_node_device_xml(tmp_path):
    tally = Tally("node-device XML")
    explore(tally, fuzz.xml_inputs(fuzz.node_device_documents(tmp_path)),
            fuzz.check_node_device, EXAMPLES)
    assert tally.inputs >= EXAMPLES and tally.results and tally.refusals


def test_capabilities_xml(services):
    tally = Tally("capabilities XML")
    explore(tally, fuzz.xml_inputs(fuzz.capabilities_documents()),
            fuzz.check_capabilities, EXAMPLES)
    assert tally.inputs >= EXAMPLES and tally.results and tally.refusals


def test_ndctl_json(tmp_path):
    tally = Tally("ndctl JSON")
    ndctl = fuzz.NdctlFile(tmp_path)
    explore(tally, fuzz.ndctl_inputs(), ndctl.check, EXAMPLES)
    explore(tally, fuzz.ndctl_bytes(), ndctl.check_bytes, EXAMPLES)
    assert tally.inputs >= 2 * EXAMPLES and tally.results and tally.refusals


@pytest.fixture
def sysfs(tmp_path):
    tree = fuzz.FuzzedSysfs(tmp_path)
    yield tree
    tree.close()


def test_sysfs_files_and_discovery(sysfs):
    tally = Tally("sysfs")
    explore(tally, fuzz.sysfs_inputs(), sysfs.check, 150)
    assert tally.inputs >= 150 and tally.results and tally.refusals
