"""The destination's answer to a live migration's pre-check: its JSON form,
read strictly, and how a source's devices are paired with it."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compute_agent.drivers.base import (
    DeviceDetail,
    DeviceKind,
    GuestDevice,
    GuestSpec,
    HostResource,
    HostResourceKind,
)
from compute_agent.drivers.errors import InvalidMigrationTarget
from compute_agent.drivers.migration import (
    ClaimedDevice,
    DeviceMove,
    LiveMigrationTarget,
    moved_guest,
    pair_devices,
)

INSTANCE = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01"
MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"

_details = st.builds(DeviceDetail, st.none() | st.integers(0, 7),
                     st.none() | st.integers(1, 1 << 40), st.none() | st.text(min_size=1, max_size=10),
                     st.none() | st.just("0000:07:00.0"), st.none() | st.just("nvidia-35"))
_names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
                 max_size=12)


@st.composite
def devices(draw):
    kind = draw(st.sampled_from(DeviceKind))
    cpus = (draw(st.frozensets(st.integers(0, 1023), min_size=1, max_size=4))
            if kind is DeviceKind.PCPU else frozenset())
    return GuestDevice(draw(_names), kind, draw(_names), draw(st.integers(1, 1 << 20)),
                       cpus, draw(_details))


@given(st.lists(st.tuples(devices(), devices()), max_size=6,
                unique_by=lambda pair: pair[0].assignment_id))
def test_round_trip_through_json(pairs):
    target = LiveMigrationTarget(INSTANCE, tuple(DeviceMove(s, d) for s, d in pairs))
    wire = json.loads(json.dumps(target.to_dict()))
    assert LiveMigrationTarget.from_dict(wire) == target


def good() -> dict:
    vf = GuestDevice("a-vf", DeviceKind.VF, "0000:81:10.1")
    cpu = GuestDevice("a-cpu", DeviceKind.PCPU, "3", cpus=frozenset({3}))
    mdev = GuestDevice("a-mdev", DeviceKind.MDEV, MDEV,
                       detail=DeviceDetail(0, mdev_parent="0000:07:00.0",
                                           mdev_type="nvidia-35"))
    return LiveMigrationTarget(INSTANCE, (DeviceMove(vf, vf), DeviceMove(cpu, cpu),
                                          DeviceMove(mdev, mdev))).to_dict()


def changed(path: str, value) -> dict:
    """good() with the value at ``path`` ("moves.0.source.kind") replaced,
    or removed when ``value`` is ``...``."""
    body = good()
    *parents, last = path.split(".")
    where = body
    for p in parents:
        where = where[int(p) if p.isdigit() else p]
    if value is ...:
        del where[last]
    else:
        where[last] = value
    return body


@pytest.mark.parametrize("body,message", [
    ([], "target: []: must be an object"),
    (changed("instance_uuid", "nope"), "target.instance_uuid: 'nope': must be a UUID"),
    (changed("instance_uuid", INSTANCE.upper()), "target.instance_uuid: '0F6F"),
    (changed("moves", {}), "target.moves: {}: must be a list"),
    (changed("extra", 1), "target.extra: 1: unknown key"),
    (changed("moves.0.source", ...), "target.moves[0].source: None: missing"),
    (changed("moves.0.source.kind", "gpu"), "target.moves[0].source.kind: 'gpu': not one"),
    (changed("moves.1.destination.amount", True),
     "target.moves[1].destination.amount: True: must be a whole number"),
    (changed("moves.1.destination.amount", 0), ".amount: 0: must be a whole number"),
    (changed("moves.1.destination.cpus", [3, "4"]), ".cpus: [3, '4']: must be a list"),
    (changed("moves.1.destination.cpus", [3, 3]), ".cpus: [3, 3]: names a CPU twice"),
    (changed("moves.1.destination.cpus", []), "moves[1].destination.cpus: []: pinned"),
    (changed("moves.0.destination.cpus", [1]), "moves[0].destination.cpus: [1]: pinned"),
    (changed("moves.0.destination.device_id", " 0000:81:10.1"),
     "moves[0].destination.device_id: ' 0000:81:10.1': must be non-empty"),
    (changed("moves.0.source.assignment_id", ""), "moves[0].source.assignment_id: ''"),
    (changed("moves.2.source.detail.numa_node", "0"),
     "moves[2].source.detail: {'numa_node': '0'"),
    (changed("moves.2.source.detail.colour", "red"), "not a field of a device's detail"),
    (changed("moves.1.source.assignment_id", "a-vf"),
     "target.moves[1].source.assignment_id: 'a-vf': moved twice"),
])
def test_bad_input_is_named(body, message):
    with pytest.raises(InvalidMigrationTarget) as e:
        LiveMigrationTarget.from_dict(body)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def claimed(rc: str, assignment_id: str, kind: DeviceKind, device_id: str,
            amount: int = 1) -> ClaimedDevice:
    cpus = frozenset({int(device_id)}) if kind is DeviceKind.PCPU else frozenset()
    return ClaimedDevice(rc, GuestDevice(assignment_id, kind, device_id, amount, cpus))


def test_pairing_by_class_and_kind_in_device_order():
    source = [claimed("CUSTOM_PHYSNET_A", "s-a", DeviceKind.VF, "0000:81:10.1"),
              claimed("CUSTOM_PHYSNET_B", "s-b", DeviceKind.VF, "0000:81:10.0"),
              claimed("PCPU", "s-10", DeviceKind.PCPU, "10"),
              claimed("PCPU", "s-9", DeviceKind.PCPU, "9"),
              claimed("MEMORY_MB", "s-mem", DeviceKind.NUMA, "1", 512)]
    destination = [claimed("PCPU", "d-2", DeviceKind.PCPU, "2"),
                   claimed("CUSTOM_PHYSNET_B", "d-b", DeviceKind.VF, "0000:3b:02.0"),
                   claimed("MEMORY_MB", "d-mem", DeviceKind.NUMA, "0", 512),
                   claimed("PCPU", "d-11", DeviceKind.PCPU, "11"),
                   claimed("CUSTOM_PHYSNET_A", "d-a", DeviceKind.VF, "0000:3b:02.1")]
    target = pair_devices(INSTANCE, source, destination)
    assert {(m.source.assignment_id, m.destination.assignment_id)
            for m in target.moves} == {("s-a", "d-a"), ("s-b", "d-b"), ("s-9", "d-2"),
                                       ("s-10", "d-11"), ("s-mem", "d-mem")}
    # JSON-friendly both ways, as the RPC carries it.
    assert ClaimedDevice.from_dict(json.loads(json.dumps(source[0].to_dict())),
                                   "devices[0]") == source[0]


@pytest.mark.parametrize("destination,message", [
    ([], "destination: 'PCPU pcpu': the source holds 1 of it, the destination claimed 0"),
    ([claimed("PCPU", "d", DeviceKind.PCPU, "2"), claimed("PCPU", "e", DeviceKind.PCPU, "3")],
     "the source holds 1 of it, the destination claimed 2"),
    ([claimed("VCPU", "d", DeviceKind.PCPU, "2")], "'PCPU pcpu': the source holds 1"),
])
def test_pairing_refused(destination, message):
    with pytest.raises(InvalidMigrationTarget) as e:
        pair_devices(INSTANCE, [claimed("PCPU", "s", DeviceKind.PCPU, "9")], destination)
    assert message in str(e.value)


def test_pairing_refuses_other_amounts():
    with pytest.raises(InvalidMigrationTarget, match="amount 256 for the source's 512"):
        pair_devices(INSTANCE, [claimed("MEMORY_MB", "s", DeviceKind.NUMA, "1", 512)],
                     [claimed("MEMORY_MB", "d", DeviceKind.NUMA, "0", 256)])


# --- the guest as it runs on the destination -------------------------------------

VF = GuestDevice("a-vf", DeviceKind.VF, "0000:81:10.1")
CPU = GuestDevice("a-cpu", DeviceKind.PCPU, "3", cpus=frozenset({3}))
NS = GuestDevice("a-ns", DeviceKind.PMEM, "ns0",
                 detail=DeviceDetail(0, 4 << 30, "/dev/dax0.0"))
GUEST = GuestSpec(INSTANCE, "web-1", 4, 2048, (VF, CPU, NS))
THERE = {"a-vf": GuestDevice("a-vf-2", DeviceKind.VF, "0000:3b:02.4"),
         "a-cpu": GuestDevice("a-cpu-2", DeviceKind.PCPU, "17", cpus=frozenset({17})),
         "a-ns": GuestDevice("a-ns-2", DeviceKind.PMEM, "ns1",
                             detail=DeviceDetail(1, 4 << 30, "/dev/dax1.0"))}


def moves_of(guest: GuestSpec) -> tuple[DeviceMove, ...]:
    """Each device of the guest to its place on the destination, in
    another order than the guest's."""
    return tuple(DeviceMove(d, THERE[d.assignment_id]) for d in reversed(guest.devices))


def test_the_moved_guest_has_each_device_replaced_in_its_own_order():
    moved = moved_guest(GUEST, LiveMigrationTarget(INSTANCE, moves_of(GUEST)))
    assert moved == GuestSpec(INSTANCE, "web-1", 4, 2048,
                              (THERE["a-vf"], THERE["a-cpu"], THERE["a-ns"]))


def test_the_identity_target_moves_the_guest_unchanged():
    assert moved_guest(GUEST, LiveMigrationTarget.identity(INSTANCE, GUEST.devices)) == GUEST


def test_a_target_for_another_guest_is_refused():
    other = "6a1d3c3e-0b4f-4d0e-9a57-2a6c1c0e7b10"
    with pytest.raises(InvalidMigrationTarget,
                       match=f"target.instance_uuid: '{other}': the guest is {INSTANCE}"):
        moved_guest(GUEST, LiveMigrationTarget(other, moves_of(GUEST)))


def test_a_target_that_leaves_a_device_of_the_guest_behind_is_refused():
    partial = LiveMigrationTarget(INSTANCE, tuple(
        m for m in moves_of(GUEST) if m.source.assignment_id != "a-vf"))
    with pytest.raises(InvalidMigrationTarget,
                       match=r"guest.devices\[0\]: 'a-vf': no move of the target replaces"):
        moved_guest(GUEST, partial)


def test_a_target_made_for_the_device_as_the_guest_held_it_before_is_refused():
    # The same assignment, since moved to another CPU on the source.
    before = GuestDevice("a-cpu", DeviceKind.PCPU, "5", cpus=frozenset({5}))
    stale = LiveMigrationTarget(INSTANCE, (DeviceMove(VF, THERE["a-vf"]),
                                           DeviceMove(before, THERE["a-cpu"]),
                                           DeviceMove(NS, THERE["a-ns"])))
    with pytest.raises(InvalidMigrationTarget, match=r"guest.devices\[1\]: 'a-cpu'"):
        moved_guest(GUEST, stale)


def test_a_target_moving_a_device_the_guest_does_not_hold_is_refused():
    gone = GuestDevice("a-mdev", DeviceKind.MDEV, MDEV)
    extra = LiveMigrationTarget(INSTANCE, (*moves_of(GUEST), DeviceMove(gone, gone)))
    with pytest.raises(InvalidMigrationTarget,
                       match="target.moves: 'a-mdev': moves a device the guest does not hold"):
        moved_guest(GUEST, extra)


def test_what_the_guest_holds_on_the_destination_is_its_destination_devices():
    target = LiveMigrationTarget(INSTANCE, moves_of(GUEST))
    assert target.destination_resources() == {
        HostResource(HostResourceKind.PCI_ADDRESS, "0000:3b:02.4"),
        HostResource(HostResourceKind.HOST_CPU, "17"),
        HostResource(HostResourceKind.BACKING_PATH, "/dev/dax1.0")}
    assert LiveMigrationTarget(INSTANCE).destination_resources() == frozenset()


def test_device_ids_pair_numbers_by_value_before_names():
    # Cell numbers as numbers ("10" after "9"); names after every number.
    source = [claimed("MEMORY_MB", f"s-{i}", DeviceKind.NUMA, i, 512)
              for i in ("10", "host", "9")]
    destination = [claimed("MEMORY_MB", f"d-{i}", DeviceKind.NUMA, i, 512)
                   for i in ("1", "0", "2")]
    target = pair_devices(INSTANCE, source, destination)
    assert [(m.source.device_id, m.destination.device_id) for m in target.moves] == [
        ("9", "0"), ("10", "1"), ("host", "2")]
