"""The start-up rules that tell a new host from a lost store (pure)."""
from __future__ import annotations

import pytest

from compute_agent.store.check import (
    DETAIL_CHARACTERS,
    HostFacts,
    StoreFacts,
    StoreFile,
    StoreVerdict,
    judge,
    one_line,
)

ROOT = "5d2bd8a6-8f2f-4f0b-9c55-0e1c9d1b6c11"
GUEST = "0b6f8f3e-54a4-4b8e-a6a9-2f1e0b3d7d01"
PATH = "/var/lib/compute-agent/state.db"


def host(guests=frozenset(), allocations=None, existed=True, why="") -> HostFacts:
    return HostFacts(ROOT, existed, guests, {} if allocations is None else allocations,
                     why)


@pytest.mark.parametrize("file", [StoreFile.ABSENT, StoreFile.EMPTY])
def test_nothing_anywhere_is_a_new_host(file):
    assert judge(StoreFacts(PATH, file), host()).verdict is StoreVerdict.CREATE


@pytest.mark.parametrize("file", [StoreFile.ABSENT, StoreFile.EMPTY])
def test_no_store_with_a_guest_of_ours_is_a_lost_store(file):
    j = judge(StoreFacts(PATH, file), host(guests=frozenset({GUEST})))
    assert j.verdict is StoreVerdict.REFUSE
    assert f"store {PATH} is {file.value}" in j.reason and GUEST in j.reason
    assert "rebuild-store" in j.reason


def test_no_store_with_allocations_on_our_tree_is_a_lost_store():
    j = judge(StoreFacts(PATH, StoreFile.ABSENT),
              host(allocations={GUEST: {ROOT}}))
    assert j.verdict is StoreVerdict.REFUSE and "allocations" in j.reason and PATH in j.reason


def test_allocations_unknown_are_never_read_as_none():
    j = judge(StoreFacts(PATH, StoreFile.ABSENT),
              HostFacts(ROOT, True, frozenset(), None, "Placement did not answer"))
    assert j.verdict is StoreVerdict.REFUSE
    assert "cannot be told" in j.reason and "Placement did not answer" in j.reason


def test_guests_unknown_are_never_read_as_none():
    j = judge(StoreFacts(PATH, StoreFile.EMPTY),
              HostFacts(ROOT, False, None, None, "the hypervisor did not answer"))
    assert j.verdict is StoreVerdict.REFUSE and "hypervisor" in j.reason


def test_a_root_made_at_this_start_needs_no_placement():
    # compute_id did not exist: nothing can be allocated on a new UUID.
    j = judge(StoreFacts(PATH, StoreFile.ABSENT),
              HostFacts(ROOT, False, frozenset(), None, "not asked"))
    assert j.verdict is StoreVerdict.CREATE


def test_a_valid_store_opens_whatever_else_is_unknown():
    facts = StoreFacts(PATH, StoreFile.VALID, root_uuid=ROOT)
    assert judge(facts, HostFacts(ROOT, True, None, None)).verdict is StoreVerdict.OPEN


def test_a_valid_store_whose_log_was_lost_is_refused():
    j = judge(StoreFacts(PATH, StoreFile.VALID, wal_lost=True), host())
    assert j.verdict is StoreVerdict.REFUSE and f"{PATH}-wal is missing" in j.reason


def test_a_corrupt_store_is_refused_naming_the_file_and_why():
    j = judge(StoreFacts(PATH, StoreFile.CORRUPT, "DatabaseError: file is not a "
                         "database"), host())
    assert j.verdict is StoreVerdict.REFUSE
    assert f"store {PATH} is unusable (DatabaseError: file is not a database)" in j.reason


def test_a_store_made_for_another_root_is_refused():
    other = "c3f0b0a4-7d49-4a8e-8f6e-1b1c2d3e4f50"
    j = judge(StoreFacts(PATH, StoreFile.VALID, root_uuid=other), host())
    assert j.verdict is StoreVerdict.REFUSE and other in j.reason and ROOT in j.reason


def test_bug_a_multi_line_sqlite_message_made_a_refusal_of_several_lines():
    # integrity_check's rows carry newlines ("*** in database main ***\n
    # Page 2: ..."), and the refusal ran over several lines.
    detail = ("integrity check: *** in database main ***\nPage 2: free space "
              "corruption\nPage 4 is never used\nPage 5 is never used")
    j = judge(StoreFacts(PATH, StoreFile.CORRUPT, detail), host())
    assert j.verdict is StoreVerdict.REFUSE and "\n" not in j.reason
    assert "*** in database main *** Page 2: free space corruption Page 4" in j.reason
    assert "compute-agent-manage rebuild-store" in j.reason


def test_a_long_detail_is_cut_and_its_length_given():
    detail = "row 4 missing from index sqlite_autoindex_assignments_1; " * 40
    line = one_line(detail)
    assert len(line) < DETAIL_CHARACTERS + 30
    assert line.endswith(f"... ({len(detail.strip())} characters)")


RECORD = "/var/lib/compute-agent/store_sequence"


def sequenced(sequence, recorded) -> StoreFacts:
    return StoreFacts(PATH, StoreFile.VALID, root_uuid=ROOT, sequence=sequence,
                      recorded=recorded, record_path=RECORD)


def test_a_store_behind_the_hosts_record_has_lost_writes_and_is_refused():
    j = judge(sequenced(12, 15), host())
    assert j.verdict is StoreVerdict.REFUSE
    assert f"store {PATH} is at commit sequence 12, but the host recorded 15" in j.reason
    assert RECORD in j.reason and "rebuild-store" in j.reason
    assert "compute-agent-manage accept-store" in j.reason and "\n" not in j.reason


@pytest.mark.parametrize("sequence, recorded", [(15, 15), (16, 15)])
def test_a_store_level_with_or_ahead_of_its_record_opens(sequence, recorded):
    # Ahead: killed between SQLite's commit and the record's write; that
    # commit was never acknowledged.
    assert judge(sequenced(sequence, recorded), host()).verdict is StoreVerdict.OPEN


@pytest.mark.parametrize("recorded", [None, 0])
def test_a_store_from_before_the_sequence_opens_while_nothing_was_recorded(recorded):
    # 0: the record is written before the store gets its sequence, and a
    # crash came in between.
    assert judge(sequenced(None, recorded), host()).verdict is StoreVerdict.OPEN


def test_a_store_from_before_the_sequence_is_refused_once_the_host_recorded_commits():
    j = judge(sequenced(None, 3), host())
    assert j.verdict is StoreVerdict.REFUSE
    assert "at no commit sequence, but the host recorded 3" in j.reason


def test_a_store_with_a_sequence_and_no_record_cannot_be_told_and_is_refused():
    j = judge(sequenced(4, None), host())
    assert j.verdict is StoreVerdict.REFUSE
    assert f"{RECORD}, is missing or unreadable" in j.reason and "accept-store" in j.reason


def test_bug_a_deleted_compute_id_was_called_another_root():
    # The start wrote a new compute_id, then refused "...but compute_id
    # names <that new uuid>": misleading, and written before deciding.
    new = "c3f0b0a4-7d49-4a8e-8f6e-1b1c2d3e4f50"
    j = judge(StoreFacts(PATH, StoreFile.VALID, root_uuid=ROOT),
              HostFacts(new, False, None, None))
    assert j.verdict is StoreVerdict.REFUSE
    assert j.reason.startswith(f"compute_id is missing beside store {PATH}, which belongs "
                               f"to root provider {ROOT}")
    assert new not in j.reason


# --- a host nova-compute ran: adopted, not lost -------------------------------------

NOVA_GUEST = "7c4e1f5a-2b3d-4c6e-8f90-a1b2c3d4e5f6"


def nova_host(**changes) -> HostFacts:
    facts = dict(root_uuid=ROOT, compute_id_existed=True, guests=frozenset(),
                 allocations={NOVA_GUEST: {ROOT}}, foreign_guests=frozenset({NOVA_GUEST}))
    facts.update(changes)
    return HostFacts(**facts)


def test_no_store_and_nova_guests_on_novas_root_is_adopted():
    assert judge(StoreFacts(PATH, StoreFile.ABSENT), nova_host()).verdict is StoreVerdict.ADOPT
    # Guests of nova's without allocations: adopted too (the plan says which).
    assert judge(StoreFacts(PATH, StoreFile.ABSENT),
                 nova_host(allocations={})).verdict is StoreVerdict.ADOPT


def test_an_empty_store_was_ours_and_is_lost_even_beside_nova_guests():
    j = judge(StoreFacts(PATH, StoreFile.EMPTY), nova_host())
    assert j.verdict is StoreVerdict.REFUSE and "store is lost" in j.reason


def test_a_guest_of_ours_beside_novas_means_a_lost_store():
    j = judge(StoreFacts(PATH, StoreFile.ABSENT), nova_host(guests=frozenset({GUEST})))
    assert j.verdict is StoreVerdict.REFUSE and GUEST in j.reason


def test_a_root_made_at_this_start_is_not_novas():
    # No compute_id before: nothing registered the root; a new host.
    j = judge(StoreFacts(PATH, StoreFile.ABSENT),
              nova_host(compute_id_existed=False, allocations=None))
    assert j.verdict is StoreVerdict.CREATE


@pytest.mark.parametrize("unknown", ["allocations", "foreign_guests", "guests"])
def test_adoption_is_never_judged_on_unknown_facts(unknown):
    j = judge(StoreFacts(PATH, StoreFile.ABSENT),
              nova_host(**{unknown: None}, why_unknown="it did not answer"))
    assert j.verdict is StoreVerdict.REFUSE and "it did not answer" in j.reason
