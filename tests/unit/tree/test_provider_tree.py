"""The pure provider-tree model and the diff that drives Placement."""
import dataclasses
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute_agent.tree.ownership import AGENT_RESERVED_CLASSES, agent_owns_trait
from compute_agent.tree.provider_tree import (
    CreateProvider,
    DeleteProvider,
    Provider,
    ProviderTree,
    SetAggregates,
    SetInventories,
    SetTraits,
    UpdateProvider,
    adopt_uuids,
    diff,
    inventory,
    normalized_inventories,
    provider_diff,
    reported_traits,
)

ROOT = "00000000-0000-4000-8000-000000000000"


def u(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


def tree(*providers: Provider) -> ProviderTree:
    return ProviderTree(providers)


def sample_tree() -> ProviderTree:
    return tree(
        Provider(ROOT, "host", inventories={"DISK_GB": inventory(100)}),
        Provider(u(1), "host_numa_0", ROOT,
                 {"VCPU": inventory(8, allocation_ratio=4.0)},
                 frozenset({"HW_NUMA_ROOT"})),
        Provider(u(2), "host_0000:3B:00.0", u(1),
                 {"SRIOV_NET_VF": inventory(8)},
                 frozenset({"COMPUTE_MANAGED_PCI_DEVICE"})),
    )


# --- building a tree from providers in any order ------------------------------

@given(st.permutations(range(3)))
def test_parents_first_takes_providers_in_any_order(order):
    providers = sample_tree().depth_first()
    rebuilt = ProviderTree.parents_first([providers[i] for i in order])
    assert rebuilt.depth_first() == providers


def test_parents_first_refuses_a_missing_parent_and_a_loop():
    with pytest.raises(ValueError, match="not in the tree"):
        ProviderTree.parents_first([Provider(u(1), "orphan", u(9))])
    with pytest.raises(ValueError):
        ProviderTree.parents_first([Provider(u(1), "a", u(2)), Provider(u(2), "b", u(1))])


# --- inventory records -------------------------------------------------------

def test_inventory_fills_placement_defaults():
    assert inventory(8) == {"total": 8, "reserved": 0, "min_unit": 1,
                            "max_unit": 8, "step_size": 1,
                            "allocation_ratio": 1.0}


def test_inventory_fields_override_defaults():
    rec = inventory(16, reserved=2, max_unit=4, allocation_ratio=2.0)
    assert (rec["reserved"], rec["max_unit"], rec["allocation_ratio"]) == (2, 4, 2.0)
    assert rec["min_unit"] == 1


def test_inventory_rejects_unknown_field():
    with pytest.raises(ValueError, match="bogus"):
        inventory(4, bogus=1)


def test_normalized_inventories_fill_defaults_and_float_ratios():
    assert normalized_inventories({"VCPU": {"total": 4, "allocation_ratio": 2}}) == {
        "VCPU": {"total": 4, "reserved": 0, "min_unit": 1, "max_unit": 4,
                 "step_size": 1, "allocation_ratio": 2.0}}
    assert isinstance(
        normalized_inventories({"VCPU": {"total": 4, "allocation_ratio": 2}})
        ["VCPU"]["allocation_ratio"], float)


def test_normalized_inventories_equal_for_sparse_and_full_records():
    assert (normalized_inventories({"PCPU": {"total": 3}})
            == normalized_inventories({"PCPU": inventory(3)}))


# --- the tree ----------------------------------------------------------------

def test_duplicate_uuid_is_refused():
    t = tree(Provider(ROOT, "host"))
    with pytest.raises(ValueError, match="duplicate"):
        t.add(Provider(ROOT, "other"))


def test_unknown_parent_is_refused():
    t = tree(Provider(ROOT, "host"))
    with pytest.raises(ValueError, match="not in the tree"):
        t.add(Provider(u(1), "child", parent_uuid=u(99)))


def test_root_and_lookup_by_name():
    t = sample_tree()
    assert t.root.uuid == ROOT
    assert t.by_name("host_numa_0").uuid == u(1)
    assert t.by_name("missing") is None
    assert u(2) in t and u(99) not in t
    assert len(t) == 3


def test_depth_first_puts_parents_before_children_in_name_order():
    t = tree(Provider(ROOT, "r"),
             Provider(u(1), "b", ROOT),
             Provider(u(2), "a", ROOT),
             Provider(u(3), "a1", u(2)))
    assert [p.name for p in t.depth_first()] == ["r", "a", "a1", "b"]


def test_copy_is_independent_of_the_original():
    t = sample_tree()
    c = t.copy()
    c.replace(dataclasses.replace(c.get(u(1)), name="renamed"))
    c.remove(u(2))
    assert t.get(u(1)).name == "host_numa_0"
    assert u(2) in t


# --- diff: plain cases -------------------------------------------------------

def test_unchanged_tree_diffs_to_nothing():
    assert diff(sample_tree(), sample_tree()) == []


def test_sparse_inventory_equal_to_defaults_is_not_a_change():
    current = tree(Provider(ROOT, "h", inventories={"VCPU": {"total": 4}}))
    desired = tree(Provider(ROOT, "h", inventories={"VCPU": inventory(4)}))
    assert diff(current, desired) == []


def test_diff_from_empty_creates_everything_parent_first():
    desired = sample_tree()
    ops = diff(ProviderTree(), desired)
    created = [op.provider.name for op in ops if isinstance(op, CreateProvider)]
    assert created == ["host", "host_numa_0", "host_0000:3B:00.0"]
    assert SetTraits(u(2), frozenset({"COMPUTE_MANAGED_PCI_DEVICE"})) in ops
    assert SetInventories(ROOT, {"DISK_GB": inventory(100)}) in ops


def test_new_provider_without_inventory_or_traits_is_only_created():
    p = Provider(u(1), "bare", None)
    assert provider_diff(None, p) == [CreateProvider(p)]


def test_new_provider_with_aggregates_sets_them():
    p = Provider(u(1), "agg", aggregates=frozenset({u(50)}))
    assert SetAggregates(u(1), frozenset({u(50)})) in provider_diff(None, p)


def test_rename_and_reparent_is_one_update():
    current = tree(Provider(ROOT, "h"), Provider(u(1), "a", ROOT),
                   Provider(u(2), "b", ROOT))
    desired = tree(Provider(ROOT, "h"), Provider(u(1), "a", ROOT),
                   Provider(u(2), "b2", u(1)))
    assert diff(current, desired) == [UpdateProvider(u(2), "b2", u(1))]


def test_changed_inventory_and_traits_are_set():
    current = sample_tree()
    desired = sample_tree()
    desired.get(u(2)).inventories = {"SRIOV_NET_VF": inventory(4)}
    desired.get(u(1)).traits = frozenset()
    assert diff(current, desired) == [
        SetTraits(u(1), frozenset()),
        SetInventories(u(2), {"SRIOV_NET_VF": inventory(4)})]


def test_unmanaged_aggregates_are_left_alone():
    current = tree(Provider(ROOT, "h", aggregates=frozenset({u(50)})))
    desired = tree(Provider(ROOT, "h", aggregates=None))
    assert diff(current, desired) == []


def test_managed_aggregates_are_set_when_they_differ():
    current = tree(Provider(ROOT, "h", aggregates=frozenset({u(50)})))
    desired = tree(Provider(ROOT, "h", aggregates=frozenset()))
    assert diff(current, desired) == [SetAggregates(ROOT, frozenset())]


def test_removed_subtree_is_deleted_leaf_first():
    current = sample_tree()
    desired = tree(Provider(ROOT, "host",
                            inventories={"DISK_GB": inventory(100)}))
    assert diff(current, desired) == [
        DeleteProvider(u(2), "host_0000:3B:00.0"),
        DeleteProvider(u(1), "host_numa_0")]


def test_provider_not_owned_is_never_deleted():
    current = tree(Provider(ROOT, "host"),
                   Provider(u(1), "host:ovs-agent", ROOT),
                   Provider(u(2), "host_numa_0", ROOT))
    desired = tree(Provider(ROOT, "host"))
    ops = diff(current, desired,
               owned=lambda p: p.name == "host" or p.name.startswith("host_"))
    assert ops == [DeleteProvider(u(2), "host_numa_0")]


def test_adopt_keeps_the_uuid_of_a_provider_already_in_the_tree():
    current = tree(Provider(ROOT, "host"), Provider(u(1), "host_numa_0", ROOT),
                   Provider(u(2), "host_gpu", u(1)))
    desired = tree(Provider(ROOT, "host"), Provider(u(10), "host_numa_0", ROOT),
                   Provider(u(11), "host_gpu", u(10)),
                   Provider(u(12), "host_new", u(10)))
    adopted = adopt_uuids(desired, current)
    assert adopted.by_name("host_numa_0").uuid == u(1)
    assert adopted.by_name("host_gpu").uuid == u(2)
    assert adopted.by_name("host_gpu").parent_uuid == u(1)
    assert adopted.by_name("host_new").uuid == u(12)
    assert adopted.by_name("host_new").parent_uuid == u(1)
    assert diff(current, adopted) == [
        CreateProvider(adopted.by_name("host_new"))]


def test_adopt_returns_desired_unchanged_when_nothing_to_adopt():
    desired = sample_tree()
    assert adopt_uuids(desired, sample_tree()) is desired


# --- diff: property ----------------------------------------------------------

def apply(current: ProviderTree, ops) -> ProviderTree:
    """Play operations the way Placement would: a create sets only the
    name and parent; everything else comes from the later set operations.
    Checks that each operation is legal at the moment it is played:
    Placement refuses a name another provider holds, a missing parent, and
    deleting a provider that still has children."""
    out = current.copy()

    def name_free(name, uuid_):
        assert all(p.name != name for p in out if p.uuid != uuid_), \
            f"name {name} is taken"

    for op in ops:
        if isinstance(op, CreateProvider):
            p = op.provider
            assert p.uuid not in out, f"create of existing {p.name}"
            name_free(p.name, p.uuid)
            out.add(Provider(p.uuid, p.name, p.parent_uuid))  # parent must exist
        elif isinstance(op, UpdateProvider):
            assert op.parent_uuid is None or op.parent_uuid in out
            name_free(op.name, op.uuid)
            out.replace(dataclasses.replace(out.get(op.uuid), name=op.name,
                                            parent_uuid=op.parent_uuid))
        elif isinstance(op, SetInventories):
            out.replace(dataclasses.replace(out.get(op.uuid),
                                            inventories=dict(op.inventories)))
        elif isinstance(op, SetTraits):
            out.replace(dataclasses.replace(out.get(op.uuid), traits=op.traits))
        elif isinstance(op, SetAggregates):
            out.replace(dataclasses.replace(out.get(op.uuid),
                                            aggregates=op.aggregates))
        elif isinstance(op, DeleteProvider):
            assert op.uuid in out
            assert not any(p.parent_uuid == op.uuid for p in out), \
                f"delete of {op.name} while it has children"
            out.remove(op.uuid)
        else:  # pragma: no cover
            raise AssertionError(op)
    return out


def shape(t: ProviderTree) -> dict:
    """What must match: per uuid, name, parent, inventories and traits."""
    return {p.uuid: (p.name, p.parent_uuid, normalized_inventories(p.inventories),
                     p.traits) for p in t}


def owned_shape(t: ProviderTree, current: ProviderTree, reported) -> dict:
    """The shape with what the agent does not own left out: traits it does
    not own that ``current`` had, and reserved on device classes."""
    def device_reserved_out(invs):
        return {rc: {**rec, "reserved": None if rc not in AGENT_RESERVED_CLASSES
                     else rec["reserved"]}
                for rc, rec in normalized_inventories(invs).items()}

    def outside(p):
        before = current.get(p.uuid)
        return frozenset(t for t in (before.traits if before else ())
                         if not agent_owns_trait(t, reported))

    return {p.uuid: (p.name, p.parent_uuid, device_reserved_out(p.inventories),
                     p.traits - outside(p)) for p in t}


NAMES = [f"host_c{i}" for i in range(8)]
RESOURCE_CLASSES = ["VCPU", "PCPU", "MEMORY_MB", "SRIOV_NET_VF", "CUSTOM_X"]
TRAITS = ["HW_NUMA_ROOT", "COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_A", "CUSTOM_B"]

inventories_st = st.dictionaries(
    st.sampled_from(RESOURCE_CLASSES),
    st.builds(lambda total, reserved, ratio, sparse: (
        {"total": total} if sparse
        else inventory(total, reserved=min(reserved, total),
                       allocation_ratio=ratio)),
        st.integers(1, 64), st.integers(0, 4),
        st.sampled_from([1, 1.0, 2.0, 16.0]), st.booleans()),
    max_size=3)
traits_st = st.frozensets(st.sampled_from(TRAITS), max_size=3)


@st.composite
def random_tree(draw, names, uuid_for, root_name="host"):
    """A tree of the given child names; each child's parent is the root or
    an earlier child, so the tree is always well-formed."""
    providers = [Provider(ROOT, root_name, None, draw(inventories_st),
                          draw(traits_st))]
    for name in names:
        parent = draw(st.sampled_from(providers)).uuid
        providers.append(Provider(uuid_for(name), name, parent,
                                  draw(inventories_st), draw(traits_st)))
    return ProviderTree(providers)


@st.composite
def current_and_desired(draw):
    current_names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=6))
    desired_names = draw(st.permutations(
        draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=6))))
    counter = iter(range(1000, 2000))
    current_uuids = {n: u(next(counter)) for n in current_names}
    # A shared name keeps its uuid or has a fresh one that adoption must undo.
    desired_uuids = {}
    for n in desired_names:
        if n in current_uuids and draw(st.booleans()):
            desired_uuids[n] = current_uuids[n]
        else:
            desired_uuids[n] = u(next(counter))
    # A name only in desired may take over the uuid of a name only in
    # current: a rename.
    gone = [n for n in current_names if n not in desired_names]
    for n in desired_names:
        if n not in current_uuids and gone and draw(st.booleans()):
            desired_uuids[n] = current_uuids[gone.pop()]
    current = draw(random_tree(current_names, current_uuids.__getitem__))
    desired = draw(random_tree(desired_names, desired_uuids.__getitem__))
    return current, desired


@settings(max_examples=300, deadline=None)
@given(current_and_desired())
def test_applying_the_diff_yields_the_desired_tree(trees):
    current, desired = trees
    adopted = adopt_uuids(desired, current)
    ops = diff(current, adopted)
    result = apply(current, ops)
    reported = reported_traits(adopted)
    assert owned_shape(result, current, reported) == owned_shape(adopted, current, reported)
    for p in result:
        before = current.get(p.uuid)
        assert p.traits >= adopted.get(p.uuid).traits
        # Whatever is not the agent's was there before: kept, never added.
        assert p.traits - adopted.get(p.uuid).traits <= (
            before.traits if before else frozenset())
    assert {p.name for p in adopted} == {p.name for p in desired}
    assert diff(result, adopted) == []


@settings(max_examples=300, deadline=None)
@given(current_and_desired())
def test_adoption_keeps_the_uuid_of_every_name_already_standing(trees):
    current, desired = trees
    adopted = adopt_uuids(desired, current)
    for p in adopted:
        existing = current.by_name(p.name)
        if existing is not None:
            assert p.uuid == existing.uuid
        parent_name = desired.get(desired.by_name(p.name).parent_uuid)
        if parent_name is not None:
            assert adopted.get(p.parent_uuid).name == parent_name.name


@settings(max_examples=300, deadline=None)
@given(current_and_desired())
def test_creates_come_parent_first_and_deletes_leaf_first(trees):
    current, desired = trees
    adopted = adopt_uuids(desired, current)
    ops = diff(current, adopted)
    seen = {p.uuid for p in current}
    for op in ops:
        if isinstance(op, CreateProvider):
            parent = op.provider.parent_uuid
            assert parent is None or parent in seen
            seen.add(op.provider.uuid)
    deleted = [op.uuid for op in ops if isinstance(op, DeleteProvider)]
    for i, gone in enumerate(deleted):
        # nothing deleted later is a descendant of an earlier delete
        assert not _descendants(current, gone) & set(deleted[i + 1:])
    # every delete follows every create and update
    kinds = [isinstance(op, DeleteProvider) for op in ops]
    assert kinds == sorted(kinds)


def _descendants(t: ProviderTree, uuid_: str) -> set:
    out, frontier = set(), {uuid_}
    while frontier:
        frontier = {p.uuid for p in t if p.parent_uuid in frontier}
        out |= frontier
    return out


@settings(max_examples=300, deadline=None)
@given(current_and_desired(), st.frozensets(st.sampled_from(NAMES)))
def test_provider_not_owned_is_never_deleted_by_the_diff(trees, foreign):
    current, desired = trees
    adopted = adopt_uuids(desired, current)
    ops = diff(current, adopted, owned=lambda p: p.name not in foreign)
    deleted = {op.name for op in ops if isinstance(op, DeleteProvider)}
    assert not deleted & foreign
    expected = {p.name for p in current
                if p.uuid not in adopted and p.name not in foreign}
    assert deleted == expected
