"""Pure device choice, the allocation and spec checks, and a property test
that no held device is ever chosen."""
import copy
import uuid
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from compute_agent.claims.choice import (
    MAX_AMOUNT,
    Choice,
    HeldDevices,
    InstanceSpec,
    Pool,
    Slot,
    Taken,
    Wanted,
    carried,
    check_spec_carried,
    choose,
    parse_allocations,
)
from compute_agent.drivers.base import DeviceKind
from compute_agent.exception import ClaimFailed, InvalidRequest

NUMA0 = "00000000-0000-4000-8000-00000000000a"
NUMA1 = "00000000-0000-4000-8000-00000000000b"
PF = "00000000-0000-4000-8000-0000000000f0"
GPU = "00000000-0000-4000-8000-0000000000e0"
MIXED = "00000000-0000-4000-8000-0000000000c0"
NOT_OURS = "99999999-0000-4000-8000-000000000000"

MDEV1 = "11111111-0000-4000-8000-000000000001"
MDEV2 = "11111111-0000-4000-8000-000000000002"


KIND_OF = {"CUSTOM_NIC": DeviceKind.PCI, "VGPU": DeviceKind.MDEV,
           "SRIOV_NET_VF": DeviceKind.VF, "PCPU": DeviceKind.PCPU}


def held_by(pools: dict[tuple[str, str], set[str]]) -> HeldDevices:
    """Devices held, given per (provider, class) as the tracker takes them."""
    held = HeldDevices()
    held.take([Choice(provider, rc, KIND_OF[rc], device)
               for (provider, rc), devices in pools.items() for device in devices])
    return held


def vf_slots(n, numa=0, bus="81"):
    return tuple(Slot(f"0000:{bus}:1{i // 8}.{i % 8}", numa) for i in range(n))


def pools(vf_count=4, gpu_capacity=4, mdevs=(MDEV1, MDEV2)) -> dict:
    return {
        NUMA0: {"VCPU": Pool("h_numa_0", "VCPU", DeviceKind.NUMA, 8, numa_node=0),
                "MEMORY_MB": Pool("h_numa_0", "MEMORY_MB", DeviceKind.NUMA, 4096,
                                  numa_node=0),
                "PCPU": Pool("h_numa_0", "PCPU", DeviceKind.PCPU, 2,
                             (Slot("2", 0), Slot("3", 0)), 0)},
        NUMA1: {"VCPU": Pool("h_numa_1", "VCPU", DeviceKind.NUMA, 8, numa_node=1)},
        PF: {"SRIOV_NET_VF": Pool("h_PF", "SRIOV_NET_VF", DeviceKind.VF, vf_count,
                                  vf_slots(vf_count), 0)},
        GPU: {"VGPU": Pool("h_gpu", "VGPU", DeviceKind.MDEV, gpu_capacity,
                           tuple(Slot(m, 1) for m in mdevs), 1,
                           mdev_parent="0000:84:00.0", mdev_type="nvidia-35")},
        # A pool whose devices sit on different cells (a no-NUMA-affinity
        # parent): where the preference decides.
        MIXED: {"CUSTOM_NIC": Pool("h_mixed", "CUSTOM_NIC", DeviceKind.VF, 4,
                                   (Slot("0000:90:00.0", 0), Slot("0000:90:00.1", 1),
                                    Slot("0000:90:00.2", 0), Slot("0000:90:00.3", 1)),
                                   None)},
    }


def ids(choices):
    return [c.device_id for c in choices]


def live(held: HeldDevices) -> dict:
    return {k: set(v) for k, v in held.by_pool.items() if v}


# --- choice ---------------------------------------------------------------------------

def test_numa_local_devices_first():
    p = pools()
    want = [Wanted(MIXED, "CUSTOM_NIC", 2)]
    assert ids(choose(want, p, Taken(), prefer_numa=1)) == [
        "0000:90:00.1", "0000:90:00.3"]
    assert ids(choose(want, p, Taken(), prefer_numa=0)) == [
        "0000:90:00.0", "0000:90:00.2"]
    # Local ones taken: the rest, in a stable order.
    held = held_by({(MIXED, "CUSTOM_NIC"): {"0000:90:00.1"}})
    assert ids(choose([Wanted(MIXED, "CUSTOM_NIC", 3)], p, Taken(held), prefer_numa=1)) == [
        "0000:90:00.3", "0000:90:00.0", "0000:90:00.2"]


def test_numa_preference_defaults_to_the_cell_in_the_allocation():
    p = pools()
    got = choose([Wanted(MIXED, "CUSTOM_NIC", 1), Wanted(NUMA1, "VCPU", 2)],
                 p, Taken())
    assert ids(got) == ["0000:90:00.1", "1"]
    got = choose([Wanted(MIXED, "CUSTOM_NIC", 1), Wanted(NUMA0, "VCPU", 2)],
                 p, Taken())
    assert ids(got) == ["0000:90:00.0", "0"]


def test_numa_preference_follows_the_instances_cell_not_another_device():
    """The instance's CPUs come from cell 0; a GPU it also got sits on
    cell 1. The NIC from the mixed pool should be local to the instance's
    cell (where its vCPUs and memory are), not to the GPU's."""
    # Provider UUIDs are uuid5 of names: their order is arbitrary. Here
    # the GPU's sorts before the cell's; in pools() it sorts after.
    for gpu in (GPU, "00000000-0000-4000-8000-000000000001"):
        p = pools()
        p[gpu] = p.pop(GPU)
        wanted = parse_allocations(
            {NUMA0: {"resources": {"VCPU": 2, "MEMORY_MB": 512}},
             gpu: {"resources": {"VGPU": 1}},
             MIXED: {"resources": {"CUSTOM_NIC": 1}}}, p)
        got = choose(wanted, p, Taken())
        nic = next(c for c in got if c.resource_class == "CUSTOM_NIC")
        assert nic.detail.numa_node == 0, (
            f"GPU provider {gpu}: NIC {nic.device_id} on cell {nic.detail.numa_node}, "
            "instance on cell 0")


def test_existing_unassigned_mdev_before_creating_one():
    p = pools(gpu_capacity=4)
    held = held_by({(GPU, "VGPU"): {MDEV1}})
    got = choose([Wanted(GPU, "VGPU", 1)], p, Taken(held))
    assert ids(got) == [MDEV2]
    assert (got[0].detail.mdev_parent, got[0].detail.mdev_type) == ("0000:84:00.0", "nvidia-35")
    got = choose([Wanted(GPU, "VGPU", 2)], p, Taken(held))
    assert ids(got)[0] == MDEV2
    created = got[1]
    assert created.device_id not in (MDEV1, MDEV2)
    assert str(uuid.UUID(created.device_id)) == created.device_id
    assert (created.detail.mdev_parent, created.detail.mdev_type, created.detail.numa_node) == (
        "0000:84:00.0", "nvidia-35", 1)
    # Nothing free at all: every one is new, and they differ.
    got = choose([Wanted(GPU, "VGPU", 2)], p,
                 Taken(held_by({(GPU, "VGPU"): {MDEV1, MDEV2}})))
    assert len(set(ids(got))) == 2 and not set(ids(got)) & {MDEV1, MDEV2}


def test_unhealthy_devices_are_never_chosen():
    p = pools()
    vfs = [s.device_id for s in p[PF]["SRIOV_NET_VF"].slots]
    p[PF]["SRIOV_NET_VF"] = replace(p[PF]["SRIOV_NET_VF"], unhealthy=frozenset(vfs[:3]))
    assert ids(choose([Wanted(PF, "SRIOV_NET_VF", 1)], p, Taken())) == [vfs[3]]
    with pytest.raises(ClaimFailed):
        choose([Wanted(PF, "SRIOV_NET_VF", 2)], p, Taken())


def test_an_unhealthy_gpu_gives_no_mdev_old_or_new():
    p = pools(gpu_capacity=4)
    pool = p[GPU]["VGPU"]
    p[GPU]["VGPU"] = replace(pool, unhealthy=frozenset({pool.mdev_parent, MDEV1, MDEV2}))
    with pytest.raises(ClaimFailed):
        choose([Wanted(GPU, "VGPU", 1)], p, Taken())


def test_mdev_creation_is_bounded_by_capacity():
    p = pools(gpu_capacity=3)
    created = "22222222-0000-4000-8000-000000000001"
    held = held_by({(GPU, "VGPU"): {MDEV1, created}})
    assert ids(choose([Wanted(GPU, "VGPU", 1)], p, Taken(held))) == [MDEV2]
    with pytest.raises(ClaimFailed):
        choose([Wanted(GPU, "VGPU", 2)], p, Taken(held))
    full = held_by({(GPU, "VGPU"): {MDEV1, MDEV2, created}})
    with pytest.raises(ClaimFailed):
        choose([Wanted(GPU, "VGPU", 1)], p, Taken(full))
    # Exactly the capacity from empty: two existing plus one new.
    got = choose([Wanted(GPU, "VGPU", 3)], p, Taken())
    assert ids(got)[:2] == [MDEV1, MDEV2] and len(set(ids(got))) == 3
    with pytest.raises(ClaimFailed):
        choose([Wanted(GPU, "VGPU", 4)], p, Taken())


def test_only_mdevs_are_created():
    p = pools(vf_count=2)
    held = held_by({(PF, "SRIOV_NET_VF"): {"0000:81:10.0"}})
    assert ids(choose([Wanted(PF, "SRIOV_NET_VF", 1)], p, Taken(held))) == ["0000:81:10.1"]
    with pytest.raises(ClaimFailed):
        choose([Wanted(PF, "SRIOV_NET_VF", 2)], p, Taken(held))
    with pytest.raises(ClaimFailed):
        choose([Wanted(NUMA0, "PCPU", 1)], p,
               Taken(held_by({(NUMA0, "PCPU"): {"2", "3"}})))


def test_never_a_held_device_even_within_one_request():
    p = pools(vf_count=4)
    held = held_by({(PF, "SRIOV_NET_VF"): {"0000:81:10.0", "0000:81:10.2"}})
    got = choose([Wanted(PF, "SRIOV_NET_VF", 1), Wanted(PF, "SRIOV_NET_VF", 1)], p, Taken(held))
    assert sorted(ids(got)) == ["0000:81:10.1", "0000:81:10.3"]


def test_counted_pools_hand_out_the_cell_not_a_device():
    p = pools()
    got = choose([Wanted(NUMA0, "MEMORY_MB", 1024), Wanted(NUMA0, "VCPU", 4)], p,
                 Taken())
    assert [(c.kind, c.device_id, c.amount, c.detail.numa_node) for c in got] == [
        (DeviceKind.NUMA, "0", 1024, 0), (DeviceKind.NUMA, "0", 4, 0)]
    held = HeldDevices()
    held.take(got)
    assert live(held) == {}


def test_claim_failed_names_provider_and_class_and_leaves_held_alone():
    p = pools(vf_count=2)
    held = held_by({(PF, "SRIOV_NET_VF"): {"0000:81:10.0"},
                        (GPU, "VGPU"): {MDEV1}})
    before = copy.deepcopy(live(held))
    # The first wanted can be met, the second cannot.
    with pytest.raises(ClaimFailed) as e:
        choose([Wanted(GPU, "VGPU", 1), Wanted(PF, "SRIOV_NET_VF", 2)], p, Taken(held))
    assert e.value.provider_uuid == PF
    assert e.value.resource_class == "SRIOV_NET_VF"
    assert PF in str(e.value) and "SRIOV_NET_VF" in str(e.value)
    assert live(held) == before


def test_take_and_give_back():
    p = pools()
    held = HeldDevices()
    got = choose([Wanted(PF, "SRIOV_NET_VF", 2), Wanted(NUMA0, "VCPU", 1)], p, Taken(held))
    held.take(got)
    assert live(held) == {(PF, "SRIOV_NET_VF"): {"0000:81:10.0", "0000:81:10.1"}}
    nxt = choose([Wanted(PF, "SRIOV_NET_VF", 1)], p, Taken(held))
    assert ids(nxt) == ["0000:81:10.2"]
    held.give_back(got[:1])
    assert live(held) == {(PF, "SRIOV_NET_VF"): {"0000:81:10.1"}}
    held.give_back(got[:1])  # twice is harmless
    assert ids(choose([Wanted(PF, "SRIOV_NET_VF", 1)], p, Taken(held))) == ["0000:81:10.0"]


# --- parse_allocations --------------------------------------------------------------------

def refused(allocations, p=None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        parse_allocations(allocations, p or pools())
    return e.value


def test_valid_allocations_parse_in_a_stable_order():
    got = parse_allocations({PF: {"resources": {"SRIOV_NET_VF": 2}},
                             NUMA0: {"resources": {"VCPU": 2, "MEMORY_MB": 512}},
                             GPU: {"resources": {"VGPU": 1}, "generation": 3}},
                            pools())
    assert got == [Wanted(NUMA0, "MEMORY_MB", 512), Wanted(NUMA0, "VCPU", 2),
                   Wanted(GPU, "VGPU", 1), Wanted(PF, "SRIOV_NET_VF", 2)]


@pytest.mark.parametrize("value", [None, [], "x", 3, [[PF, {}]]])
def test_allocations_must_be_an_object(value):
    e = refused(value)
    assert e.field == "allocations"
    assert repr(value) in str(e)


def test_allocations_must_not_be_empty():
    e = refused({})
    assert e.field == "allocations" and "{}" in str(e)


def test_unknown_provider():
    e = refused({NOT_OURS: {"resources": {"VCPU": 1}}})
    assert e.field == f"allocations.{NOT_OURS}"
    assert NOT_OURS in str(e)


@pytest.mark.parametrize("body", [{}, {"resources": {}}, {"resources": None},
                                  {"resources": [1]}, "VCPU", None, {"generation": 1}])
def test_missing_or_empty_resources(body):
    e = refused({NUMA0: body})
    assert e.field == f"allocations.{NUMA0}.resources"
    resources = body.get("resources") if isinstance(body, dict) else None
    assert f"(value: {resources!r})" in str(e)


@pytest.mark.parametrize("rc", ["FOO", "vcpu", ""])
def test_unknown_resource_class(rc):
    e = refused({NUMA0: {"resources": {rc: 1}}})
    assert e.field in (f"allocations.{NUMA0}.resources",
                       f"allocations.{NUMA0}.resources.{rc}")
    assert repr(rc) in str(e) and "unknown resource class" in str(e)


@pytest.mark.parametrize("rc", ["CUSTOM_", "CUSTOM_lower", "CUSTOM_A-B"])
def test_malformed_custom_class_is_refused_naming_it(rc):
    """os_resource_classes.is_custom only checks the prefix, so these pass as
    "known" and are refused because no provider has them: still refused,
    still named."""
    e = refused({NUMA0: {"resources": {rc: 1}}})
    assert e.field.startswith(f"allocations.{NUMA0}.resources")
    assert repr(rc) in str(e)


def test_class_the_provider_lacks():
    e = refused({NUMA1: {"resources": {"MEMORY_MB": 512}}})
    assert e.field == f"allocations.{NUMA1}.resources.MEMORY_MB"
    assert "'MEMORY_MB'" in str(e)
    e = refused({PF: {"resources": {"CUSTOM_NIC": 1}}})
    assert e.field == f"allocations.{PF}.resources.CUSTOM_NIC"


@pytest.mark.parametrize("amount", [0, -1, -(1 << 40), True, False, 1.0, 2.5, "1",
                                    None, [1], MAX_AMOUNT + 1, 10 ** 30,
                                    float("inf"), float("nan")])
def test_bad_amounts(amount):
    e = refused({NUMA0: {"resources": {"VCPU": 1, "MEMORY_MB": amount}}})
    assert e.field == f"allocations.{NUMA0}.resources.MEMORY_MB"
    assert f"(value: {amount!r})" in str(e)


def test_amount_over_capacity():
    e = refused({PF: {"resources": {"SRIOV_NET_VF": 5}}}, pools(vf_count=4))
    assert e.field == f"allocations.{PF}.resources.SRIOV_NET_VF"
    assert "(value: 5)" in str(e) and "4" in e.reason
    # The capacity itself is fine.
    assert parse_allocations({PF: {"resources": {"SRIOV_NET_VF": 4}}},
                             pools(vf_count=4)) == [Wanted(PF, "SRIOV_NET_VF", 4)]


def test_field_name_prefix_is_used():
    with pytest.raises(InvalidRequest) as e:
        parse_allocations({NUMA0: {"resources": {"VCPU": 0}}}, pools(),
                          field_name="payload.allocations")
    assert e.value.field == f"payload.allocations.{NUMA0}.resources.VCPU"


# --- InstanceSpec -------------------------------------------------------------------------

GOOD = {"name": "vm-1", "vcpus": 2, "memory_mb": 2048}


def spec_refused(payload) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        InstanceSpec.from_payload(payload)
    return e.value


def test_good_spec_round_trips():
    s = InstanceSpec.from_payload(dict(GOOD, extra="ignored"))
    assert s == InstanceSpec("vm-1", 2, 2048)
    assert InstanceSpec.from_payload(s.to_payload()) == s
    edge = {"name": "x" * 255, "vcpus": 4096, "memory_mb": 1 << 24}
    assert InstanceSpec.from_payload(edge).to_payload() == edge


@pytest.mark.parametrize("payload", [None, [], "vm", 1])
def test_spec_must_be_an_object(payload):
    assert spec_refused(payload).field == "spec"


@pytest.mark.parametrize("name", ["<missing>", "", "x" * 256, "a\nb", "tab\there",
                                  "nul\x00", "\u200b", None, 12, ["vm"], b"vm"])
def test_bad_names(name):
    payload = dict(GOOD)
    if name == "<missing>":
        del payload["name"]
        name = None
    else:
        payload["name"] = name
    e = spec_refused(payload)
    assert e.field == "spec.name"
    assert f"(value: {name!r}"[:60] in str(e)


@pytest.mark.parametrize("key,limit", [("vcpus", 4096), ("memory_mb", 1 << 24)])
@pytest.mark.parametrize("value", ["<missing>", 0, -1, True, False, 1.0, "2", None,
                                   "<limit+1>", 10 ** 20])
def test_bad_counts(key, limit, value):
    payload = dict(GOOD)
    if value == "<missing>":
        del payload[key]
        value = None
    else:
        if value == "<limit+1>":
            value = limit + 1
        payload[key] = value
    e = spec_refused(payload)
    assert e.field == f"spec.{key}"
    assert f"(value: {value!r})" in str(e)


# --- property: no held device is ever chosen ----------------------------------------------

POOL_KINDS = st.sampled_from(list(DeviceKind))


@st.composite
def random_pools(draw):
    out = {}
    for p in range(draw(st.integers(1, 4))):
        provider = str(uuid.UUID(int=p + 1))
        for r in range(draw(st.integers(1, 2))):
            kind = draw(POOL_KINDS)
            rc = f"CUSTOM_R{r}"
            n_slots = draw(st.integers(0 if kind is DeviceKind.MDEV else 1, 6))
            slots = tuple(Slot(f"{provider[-2:]}-{rc}-{i}", draw(st.sampled_from([None, 0, 1])))
                          for i in range(n_slots))
            if kind.counted:
                slots, capacity = (), draw(st.integers(1, 64))
            elif kind is DeviceKind.MDEV:
                capacity = n_slots + draw(st.integers(0, 4))
            else:
                capacity = n_slots
            out.setdefault(provider, {})[rc] = Pool(
                f"p{p}", rc, kind, capacity, slots, draw(st.sampled_from([None, 0, 1])),
                "0000:84:00.0" if kind is DeviceKind.MDEV else None,
                "t" if kind is DeviceKind.MDEV else None)
    return out


class NoHeldDeviceChosen(RuleBasedStateMachine):
    """Random pools, random claims and releases; a shadow of what is held."""

    @initialize(p=random_pools())
    def setup(self, p):
        self.pools = p
        self.held = HeldDevices()
        self.claims: list[list[Choice]] = []
        self.keys = sorted((prov, rc) for prov, rcs in p.items() for rc in rcs)

    def shadow(self) -> dict:
        out = {}
        for claim in self.claims:
            for c in claim:
                if not c.kind.counted:
                    out.setdefault((c.provider_uuid, c.resource_class), []).append(
                        c.device_id)
        return out

    def free(self, key) -> int:
        pool = self.pools[key[0]][key[1]]
        held = set(self.shadow().get(key, ()))
        if pool.kind.counted:
            return 1 << 30
        if pool.kind is DeviceKind.MDEV:
            return pool.capacity - len(held)
        return len([s for s in pool.slots if s.device_id not in held])

    @rule(data=st.data(), prefer=st.sampled_from([None, 0, 1]))
    def claim(self, data, prefer):
        picks = data.draw(st.lists(st.sampled_from(self.keys), min_size=1, max_size=3))
        wanted = [Wanted(k[0], k[1], data.draw(st.integers(1, 3))) for k in picks]
        before = copy.deepcopy(live(self.held))
        need: dict = {}
        for w in wanted:
            need[(w.provider_uuid, w.resource_class)] = need.get(
                (w.provider_uuid, w.resource_class), 0) + w.amount
        fits = all(amount <= self.free(k) for k, amount in need.items())
        try:
            got = choose(wanted, self.pools, Taken(self.held), prefer)
        except ClaimFailed as e:
            assert not fits, f"refused though it fits: {need}"
            assert (e.provider_uuid, e.resource_class) in need
            assert live(self.held) == before
            return
        assert fits, f"granted beyond what is free: {need}"
        assert live(self.held) == before  # choose itself changes nothing
        for c in got:
            if c.kind.counted:
                continue
            assert c.device_id not in before.get((c.provider_uuid, c.resource_class),
                                                 ()), f"{c.device_id} is held"
            pool = self.pools[c.provider_uuid][c.resource_class]
            if pool.kind is not DeviceKind.MDEV:
                assert c.device_id in {s.device_id for s in pool.slots}
        exclusive = [(c.provider_uuid, c.resource_class, c.device_id) for c in got
                     if not c.kind.counted]
        assert len(exclusive) == len(set(exclusive)), "one device twice in one claim"
        self.held.take(got)
        self.claims.append(got)

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def give_back(self, data):
        i = data.draw(st.integers(0, len(self.claims) - 1))
        self.held.give_back(self.claims.pop(i))

    @invariant()
    def held_matches_the_shadow(self):
        if not hasattr(self, "held"):
            return
        shadow = self.shadow()
        for key, devices in shadow.items():
            assert len(devices) == len(set(devices)), f"{key}: held twice"
        assert live(self.held) == {k: set(v) for k, v in shadow.items() if v}
        for (prov, rc), devices in shadow.items():
            pool = self.pools[prov][rc]
            if pool.kind is DeviceKind.MDEV:
                existing = set(devices) | {s.device_id for s in pool.slots}
                assert len(existing) <= pool.capacity, "more mdevs than capacity"


TestNoHeldDeviceChosen = NoHeldDeviceChosen.TestCase
TestNoHeldDeviceChosen.settings = settings(max_examples=200, stateful_step_count=40,
                                           deadline=None)


@settings(max_examples=300, deadline=None)
@given(p=random_pools(), data=st.data())
def test_a_failed_choice_never_changes_held(p, data):
    keys = sorted((prov, rc) for prov, rcs in p.items() for rc in rcs)
    held = HeldDevices()
    for prov, rc in keys:
        pool = p[prov][rc]
        if pool.exclusive and pool.slots:
            held.take([Choice(prov, rc, pool.kind, device) for device in data.draw(
                st.sets(st.sampled_from([s.device_id for s in pool.slots])))])
    before = copy.deepcopy(live(held))
    wanted = [Wanted(k[0], k[1], data.draw(st.integers(1, 8)))
              for k in data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4))]
    try:
        got = choose(wanted, p, Taken(held))
    except ClaimFailed:
        got = []
    assert live(held) == before
    for c in got:
        assert c.device_id not in before.get((c.provider_uuid, c.resource_class), ())


# --- a spec against its allocations -------------------------------------------

ROOT, CELL0, CELL1, PF = "root", "cell0", "cell1", "pf"


@pytest.mark.parametrize("mode, resources", [
    # Flat: the root has the CPUs and memory.
    ("flat", [{"VCPU": 3, "MEMORY_MB": 2048, "DISK_GB": 10}, {"SRIOV_NET_VF": 1}]),
    # NUMA: each cell has its own; an instance over two cells sums them.
    ("numa", [{"VCPU": 1, "PCPU": 1, "MEMORY_MB": 1024}, {"PCPU": 1, "MEMORY_MB": 1024},
              {"DISK_GB": 10}]),
    # Mixed: shared CPUs on the root, dedicated ones and memory on a cell.
    ("mixed", [{"VCPU": 2, "DISK_GB": 10}, {"PCPU": 1, "MEMORY_MB": 2048}]),
])
def test_a_spec_asks_the_cpus_and_memory_its_allocations_carry_in_every_tree_mode(
        mode, resources):
    assert carried(resources) == (3, 2048), mode
    check_spec_carried(InstanceSpec("vm", 3, 2048), resources)


def test_a_spec_unlike_its_allocations_is_one_line_naming_the_fields_and_values():
    resources = [{"VCPU": 3, "MEMORY_MB": 8000}]
    with pytest.raises(InvalidRequest) as caught:
        check_spec_carried(InstanceSpec("vm", 1, 8000), resources)
    assert str(caught.value) == ("spec.vcpus: must equal what the allocations carry on "
                                 "this host's providers: VCPU plus PCPU 3 (value: 1)")
    with pytest.raises(InvalidRequest) as caught:
        check_spec_carried(InstanceSpec("vm", 1, 256), resources)
    assert str(caught.value) == (
        "spec.vcpus, spec.memory_mb: must equal what the allocations carry on this "
        "host's providers: VCPU plus PCPU 3, MEMORY_MB 8000 (value: 1, 256)")
    # Devices alone carry no CPU: a spec always asks for some.
    with pytest.raises(InvalidRequest, match="^spec.vcpus, spec.memory_mb: "):
        check_spec_carried(InstanceSpec("vm", 1, 256), [{"SRIOV_NET_VF": 1}])
