"""At start: may the agent serve claims from its store?

A store that is missing is not a new host. The store is the only record
of which device each instance holds; Placement counts devices but does not
name them, and a guest names its devices only while it exists. So a store
that is missing, empty or behind (its write-ahead log lost) while guests
of ours run, or while consumers hold allocations on our providers, would
hand those devices out again. That is a lost store: the agent refuses to
serve, says so in one line, and ``compute-agent-manage rebuild-store``
rebuilds it.

A store that is there is believed only once it has been checked whole:
SQLite's ``integrity_check`` (every page, and every index against its
table), and its commit sequence against the host's record of it
(compute_agent/store/sequence.py): a store behind its record has lost writes the
agent acknowledged, however it lost them. An operator who put an older
store back on purpose accepts it with ``compute-agent-manage
accept-store``.

One missing store is not lost: a host that nova-compute ran until today,
whose compute_id the agent found, runs nova's guests (no metadata of
ours, no guest of ours) and has no store of ours yet. That host is
adopted (compute_agent/store/adoption.py) before anything is served.

Pure: the facts are gathered by the caller (compute_agent/daemon/composition.py); the rules
are here, one named function each, applied in order by ``judge``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

REBUILD_HINT = "run 'compute-agent-manage rebuild-store' to rebuild it"
ACCEPT_HINT = "'compute-agent-manage accept-store' accepts it as it is"
# A refusal is one line: SQLite's messages carry newlines and may be long.
DETAIL_CHARACTERS = 200


class StoreFile(str, enum.Enum):
    """What is at the store's path, as inspect_store (compute_agent/store/inspection.py) found it."""

    ABSENT = "missing"
    EMPTY = "empty"  # zero bytes, or a database without a single table
    VALID = "valid"
    CORRUPT = "corrupt"  # not a database, fails its check, or not ours


@dataclass(frozen=True)
class StoreFacts:
    path: str
    file: StoreFile
    detail: str = ""  # why it is CORRUPT
    # It was last opened by an agent that did not close it, and its
    # write-ahead log, which held every write since, is gone.
    wal_lost: bool = False
    root_uuid: str | None = None  # the root provider it was created for
    # Its commit sequence; None in a store from before the sequence.
    sequence: int | None = None
    # The host's record of the sequence (compute_agent/store/sequence.py), and
    # where it is; None when there is none, or it cannot be read.
    recorded: int | None = None
    record_path: str = ""


@dataclass(frozen=True)
class HostFacts:
    """What else on the host remembers the store's contents."""

    root_uuid: str
    # compute_id was there before this start; when it was not, the root
    # provider's UUID is new and nothing can hold allocations on it.
    compute_id_existed: bool
    # Instance uuids of the guests that carry our metadata; None when the
    # hypervisor could not be asked.
    guests: frozenset[str] | None
    # consumer uuid -> our providers it holds allocations on; None when
    # Placement could not be asked (never read as "none").
    allocations: dict[str, set[str]] | None
    why_unknown: str = ""  # what failed, when guests or allocations is None
    # Instance uuids of the guests someone else defined (nova's); None when
    # the hypervisor could not be asked.
    foreign_guests: frozenset[str] | None = frozenset()


class StoreVerdict(enum.Enum):
    """What the start check decides about the store."""

    OPEN = "open"  # the store is this host's: serve from it
    CREATE = "create"  # a new host: create an empty store
    REFUSE = "refuse"  # lost, corrupt or not ours: serve nothing
    ADOPT = "adopt"  # a host nova-compute ran: import its guests, then serve


@dataclass(frozen=True)
class Judgement:
    verdict: StoreVerdict
    reason: str = ""  # one line naming the file, when REFUSE


def one_line(text: str, limit: int = DETAIL_CHARACTERS) -> str:
    """``text`` on one line (its whitespace runs made one space), cut to
    ``limit`` characters with its whole length said."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit]}... ({len(flat)} characters)"


def needs_host_facts(store: StoreFacts) -> bool:
    """Only a store with nothing in it raises the question of what it lost."""
    return store.file in (StoreFile.ABSENT, StoreFile.EMPTY)


def corrupt_store(store: StoreFacts) -> Judgement | None:
    if store.file is StoreFile.CORRUPT:
        return Judgement(StoreVerdict.REFUSE,
                         f"store {store.path} is unusable ({one_line(store.detail)}); "
                         f"move it aside and {REBUILD_HINT}")
    return None


def lost_write_ahead_log(store: StoreFacts) -> Judgement | None:
    if store.file is StoreFile.VALID and store.wal_lost:
        return Judgement(StoreVerdict.REFUSE,
                         f"store {store.path} was not closed cleanly and its "
                         f"write-ahead log {store.path}-wal is missing: its latest "
                         f"writes are lost; move it aside and {REBUILD_HINT}")
    return None


def store_behind_its_record(store: StoreFacts) -> Judgement | None:
    """Acknowledged writes are gone: the store's sequence is behind the
    one the host recorded after them. A store from before the sequence
    counts as 0: it is accepted once, while the host has recorded no
    commit of its own since it started one."""
    if (store.file is StoreFile.VALID and store.recorded is not None
            and (store.sequence or 0) < store.recorded):
        at = ("no commit sequence" if store.sequence is None
              else f"commit sequence {store.sequence}")
        return Judgement(StoreVerdict.REFUSE,
                         f"store {store.path} is at {at}, but the host recorded "
                         f"{store.recorded} in {store.record_path}: writes it "
                         "acknowledged are lost (a write-ahead log emptied or rolled "
                         f"back, or an older copy put back); move it aside and "
                         f"{REBUILD_HINT}, or, if it was restored on purpose, "
                         f"{ACCEPT_HINT}")
    return None


def record_missing(store: StoreFacts) -> Judgement | None:
    """Unknown is never empty: a store with a sequence was opened by an
    agent that wrote the record first, so a missing record is one taken
    away, and what the store lost cannot be told."""
    if (store.file is StoreFile.VALID and store.sequence is not None
            and store.recorded is None):
        return Judgement(StoreVerdict.REFUSE,
                         f"store {store.path} is at commit sequence {store.sequence}, "
                         f"but the host's record of it, {store.record_path}, is missing "
                         "or unreadable: whether writes were lost cannot be told; "
                         f"if this store is the latest, {ACCEPT_HINT}")
    return None


def compute_id_missing(store: StoreFacts, host: HostFacts | None) -> Judgement | None:
    """A store made for a root, and no compute_id naming any: the file was
    lost, not the host. A new root would orphan the host's providers."""
    if (store.file is StoreFile.VALID and host is not None and store.root_uuid
            and not host.compute_id_existed):
        return Judgement(StoreVerdict.REFUSE,
                         f"compute_id is missing beside store {store.path}, which "
                         f"belongs to root provider {store.root_uuid}: write that UUID "
                         "into compute_id and start again; nothing was written")
    return None


def store_of_another_root(store: StoreFacts, host: HostFacts | None) -> Judgement | None:
    if (store.file is StoreFile.VALID and host is not None and store.root_uuid
            and store.root_uuid != host.root_uuid):
        return Judgement(StoreVerdict.REFUSE,
                         f"store {store.path} belongs to root provider "
                         f"{store.root_uuid}, but compute_id names {host.root_uuid}")
    return None


def lost_store(store: StoreFacts, host: HostFacts) -> Judgement | None:
    """Nothing in the store, but the host remembers instances."""
    what = f"store {store.path} is {store.file.value}"
    if host.guests:
        example = sorted(host.guests)[0]
        return Judgement(StoreVerdict.REFUSE,
                         f"{what} but {len(host.guests)} guest(s) of ours are defined "
                         f"here (e.g. {example}): the store is lost; {REBUILD_HINT}")
    # While the guests are unknown the allocations may be nova's, on a
    # host to adopt: cannot_tell says so.
    if (host.compute_id_existed and host.allocations and host.guests is not None
            and host.foreign_guests is not None):
        example = sorted(host.allocations)[0]
        return Judgement(StoreVerdict.REFUSE,
                         f"{what} but {len(host.allocations)} consumer(s) hold "
                         f"allocations on root provider {host.root_uuid}'s tree in "
                         f"Placement (e.g. {example}): the store is lost; {REBUILD_HINT}")
    return None


def host_to_adopt(store: StoreFacts, host: HostFacts) -> Judgement | None:
    """No store at all (an empty one was ours), a root that existed before
    (nova's compute_id), no guest of ours and guests of someone else's:
    a host nova-compute ran. Needs every fact known: the plan reads
    Placement's allocations."""
    if (store.file is StoreFile.ABSENT and host.compute_id_existed
            and host.guests is not None and not host.guests
            and host.allocations is not None and host.foreign_guests):
        return Judgement(StoreVerdict.ADOPT)
    return None


def cannot_tell(store: StoreFacts, host: HostFacts) -> Judgement | None:
    """Unknown is never empty: without the guests, or without Placement
    for a root that existed before, a new host cannot be told from a
    lost store."""
    if (host.guests is None or host.foreign_guests is None
            or (host.compute_id_existed and host.allocations is None)):
        return Judgement(StoreVerdict.REFUSE,
                         f"store {store.path} is {store.file.value} and a new host "
                         f"cannot be told from a lost store: {host.why_unknown}; "
                         "start again once it answers")
    return None


def judge(store: StoreFacts, host: HostFacts | None) -> Judgement:
    """``host`` is needed when ``needs_host_facts(store)``; otherwise it is
    optional and only checks the store's root."""
    for rule in (corrupt_store, lost_write_ahead_log, store_behind_its_record,
                 record_missing):
        found = rule(store)
        if found:
            return found
    for host_rule in (compute_id_missing, store_of_another_root):
        found = host_rule(store, host)
        if found:
            return found
    if store.file is StoreFile.VALID:
        return Judgement(StoreVerdict.OPEN)
    if host is None:
        raise ValueError(f"{store.path} is {store.file.value}: host facts are needed")
    for known_host_rule in (host_to_adopt, lost_store, cannot_tell):
        found = known_host_rule(store, host)
        if found:
            return found
    return Judgement(StoreVerdict.CREATE)
