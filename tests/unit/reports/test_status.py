"""compute_agent/reports/status.py: each rule, and the exit code as the worst check."""
from __future__ import annotations

from dataclasses import replace

import pytest

from compute_agent.daemon.cycle_record import CycleRecord
from compute_agent.dependencies import Dependency, DependencyState, Health, Probe, Unknown
from compute_agent.reports import status
from compute_agent.reports.status import Level, StatusFacts, StoreHealth, judge

NOW = 10_000.0
PLACEMENT = "http://127.0.0.1:8778"


def healthy(**changes) -> StatusFacts:
    facts = StatusFacts(
        now=NOW, cycle_seconds=60, code_schema_version=4,
        hypervisor=Probe(Dependency.LIBVIRT, "qemu:///system"), keystone=None,
        placement=Probe(Dependency.PLACEMENT, PLACEMENT, detail="microversion 1.39"),
        broker=Probe(Dependency.BROKER, "rabbit://127.0.0.1:5672/"),
        store=StoreHealth("/s/state.db", None, 4, ("ok",)),
        cycle=CycleRecord(1, NOW - 5, NOW - 5), unhealed=(), audit=())
    return replace(facts, **changes)


def level_of(rule, facts) -> Level:
    return max(c.level for c in rule(facts))


def test_a_healthy_host_exits_0_with_a_line_per_check():
    s = judge(healthy())
    assert s.level is Level.OK
    assert s.lines()[-1] == "healthy"
    assert "OK      Placement at http://127.0.0.1:8778 answered (microversion 1.39)" \
        in s.lines()


def test_the_worst_check_is_the_exit_code():
    s = judge(healthy(unhealed=("VGPU",),
                      placement=Probe(Dependency.PLACEMENT, PLACEMENT, "did not answer (x)")))
    assert s.level is Level.BROKEN and s.as_dict()["exit_code"] == 2
    assert judge(healthy(unhealed=("VGPU",))).level is Level.WARNING


@pytest.mark.parametrize("rule, field", [
    (status.hypervisor, "hypervisor"), (status.placement, "placement"),
    (status.broker, "broker")])
def test_a_dependency_that_does_not_answer_is_broken(rule, field):
    probe = getattr(healthy(), field)
    facts = healthy(**{field: replace(probe, problem="did not answer (connection refused)")})
    (check,) = rule(facts)
    assert check.level is Level.BROKEN
    assert check.line == f"{probe.dependency.value} at {probe.url} did not answer " \
                         "(connection refused)"


def test_keystone_is_checked_only_when_the_plugin_uses_it():
    assert status.keystone(healthy()) == []
    facts = healthy(keystone=Probe(Dependency.KEYSTONE, "http://ks/v3", "refused (401)"),
                    placement=Unknown("not asked: Keystone gave no token or endpoint"))
    assert level_of(status.keystone, facts) is Level.BROKEN
    (check,) = status.placement(facts)
    assert check.level is Level.WARNING and "unknown (not asked" in check.line


def test_an_unchecked_transport_is_a_warning_not_ok():
    assert level_of(status.broker, healthy(broker=Unknown("not checked"))) is Level.WARNING


def test_the_fake_driver_has_no_hypervisor_to_ask():
    assert level_of(status.hypervisor, healthy(hypervisor=None)) is Level.OK


def test_a_store_that_does_not_open_is_broken():
    facts = healthy(store=StoreHealth("/s/state.db", "corrupt: file is not a database"))
    (check,) = status.store_opens(facts)
    assert check == status.Check("store", Level.BROKEN,
                                 "store /s/state.db: corrupt: file is not a database")
    assert status.store_schema(facts) == status.store_integrity(facts) == []


def test_schema_older_is_a_warning_newer_is_broken():
    def at(version):
        return level_of(status.store_schema,
                        healthy(store=StoreHealth("/s", None, version, ("ok",))))
    assert (at(3), at(4), at(5)) == (Level.WARNING, Level.OK, Level.BROKEN)


def test_integrity_problems_are_broken_and_the_first_is_named():
    rows = ("*** in database main ***", "Page 2: btreeInitPage() returns error code 11")
    (check,) = status.store_integrity(healthy(store=StoreHealth("/s", None, 4, rows)))
    assert check.level is Level.BROKEN and "2 problems" in check.line


@pytest.mark.parametrize("age, level", [
    (5, Level.OK), (3 * 60 + 30, Level.OK), (3 * 60 + 31, Level.WARNING),
    (10 * 60 + 30, Level.WARNING), (10 * 60 + 31, Level.BROKEN)])
def test_the_last_successful_cycle_against_the_interval(age, level):
    facts = healthy(cycle=CycleRecord(1, NOW - 1, NOW - age))
    assert level_of(status.last_cycle, facts) is level


def test_no_record_no_success_or_an_unreadable_record():
    assert level_of(status.last_cycle, healthy(cycle=None)) is Level.BROKEN
    (check,) = status.last_cycle(healthy(cycle=CycleRecord(1, NOW, None, "libvirt x")))
    assert check.level is Level.BROKEN and "libvirt x" in check.line
    assert level_of(status.last_cycle, healthy(cycle=Unknown("garbage"))) is Level.WARNING


def test_what_the_agents_cycles_see_down_is_a_warning_with_its_count():
    down = DependencyState(Dependency.PLACEMENT, Health.DOWN, PLACEMENT,
                           "answered 503 to GET /", failures=7, total_failures=9)
    up = DependencyState(Dependency.LIBVIRT, Health.UP)
    facts = healthy(cycle=CycleRecord(1, NOW, NOW - 5, "", {
        Dependency.PLACEMENT: down, Dependency.LIBVIRT: up}))
    (check,) = status.agent_sees_down(facts)
    assert check.level is Level.WARNING
    assert check.line == (f"the agent's cycles: Placement at {PLACEMENT} answered 503 "
                          "to GET / (7 failed cycles)")


def test_unhealed_and_audit_findings_are_warnings_and_unknown_is_never_ok():
    assert level_of(status.unhealed, healthy(unhealed=("VGPU", "PMEM"))) is Level.WARNING
    assert level_of(status.unhealed, healthy(unhealed=Unknown("x"))) is Level.WARNING
    assert level_of(status.audit, healthy(audit=("orphan x: y",))) is Level.WARNING
    (check,) = status.audit(healthy(audit=Unknown("Placement's allocations: down")))
    assert check.level is Level.WARNING and check.line.startswith("audit: unknown (")


def test_a_device_out_of_scheduling_is_a_warning_naming_it_and_unknown_is_never_ok():
    from compute_agent.health.rules import DeviceFault, UnhealthyProvider
    assert level_of(status.device_health, healthy()) is Level.OK
    bad = UnhealthyProvider("h_0000:81:00.0", frozenset({DeviceFault.AER_NONFATAL}),
                            (("CUSTOM_PCI_8086_154C", 1, 4),))
    (check,) = status.device_health(healthy(device_health=(bad,)))
    assert check.level is Level.WARNING
    assert check.line == ("h_0000:81:00.0: unhealthy (aer_nonfatal); "
                          "CUSTOM_PCI_8086_154C 1 of 4 reserved")
    assert judge(healthy(device_health=(bad,))).as_dict()["unhealthy_devices"] == [
        bad.to_json()]
    assert level_of(status.device_health,
                    healthy(device_health=Unknown("Placement at x did not answer"))
                    ) is Level.WARNING
