"""The host CPU's features expanded from its named model (baselineCPU),
against a connection that answers as libvirt documents."""
import logging

import libvirt
import pytest

from compute_agent.drivers.libvirt import capabilities
from compute_agent.drivers.libvirt.connection import Connection
from compute_agent.drivers.libvirt.host_cpu import HostCpuFeatures
from compute_agent.tree.cpu_traits import cpu_feature_traits
from tests.unit.drivers.libvirt.test_capabilities import CAPS, HOST_CPU

# baselineCPU's answer for HOST_CPU with VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES,
# in libvirt's domain <cpu> format: the model's own features (sse2, sse4.2,
# avx2...) listed too, and what the host lacks of it disabled.
EXPANDED = """<cpu mode='custom' match='exact'>
  <model fallback='forbid'>Skylake-Client-IBRS</model>
  <vendor>Intel</vendor>
  <feature policy='require' name='avx'/>
  <feature policy='require' name='avx2'/>
  <feature policy='require' name='ds'/>
  <feature policy='require' name='fma'/>
  <feature policy='require' name='md-clear'/>
  <feature policy='require' name='pdpe1gb'/>
  <feature policy='require' name='sse2'/>
  <feature policy='require' name='sse4.1'/>
  <feature policy='require' name='sse4.2'/>
  <feature policy='require' name='vmx'/>
  <feature policy='disable' name='hle'/>
</cpu>"""


class FakeConnect:
    """The few virConnect calls HostCpuFeatures makes."""

    def __init__(self, answer=EXPANDED, error=None):
        self.answer = answer
        self.error = error
        self.asked: list[tuple[list[str], int]] = []

    def isAlive(self):
        return True

    def close(self):
        pass

    def baselineCPU(self, cpus, flags):
        self.asked.append((cpus, flags))
        if self.error is not None:
            raise self.error
        return self.answer


def features_of(fake: FakeConnect, caps_xml=HOST_CPU):
    cpu = HostCpuFeatures(Connection("qemu:///system", open_fn=lambda uri: fake))
    return cpu, capabilities.parse_capabilities(caps_xml)


def test_the_models_own_features_are_added_to_the_listed_ones():
    fake = FakeConnect()
    cpu, caps = features_of(fake)
    found = cpu.features(caps)
    assert found == {"avx", "avx2", "ds", "fma", "md-clear", "pdpe1gb", "sse2",
                     "sse4.1", "sse4.2", "vmx"}
    assert found > caps.cpu_features
    assert {"HW_CPU_X86_SSE2", "HW_CPU_X86_FMA3", "HW_CPU_X86_AVX"} <= (
        cpu_feature_traits(found))
    ((definitions, flags),) = fake.asked
    assert flags == libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES
    # The host's own <cpu>, model and listed features, is what is expanded.
    (cpu_el,) = [capabilities.parse_xml(d, "cpu") for d in definitions]
    assert cpu_el.findtext("model") == "Skylake-Client-IBRS"
    assert capabilities.cpu_features(cpu_el) == caps.cpu_features


def test_the_same_host_cpu_is_expanded_once():
    fake = FakeConnect()
    cpu, caps = features_of(fake)
    expanded = cpu.features(caps)
    assert expanded > caps.cpu_features
    # The second answer is the first expansion's, libvirt not asked again.
    assert cpu.features(caps) == expanded
    assert len(fake.asked) == 1


@pytest.mark.parametrize("fake", [
    FakeConnect(error=libvirt.libvirtError("this function is not supported")),
    FakeConnect(answer="<cpu><feature name='avx2'"),
], ids=["refused", "garbled"])
def test_a_connection_that_cannot_baseline_leaves_the_listed_features_with_one_warning(
        fake, caplog):
    cpu, caps = features_of(fake)
    with caplog.at_level(logging.WARNING, "compute_agent.drivers.libvirt.host_cpu"):
        assert cpu.features(caps) == caps.cpu_features
        assert cpu.features(caps) == caps.cpu_features
    (record,) = caplog.records
    assert "qemu:///system" in record.getMessage()


def test_a_cpu_that_names_no_model_is_not_expanded():
    """Its list is all there is (libvirt's test driver's host CPU)."""
    fake = FakeConnect()
    cpu, caps = features_of(fake, CAPS)
    assert caps.cpu_definition is None
    assert cpu.features(caps) == frozenset() and fake.asked == []
