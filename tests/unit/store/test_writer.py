"""The writer thread: batches, decisions made in it, per-key order, undo,
multi-row inserts and close."""
import sqlite3
import threading

import pytest

from compute_agent.store.writer import INSERT_CHUNK, Decision, GroupCommitter, Job
from tests.writer import hold_writer, wait_queued

INSERT = "INSERT INTO t VALUES (?, ?)"


@pytest.fixture
def conn(tmp_path):
    c = sqlite3.connect(tmp_path / "t.db", isolation_level=None, check_same_thread=False)
    c.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
    yield c
    c.close()


@pytest.fixture
def commits(conn):
    g = GroupCommitter(conn, "test store")
    yield g
    g.close()


def rows(conn) -> dict:
    return dict(conn.execute("SELECT k, v FROM t"))


def test_a_decision_runs_in_the_writer_and_returns_once_written(conn, commits):
    seen = []

    def decide():
        seen.append(threading.current_thread().name)
        return Decision("answer", [(INSERT, [("a", 1)])])

    assert commits.submit(Job(decide=decide, key="k1")).wait() == "answer"
    assert seen == ["store-committer"]
    assert rows(conn) == {"a": 1}


def test_decisions_on_one_key_take_one_transaction_each(conn, commits):
    """Three decisions on one key and one on another, queued together: the
    other key's goes with the first, and each later one on the key sees
    the one before it committed."""
    gate = hold_writer(commits)
    batches = commits.batches
    order = []

    def decide(name, key):
        def run():
            committed = rows(conn)
            order.append((name, sorted(committed)))
            return Decision(name, [(INSERT, [(name, len(committed))])])
        return Job(decide=run, key=key)

    jobs = [decide("a1", "a"), decide("a2", "a"), decide("b1", "b"), decide("a3", "a")]
    for job in jobs:
        commits.submit(job)
    gate.set()
    assert [job.wait() for job in jobs] == ["a1", "a2", "b1", "a3"]
    assert order == [("a1", []), ("b1", []), ("a2", ["a1", "b1"]),
                     ("a3", ["a1", "a2", "b1"])]
    assert commits.batches - batches == 4  # the holder's, then three


def test_a_failed_write_is_undone_before_the_next_decision(conn, commits):
    conn.execute("INSERT INTO t VALUES ('taken', 0)")
    gate = hold_writer(commits)
    log = []
    clash = Job(decide=lambda: (log.append("decide clash"),
                                Decision("x", [(INSERT, [("taken", 1)])],
                                         undo=lambda: log.append("undo clash")))[1],
                key="a")
    later = Job(decide=lambda: (log.append("decide later"),
                                Decision("y", [(INSERT, [("fine", 2)])]))[1], key="a")
    commits.submit(clash)
    commits.submit(later)
    gate.set()
    with pytest.raises(sqlite3.IntegrityError):
        clash.wait()
    assert later.wait() == "y"
    assert log == ["decide clash", "undo clash", "decide later"]
    assert rows(conn) == {"taken": 0, "fine": 2}


def test_a_decision_that_writes_nothing_is_answered_before_the_commit(conn, commits):
    gate = hold_writer(commits)
    release = threading.Event()
    quick = Job(decide=lambda: Decision("read only"), key="a")
    commits.submit(quick)
    slow = commits.submit(Job(lambda c: release.wait(10)))  # the same batch, committing slowly
    batches = commits.batches
    gate.set()
    assert quick.wait() == "read only"
    # Only the holder's transaction is over: the batch with the answered
    # decision is still committing.
    assert commits.batches == batches + 1
    release.set()
    slow.wait()
    assert commits.batches == batches + 2


def test_a_decision_that_raises_fails_alone(conn, commits):
    class Refused(Exception):
        pass

    def refuse():
        raise Refused("no")

    bad = commits.submit(Job(decide=refuse, key="a"))
    with pytest.raises(Refused):
        bad.wait()
    good = commits.submit(Job(decide=lambda: Decision(1, [(INSERT, [("ok", 1)])]), key="a"))
    assert good.wait() == 1
    assert rows(conn) == {"ok": 1}


def test_close_decides_and_commits_what_was_held(conn):
    commits = GroupCommitter(conn, "test store")
    gate = hold_writer(commits)
    jobs = [Job(decide=lambda n=n: Decision(n, [(INSERT, [(f"r{n}", n)])]), key="same")
            for n in range(3)]
    for job in jobs:
        commits.submit(job)
    wait_queued(commits, 3)
    closer = threading.Thread(target=commits.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert [job.wait() for job in jobs] == [0, 1, 2]
    assert rows(conn) == {"r0": 0, "r1": 1, "r2": 2}


def test_inserts_merged_across_jobs_and_chunks(conn, commits):
    """More rows than one multi-row INSERT takes, from many jobs in one batch,
    then an update and two INSERT … SELECTs (which are not one-row
    INSERTs): every row lands, in order."""
    gate = hold_writer(commits)
    n = INSERT_CHUNK * 2 + 7
    jobs = [commits.submit(Job([(INSERT, [(f"k{i}", i)])])) for i in range(n)]
    jobs.append(commits.submit(Job([("UPDATE t SET v = v + 1000 WHERE k = ?", [("k0",)])])))
    copy = "INSERT INTO t SELECT k || '_copy', v FROM t WHERE k = ?"
    jobs += [commits.submit(Job([(copy, [("k0",)])])), commits.submit(Job([(copy, [("k1",)])]))]
    jobs.append(commits.submit(Job([(INSERT, [("last", -1)])])))
    wait_queued(commits, n + 4)
    batches = commits.batches
    inserts: list[str] = []
    conn.set_trace_callback(lambda sql: sql.startswith("INSERT INTO t VALUES")
                            and inserts.append(sql))
    gate.set()
    for job in jobs:
        job.wait()
    assert commits.batches - batches == 2  # the holder's, then all of them
    # The one-row INSERTs ran as one statement a chunk (then the last, alone
    # after the others, as itself), not one a row.
    assert [sql.count("),(") + 1 for sql in inserts] == [INSERT_CHUNK, INSERT_CHUNK, 7, 1]
    assert rows(conn) == {**{f"k{i}": i for i in range(n)}, "k0": 1000, "last": -1,
                          "k0_copy": 1000, "k1_copy": 1}


def test_an_undo_that_raises_is_logged_and_every_waiter_still_wakes(conn, commits, caplog):
    conn.execute("INSERT INTO t VALUES ('taken', 0)")
    gate = hold_writer(commits)

    def broken_undo():
        raise RuntimeError("undo bug")

    clash = commits.submit(Job(decide=lambda: Decision(
        "x", [(INSERT, [("taken", 1)])], undo=broken_undo), key="a"))
    other = commits.submit(Job([(INSERT, [("other", 1)])]))
    gate.set()
    with pytest.raises(sqlite3.IntegrityError):
        clash.wait()
    other.wait()
    assert "Undoing a decision whose write failed" in caplog.text
    assert rows(conn) == {"taken": 0, "other": 1}
