"""The durable store: file modes, pragmas, migrations, group commit, the
one-live-holder index, dump and close, and durability across processes."""
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
)
from compute_agent.drivers.base import DeviceDetail, DeviceKind
from compute_agent.store import sequence as sequence_record
from compute_agent.store.check import StoreVerdict, judge
from compute_agent.store.errors import StoreError, StoreMoved
from compute_agent.store.inspection import inspect_store, stored_schema_version
from compute_agent.store.queries import (
    all_instances,
    all_migrations,
    delete_instance_sql,
    insert_assignments_sql,
    live_assignments,
    placement_view,
    put_instance_sql,
    put_migration_sql,
    put_placement_view_sql,
    update_assignments_sql,
)
from compute_agent.store.schema import COMMIT_SEQUENCE, SCHEMA_VERSION, migrate, schema_version
from compute_agent.store.store import Store
from compute_agent.store.writer import Decision, run_statements
from compute_agent.tree.provider_tree import Provider, inventory
from tests.store_damage import strip_sequence
from tests.unit.store.stores import PROVIDER, ROOT_UUID, assignment, crash_after_a_write
from tests.writer import hold_writer, wait_queued

REPO = Path(__file__).resolve().parents[3]
OTHER_PROVIDER = "7c1e2d3f-0a4b-4c5d-8e6f-9a0b1c2d3e4f"
VIEW = [Provider(PROVIDER, "cmp1", None, {"VCPU": inventory(8), "DISK_GB": inventory(100)},
                 frozenset({"HW_CPU_X86_AVX2"}), None, 4),
        Provider(OTHER_PROVIDER, "cmp1_numa_0", PROVIDER,
                 {"MEMORY_MB": inventory(4096, reserved=512)},
                 frozenset({"HW_NUMA_ROOT", "CUSTOM_X"}), frozenset({PROVIDER}), 7)]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


# --- files and pragmas ----------------------------------------------------------

@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_file_wal_and_shm_are_private_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = tmp_path / "new-dir" / "state.db"
        s = Store(path)
        try:
            s.write(lambda c: run_statements(c, [put_instance_sql(str(uuid.uuid4()), {"name": "a"})]))
            s.read(all_instances)  # a reader connection too
            wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
            assert wal.exists() and shm.exists()
            assert mode(path) == 0o600
            assert mode(wal) == 0o600
            assert mode(shm) == 0o600
            assert mode(path.parent) == 0o700
        finally:
            s.close()
    finally:
        os.umask(old)


def test_writer_and_reader_connections_are_wal_and_synchronous_full(store):
    writer = store._writer
    assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert writer.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert store.read(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
    assert store.read(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
    # What the committer thread itself sees inside a write.
    assert store.write(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
    # WAL is persistent in the file: a plain connection sees it too.
    raw = sqlite3.connect(store.path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


# --- schema versions --------------------------------------------------------------

def test_new_store_is_at_the_current_version(store):
    assert store.read(schema_version) == SCHEMA_VERSION


def _make_v1(path: Path) -> dict:
    """A database as the version-1 agent left it, with a row in every table."""
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, target=1) == 1
    assert schema_version(conn) == 1
    assert not conn.execute(
        "SELECT 1 FROM sqlite_master WHERE name='providers'").fetchone()
    inst = str(uuid.uuid4())
    mig = str(uuid.uuid4())
    rows = [assignment(instance=inst),
            assignment(device="5f1e0000-0000-4000-8000-000000000001", rc="VGPU",
                       kind=DeviceKind.MDEV, provider=OTHER_PROVIDER, instance=inst,
                       st=AssignmentState.CLAIMING),
            assignment(device="0000:81:10.1", instance=inst, st=AssignmentState.RELEASED)]
    conn.execute("BEGIN")
    # As the version-1 agent wrote them: its tables had fewer columns.
    conn.execute("INSERT INTO instances VALUES (?, ?, 0)",
                 (inst, json.dumps({"name": "old", "vcpus": 1, "memory_mb": 512})))
    run_statements(conn, [insert_assignments_sql(rows)])
    conn.execute("INSERT INTO migrations VALUES (?, ?, 'resize', 'both', 'active', ?, 0)",
                 (mig, inst, json.dumps({"name": "old", "vcpus": 1, "memory_mb": 256})))
    conn.execute("COMMIT")
    conn.close()
    return {"instance": inst, "migration": mig, "rows": rows}


def test_version_1_store_upgrades_on_open_and_keeps_its_rows(tmp_path):
    path = tmp_path / "state.db"
    made = _make_v1(path)
    s = Store(path)
    try:
        assert s.read(schema_version) == SCHEMA_VERSION
        live = s.read(live_assignments)
        assert live == sorted([a for a in made["rows"] if a.state is not AssignmentState.RELEASED],
                              key=lambda a: a.id)
        assert [a.detail for a in live] == [DeviceDetail(numa_node=0)] * 2
        assert s.read(all_instances) == {
            made["instance"]: {"name": "old", "vcpus": 1, "memory_mb": 512}}
        m = s.read(all_migrations)[made["migration"]]
        assert (m.kind, m.role, m.state, m.old_spec) == (
            MoveKind.RESIZE, MigrationRole.BOTH, MigrationState.ACTIVE,
            {"name": "old", "vcpus": 1, "memory_mb": 256})
        assert s.read(lambda c: c.execute(
            "SELECT count(*) FROM assignments").fetchone()[0]) == 3
        # v5: the migrations' table takes a live migration's announced state.
        announced = Migration(str(uuid.uuid4()), made["instance"], MoveKind.LIVE_MIGRATION,
                              MigrationRole.SOURCE, MigrationState.ANNOUNCED)
        s.write([put_migration_sql(announced)])
        assert s.read(all_migrations)[announced.uuid] == announced
        # The later tables are there and usable.
        s.write(put_placement_view_sql(VIEW))
        assert s.read(placement_view) == sorted(VIEW, key=lambda p: p.uuid)
    finally:
        s.close()
    # And a second open is a no-op upgrade that keeps everything.
    s = Store(path)
    try:
        assert s.read(schema_version) == SCHEMA_VERSION
        assert s.read(placement_view) == sorted(VIEW, key=lambda p: p.uuid)
        assert len(s.read(live_assignments)) == 2
    finally:
        s.close()


def test_version_2_provider_names_become_the_placement_view(tmp_path):
    """v2 kept only names; v3 keeps them as providers of unknown generation
    (so that the first refresh reads each of them again)."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=2)
    conn.execute("INSERT INTO providers VALUES ('cmp1', ?), ('cmp1_numa_0', ?)",
                 (PROVIDER, OTHER_PROVIDER))
    conn.close()
    s = Store(path)
    try:
        assert s.read(placement_view) == sorted(
            [Provider(PROVIDER, "cmp1"), Provider(OTHER_PROVIDER, "cmp1_numa_0")],
            key=lambda p: p.uuid)
        assert not s.read(lambda c: c.execute(
            "SELECT 1 FROM sqlite_master WHERE name='providers'").fetchone())
    finally:
        s.close()


def test_version_3_host_rows_become_host_resources_that_many_share(tmp_path):
    """v3 recorded the host's own resources as NUMA device 'host'; v4 names
    them, and its one-live-holder index still lets every instance hold some."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=3)
    disk = [assignment(device="host", rc="DISK_GB", kind=DeviceKind.NUMA) for _ in range(2)]
    cell = assignment(device="0", rc="VCPU", kind=DeviceKind.NUMA)
    vf = assignment()
    conn.execute("BEGIN")
    run_statements(conn, [insert_assignments_sql(disk + [cell, vf])])
    conn.execute("COMMIT")
    conn.close()
    s = Store(path)
    try:
        kinds = {a.id: a.kind for a in s.read(live_assignments)}
        assert kinds == {disk[0].id: DeviceKind.HOST_RESOURCES,
                         disk[1].id: DeviceKind.HOST_RESOURCES,
                         cell.id: DeviceKind.NUMA, vf.id: DeviceKind.VF}
        more = assignment(device="host", rc="DISK_GB", kind=DeviceKind.HOST_RESOURCES)
        s.write(lambda c: run_statements(c, [insert_assignments_sql([more])]))
        with pytest.raises(sqlite3.IntegrityError):  # devices are still exclusive
            s.write(lambda c: run_statements(c, [insert_assignments_sql(
                [assignment()])]))
    finally:
        s.close()


def test_the_placement_view_is_kept_whole(store):
    store.write(put_placement_view_sql(VIEW))
    assert store.read(placement_view) == sorted(VIEW, key=lambda p: p.uuid)
    smaller = VIEW[:1]
    store.write(put_placement_view_sql(smaller))
    assert store.read(placement_view) == smaller


def test_store_newer_than_the_code_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "state.db"
    s = Store(path)
    s.write(lambda c: c.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                                (str(SCHEMA_VERSION + 1),)))
    s.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer"):
        Store(path)
    conn = sqlite3.connect(path)
    try:
        assert schema_version(conn) == SCHEMA_VERSION + 1
    finally:
        conn.close()
    assert path.read_bytes() == before


# --- write and group commit -------------------------------------------------------

def test_write_returns_the_jobs_result(store):
    inst = str(uuid.uuid4())

    def job(c):
        run_statements(c, [put_instance_sql(inst, {"name": "x"})])
        return ("done", c.execute("SELECT count(*) FROM instances").fetchone()[0])

    assert store.write(job) == ("done", 1)
    assert store.write(lambda c: None) is None


def test_a_failing_job_is_rolled_back_alone_within_its_batch(store):
    """Hold the committer in one job while 40 writers queue up, one of which
    writes a row and then raises: they all commit in one batch, except it."""
    batches_before = store._commits.batches
    gate = hold_writer(store._commits)

    n, bad_index = 40, 17
    uuids = [str(uuid.uuid4()) for _ in range(n)]
    results: dict[int, object] = {}
    errors: dict[int, BaseException] = {}

    class Boom(Exception):
        pass

    def make_job(i):
        def job(c):
            run_statements(c, [put_instance_sql(uuids[i], {"name": f"i{i}"})])
            if i == bad_index:
                raise Boom("deliberate")
            return i * 10
        return job

    def writer(i):
        try:
            results[i] = store.write(make_job(i))
        except BaseException as e:
            errors[i] = e

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    wait_queued(store._commits, n)
    gate.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()

    # The holding job's batch, then one batch (one commit) for all forty.
    assert store._commits.batches - batches_before == 2
    assert set(errors) == {bad_index}
    assert isinstance(errors[bad_index], Boom)
    assert results == {i: i * 10 for i in range(n) if i != bad_index}
    stored = store.read(all_instances)
    assert set(stored) == {u for i, u in enumerate(uuids) if i != bad_index}
    # Visible to a connection that is not the store's.
    raw = sqlite3.connect(store.path)
    try:
        assert raw.execute("SELECT count(*) FROM instances").fetchone()[0] == n - 1
    finally:
        raw.close()


def test_an_integrity_error_in_one_job_spares_the_others(store):
    """A job hitting the one-live-holder index in a batch with others."""
    first = assignment(device="0000:81:10.5")
    store.write(lambda c: run_statements(c, [insert_assignments_sql([first])]))
    gate = hold_writer(store._commits)
    clash = assignment(device="0000:81:10.5")
    fine = [assignment(device=f"0000:81:11.{i}") for i in range(5)]
    outcome = {}

    def write(name, rows):
        try:
            store.write(lambda c: run_statements(c, [insert_assignments_sql(rows)]))
            outcome[name] = "ok"
        except sqlite3.IntegrityError:
            outcome[name] = "refused"

    threads = [threading.Thread(target=write, args=("clash", [fine[0], clash]))]
    threads += [threading.Thread(target=write, args=(f"fine{i}", [a]))
                for i, a in enumerate(fine[1:])]
    for t in threads:
        t.start()
    wait_queued(store._commits, len(threads))
    gate.set()
    for t in threads:
        t.join(10)
    assert outcome == {"clash": "refused", **{f"fine{i}": "ok" for i in range(4)}}
    live = {a.device_id for a in store.read(live_assignments)}
    # fine[0] went in with the clash, so it went out with it.
    assert live == {"0000:81:10.5"} | {a.device_id for a in fine[1:]}


def test_a_malformed_write_fails_alone_and_the_store_goes_on(store):
    """Statement jobs batched together, one of them not statements at all:
    it fails with its own error, the others land, the committer lives."""
    gate = hold_writer(store._commits)
    good = [str(uuid.uuid4()) for _ in range(3)]
    jobs = [store.submit([put_instance_sql(u, {"name": "ok"})]) for u in good[:2]]
    bad = store.submit([("INSERT INTO instances VALUES (?, ?, ?)", 5)])
    jobs.append(store.submit([put_instance_sql(good[2], {"name": "ok"})]))
    gate.set()
    for job in jobs:
        job.wait()
    with pytest.raises(TypeError):
        bad.wait()
    assert set(store.read(all_instances)) == set(good)
    later = str(uuid.uuid4())
    store.write([put_instance_sql(later, {"name": "later"})])
    assert later in store.read(all_instances)


def test_many_concurrent_writers_all_land(store):
    n_threads, per_thread = 32, 20
    errors = []

    def writer(t):
        try:
            for i in range(per_thread):
                got = store.write(lambda c, t=t, i=i: (
                    run_statements(c, [put_instance_sql(str(uuid.UUID(int=t * 1000 + i + 1)),
                                       {"t": t, "i": i})]), (t, i))[1])
                assert got == (t, i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(store.read(all_instances)) == n_threads * per_thread


# --- the one-live-holder index ------------------------------------------------------

def test_a_device_has_one_live_holder_until_released(store):
    first = assignment(device="0000:81:10.3", st=AssignmentState.CLAIMING)
    store.write(lambda c: run_statements(c, [insert_assignments_sql([first])]))
    for st in (AssignmentState.CLAIMING, AssignmentState.CLAIMED):
        second = assignment(device="0000:81:10.3", st=st)
        with pytest.raises(sqlite3.IntegrityError):
            store.write(lambda c: run_statements(c, [insert_assignments_sql([second])]))
    # claimed is live too
    store.write(lambda c: run_statements(
        c, [update_assignments_sql([first.with_(state=AssignmentState.CLAIMED)])]))
    with pytest.raises(sqlite3.IntegrityError):
        store.write(lambda c: run_statements(
            c, [insert_assignments_sql([assignment(device="0000:81:10.3")])]))
    # Regression: the same device under another provider or class (a NIC
    # whose class changed, a provider moved by the tree mode) used to be
    # taken for another device. It is the same one.
    for other in (assignment(device="0000:81:10.3", provider=OTHER_PROVIDER),
                  assignment(device="0000:81:10.3", rc="CUSTOM_NIC"),
                  assignment(device="0000:81:10.3", kind=DeviceKind.PCI)):
        with pytest.raises(sqlite3.IntegrityError):
            store.write(lambda c: run_statements(
                c, [insert_assignments_sql([other])]))
    # Released: free for the next holder, and history may keep several.
    store.write(lambda c: run_statements(
        c, [update_assignments_sql([first.with_(state=AssignmentState.RELEASED)])]))
    again = assignment(device="0000:81:10.3")
    store.write(lambda c: run_statements(c, [insert_assignments_sql([again])]))
    with pytest.raises(sqlite3.IntegrityError):  # a released row cannot come back
        store.write(lambda c: run_statements(
            c, [update_assignments_sql([first.with_(state=AssignmentState.CLAIMED)])]))
    store.write(lambda c: run_statements(
        c, [update_assignments_sql([again.with_(state=AssignmentState.RELEASED)])]))
    store.write(lambda c: run_statements(c, [insert_assignments_sql([assignment(device="0000:81:10.3",
                                                                  st=AssignmentState.RELEASED)])]))
    holders = [a for a in store.read(live_assignments)
               if (a.provider_uuid, a.resource_class, a.device_id)
               == (PROVIDER, "SRIOV_NET_VF", "0000:81:10.3")]
    assert holders == []


@pytest.mark.parametrize("kind, device", [(DeviceKind.NUMA, "1"),
                                          (DeviceKind.HOST_RESOURCES, "host")])
def test_counted_amounts_are_not_exclusive(store, kind, device):
    rows = [assignment(device=device, rc="VCPU", kind=kind) for _ in range(3)]
    store.write(lambda c: run_statements(c, [insert_assignments_sql(rows)]))
    assert len(store.read(live_assignments)) == 3


# --- a device's detail ----------------------------------------------------------------

def _with_detail_text(store: Store, text: str) -> Assignment:
    row = assignment(kind=DeviceKind.PMEM, rc="CUSTOM_PMEM_NAMESPACE_4GB", device="ns0")
    store.write(lambda c: (
        run_statements(c, [insert_assignments_sql([row])]),
        c.execute("UPDATE assignments SET detail = ? WHERE id = ?", (text, row.id))))
    return row


def test_a_detail_is_stored_as_its_known_fields_node_0_included(store):
    row = assignment(kind=DeviceKind.MDEV, rc="VGPU", device=str(uuid.uuid4())).with_(
        detail=DeviceDetail(numa_node=0, mdev_parent="0000:84:00.0", mdev_type="nvidia-35"))
    store.write(lambda c: run_statements(c, [insert_assignments_sql([row])]))
    text = store.read(lambda c: c.execute("SELECT detail FROM assignments").fetchone()[0])
    assert json.loads(text) == {"numa_node": 0, "mdev_parent": "0000:84:00.0",
                                "mdev_type": "nvidia-35"}
    assert [a.detail for a in store.read(live_assignments)] == [row.detail]


def test_a_detail_written_as_a_plain_dict_by_an_older_agent_still_reads(store):
    _with_detail_text(store, '{"dev_path": "/dev/dax0.0", "mdev_parent": null, '
                             '"numa_node": 0, "size_bytes": 4294967296}')
    assert [a.detail for a in store.read(live_assignments)] == [
        DeviceDetail(numa_node=0, size_bytes=4294967296, dev_path="/dev/dax0.0")]


@pytest.mark.parametrize("text, message", [
    ('{"numa_node": 0, "colour": "red"}', "detail.colour: 'red': not a field"),
    ('{"numa_node": "0"}', "detail.numa_node: '0': must be int"),
    ('{"size_bytes": true}', "detail.size_bytes: True: must be int"),
    ('[0]', "detail: '[0]': not a JSON object"),
])
def test_a_detail_that_is_not_ours_is_refused_naming_the_field(store, text, message):
    row = _with_detail_text(store, text)
    with pytest.raises(StoreError) as e:
        store.read(live_assignments)
    assert str(e.value).startswith(f"assignment {row.id}: {message}")


# --- dump ---------------------------------------------------------------------------

def _fill(s: Store, order):
    rows = [assignment(device=f"0000:81:1{i}.0", aid=str(uuid.UUID(int=i + 1)),
                       instance=str(uuid.UUID(int=100 + i))) for i in range(4)]
    for i in order:
        s.write(lambda c, i=i: (
            run_statements(c, [insert_assignments_sql([rows[i]])]),
            c.execute("UPDATE assignments SET updated_at=0 WHERE id=?", (rows[i].id,)),
            c.execute("INSERT INTO instances (uuid, spec, created_at) VALUES (?, ?, 0)",
                      (rows[i].instance_uuid, json.dumps({"i": i})))))


def test_dump_is_stable(store, tmp_path):
    _fill(store, range(4))
    first = store.dump()
    assert "0000:81:13.0" in first and "CREATE TABLE assignments" in first
    assert store.dump() == first
    # A refused write changes nothing.
    with pytest.raises(ValueError):
        store.write(lambda c: (run_statements(c, [put_instance_sql(str(uuid.uuid4()), {})]),
                               (_ for _ in ()).throw(ValueError("no"))))
    assert store.dump() == first
    # From another thread (another reader connection) and after reopening.
    other = []
    t = threading.Thread(target=lambda: other.append(store.dump()))
    t.start()
    t.join()
    assert other == [first]
    store.close()
    reopened = Store(store.path)
    try:
        assert reopened.dump() == first
    finally:
        reopened.close()


def test_dump_does_not_depend_on_the_order_rows_were_written(tmp_path):
    """Two stores holding the same rows dump the same text."""
    a, b = Store(tmp_path / "a.db"), Store(tmp_path / "b.db")
    try:
        _fill(a, [0, 1, 2, 3])
        _fill(b, [3, 1, 0, 2])
        assert a.dump() == b.dump()
    finally:
        a.close()
        b.close()


# --- close ----------------------------------------------------------------------------

def test_close_is_clean(tmp_path):
    path = tmp_path / "state.db"
    s = Store(path)
    inst = str(uuid.uuid4())
    s.write(lambda c: run_statements(c, [put_instance_sql(inst, {"name": "kept"})]))
    s.read(all_instances)
    t = threading.Thread(target=lambda: s.read(all_instances))  # another reader
    t.start()
    t.join()
    assert len(s._readers) == 2
    s.close()
    assert not s._commits._thread.is_alive()
    for conn in [s._writer, *s._readers]:
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")
    # The last connection out checkpoints and removes the WAL.
    assert not Path(f"{path}-wal").exists()
    assert not Path(f"{path}-shm").exists()
    s.close()  # twice is harmless
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT spec FROM instances WHERE uuid=?",
                           (inst,)).fetchone() == ('{"name": "kept"}',)
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        raw.close()


def test_close_lets_queued_writes_finish(tmp_path):
    s = Store(tmp_path / "state.db")
    gate = hold_writer(s._commits)
    done = []
    writers = [threading.Thread(target=lambda i=i: done.append(s.write(
        lambda c: (run_statements(c, [put_instance_sql(str(uuid.UUID(int=i + 1)), {})]), i)[1])))
        for i in range(8)]
    for w in writers:
        w.start()
    wait_queued(s._commits, 8)
    closer = threading.Thread(target=s.close)
    closer.start()
    gate.set()
    for th in writers + [closer]:
        th.join(10)
        assert not th.is_alive()
    assert sorted(done) == list(range(8))
    conn = sqlite3.connect(s.path)
    try:
        assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] == 8
    finally:
        conn.close()


def test_write_after_close_fails_instead_of_hanging(tmp_path):
    s = Store(tmp_path / "state.db")
    s.close()
    outcome = []

    def late():
        try:
            s.write(lambda c: run_statements(c, [put_instance_sql(str(uuid.uuid4()), {})]))
            outcome.append("written")
        except Exception as e:
            outcome.append(type(e).__name__)

    t = threading.Thread(target=late, daemon=True)
    t.start()
    t.join(3)
    assert not t.is_alive(), "Store.write() after close() blocks forever"
    assert outcome == ["StoreError"]


# --- durability ----------------------------------------------------------------------

_READ_ROW = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
row = conn.execute("SELECT spec FROM instances WHERE uuid=?", (sys.argv[2],)).fetchone()
print(row[0] if row else "MISSING")
"""


def test_a_write_is_visible_to_a_fresh_connection_and_process_once_it_returns(store):
    for i in range(5):
        inst = str(uuid.uuid4())
        store.write(lambda c: run_statements(c, [put_instance_sql(inst, {"n": i})]))
        raw = sqlite3.connect(store.path)
        try:
            assert raw.execute("SELECT spec FROM instances WHERE uuid=?",
                               (inst,)).fetchone() == (json.dumps({"n": i}),)
        finally:
            raw.close()
        out = subprocess.run([sys.executable, "-c", _READ_ROW, str(store.path), inst],
                             capture_output=True, text=True, timeout=30, check=True)
        assert out.stdout.strip() == json.dumps({"n": i})


_WRITE_AND_DIE = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from compute_agent.store.queries import put_instance_sql
from compute_agent.store.store import Store
from compute_agent.store.writer import run_statements
s = Store(sys.argv[2])
s.write(lambda c: run_statements(c, [put_instance_sql(sys.argv[3], {"survived": True})]))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_write_survives_sigkill_right_after_it_returns(tmp_path):
    path = tmp_path / "state.db"
    for _ in range(3):
        inst = str(uuid.uuid4())
        proc = subprocess.run([sys.executable, "-c", _WRITE_AND_DIE, str(REPO),
                               str(path), inst], capture_output=True, timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        s = Store(path)
        try:
            assert s.read(all_instances)[inst] == {"survived": True}
            assert s.read(lambda c: c.execute(
                "PRAGMA integrity_check").fetchone()[0]) == "ok"
        finally:
            s.close()


# --- what is at the store's path, and errors that name it -------------------



def test_readers_opened_read_only_never_remove_the_log(tmp_path):
    path = tmp_path / "state.db"
    crash_after_a_write(path)
    reader = Store(path, read_only=True)
    assert reader.read(all_instances) == {"a": {"name": "a"}}
    with pytest.raises(StoreError, match=str(path)):
        reader.write([put_instance_sql("b", {})])
    reader.close()
    assert Path(f"{path}-wal").exists()
    assert not inspect_store(path).wal_lost


def test_an_unreadable_store_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"not sqlite\n" * 500)
    with pytest.raises(StoreError, match=f"store {path}: DatabaseError: file is not a"):
        Store(path)


def test_a_read_that_fails_names_the_file(store):
    with pytest.raises(StoreError, match=f"store {store.path}: OperationalError"):
        store.read(lambda c: c.execute("SELECT * FROM no_such_table").fetchall())


def test_a_commit_that_fails_names_the_file(store):
    # A job that ends the transaction under the writer: what follows in
    # the commit fails, as a full disk or an I/O error would.
    with pytest.raises(StoreError, match=f"store {store.path}: commit failed"):
        store.write(lambda conn: conn.execute("ROLLBACK"))


def test_a_holders_store_closes_twice_without_error(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    store.close()
    store.close()
    # Closed once, cleanly: the file says so, writes are refused, and the
    # next holder opens it.
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'in_use'").fetchall() == [
            ("closed",)]
    finally:
        db.close()
    with pytest.raises(StoreError):
        store.write(lambda conn: conn.execute("DELETE FROM meta"))
    Store(path, ROOT_UUID).close()


# --- checked before it is believed ---------------------------------------------------

def meta_value(path: Path, key: str) -> str | None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    finally:
        conn.close()
    return None if row is None else row[0]


def recorded(path: Path) -> int | None:
    return sequence_record.read_recorded(sequence_record.record_path(path))


def test_each_group_commit_raises_the_sequence_in_the_store_and_the_record(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    assert meta_value(path, COMMIT_SEQUENCE) == "0" and recorded(path) == 0
    for n in range(1, 4):
        store.write([put_instance_sql(f"i{n}", {})])
        assert meta_value(path, COMMIT_SEQUENCE) == str(n) and recorded(path) == n
    store.close()
    facts = inspect_store(path)
    assert (facts.sequence, facts.recorded) == (3, 3)
    assert judge(facts, None).verdict is StoreVerdict.OPEN


def test_a_write_that_changes_no_row_is_no_commit(tmp_path):
    """Alone, and in a group commit with another that does change rows."""
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    store.write([put_instance_sql("a", {})])
    store.write(delete_instance_sql("nobody", moves_too=True))
    assert meta_value(path, COMMIT_SEQUENCE) == "1" and recorded(path) == 1
    gate = hold_writer(store._commits)  # a job that changes nothing either
    jobs = [store.submit(delete_instance_sql("nobody", moves_too=True)),
            store.submit([put_instance_sql("b", {})])]
    wait_queued(store._commits, 2)
    gate.set()
    for job in jobs:
        job.wait()
    assert meta_value(path, COMMIT_SEQUENCE) == "2" and recorded(path) == 2
    store.close()


def test_a_store_nobody_holds_keeps_no_sequence(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    store.write([put_instance_sql("i", {})])
    store.close()
    assert meta_value(path, COMMIT_SEQUENCE) is None and recorded(path) is None


def test_bug_an_emptied_log_after_a_crash_passed_the_start_check(tmp_path):
    # The in_use mark catches a missing log, not an emptied one: the
    # acknowledged write was gone and the store opened.
    path = tmp_path / "state.db"
    crash_after_a_write(path)
    Path(f"{path}-wal").write_bytes(b"")
    facts = inspect_store(path)
    assert not facts.wal_lost
    assert (facts.sequence, facts.recorded) == (0, 1)
    j = judge(facts, None)
    assert j.verdict is StoreVerdict.REFUSE and "the host recorded 1" in j.reason


def test_bug_an_older_copy_put_back_passed_the_start_check(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    store.write([put_instance_sql("a", {})])
    store.close()
    older = path.read_bytes()
    store = Store(path, ROOT_UUID)
    store.write([put_instance_sql("b", {})])
    store.close()
    path.write_bytes(older)
    j = judge(inspect_store(path), None)
    assert j.verdict is StoreVerdict.REFUSE
    assert "is at commit sequence 1, but the host recorded 2" in j.reason


def test_a_store_from_before_the_sequence_is_accepted_once_and_starts_one(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    store.write([put_instance_sql("a", {})])
    store.close()
    strip_sequence(path)
    before = path.read_bytes()
    facts = inspect_store(path)
    assert (facts.sequence, facts.recorded) == (None, None)
    assert judge(facts, None).verdict is StoreVerdict.OPEN
    store = Store(path, ROOT_UUID)
    assert meta_value(path, COMMIT_SEQUENCE) == "0" and recorded(path) == 0
    store.write([put_instance_sql("b", {})])
    store.close()
    # The same copy from before, put back after a commit: refused.
    path.write_bytes(before)
    j = judge(inspect_store(path), None)
    assert j.verdict is StoreVerdict.REFUSE and "at no commit sequence" in j.reason


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_bug_a_store_removed_under_its_holder_took_writes_to_a_nameless_file(
        tmp_path, how):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    told: list[str] = []
    store.on_moved(told.append)
    store.write([put_instance_sql("a", {})])
    if how == "removed":
        path.unlink()
    else:
        copy = tmp_path / "copy.db"
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)
    for name in ("b", "c"):
        with pytest.raises(StoreMoved, match=f"store {path} was {how}"):
            store.write([put_instance_sql(name, {})])
    assert len(told) == 1 and f"store {path} was {how}" in told[0]
    late: list[str] = []
    store.on_moved(late.append)
    assert late == told
    store.close()


def test_a_decision_whose_store_was_removed_is_undone(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, ROOT_UUID)
    undone = threading.Event()
    path.unlink()
    job = store.submit_decision("k", lambda: Decision(
        "claimed", [put_instance_sql("a", {})], undone.set))
    with pytest.raises(StoreMoved):
        job.wait()
    assert undone.is_set()
    store.close()


def test_a_store_of_an_older_schema_opened_read_only_reads_as_this_versions(tmp_path):
    """upgrade-check reads the store an older version left, before the new
    agent migrates it: through a migrated copy, the file left at its
    schema."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, 2)  # d1b250d's schema: provider names, no saved view yet
    conn.execute("INSERT INTO providers VALUES ('host', ?)", (ROOT_UUID,))
    conn.execute("INSERT INTO migrations VALUES ('m', 'i', 'resize', 'both', 'finished', "
                 "NULL, 0)")
    conn.close()
    reader = Store(path, read_only=True)
    assert [(p.uuid, p.name) for p in reader.read(placement_view)] == [(ROOT_UUID, "host")]
    assert reader.read(all_migrations)["m"].state is MigrationState.FINISHED
    reader.close()
    assert stored_schema_version(path) == 2
