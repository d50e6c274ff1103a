"""Group commit: one writer thread, one transaction per batch of jobs.

Every job queued while a transaction is in flight goes into the next one,
so concurrent callers share one fsync. A job is one of:

- statements (SQL and its parameter rows, as data). Consecutive jobs of
  one shape in a batch run as one statement each: an INSERT as one
  multi-row INSERT, anything else as one ``executemany``.
- a function of the connection, for what statements cannot say.
- a decision: a function with no arguments that runs in the writer thread
  just before the transaction and returns a ``Decision`` (the answer, the
  statements that record it, and how to undo its in-memory effect).

Decisions run here, rather than in their callers' threads, for two
reasons. Writes reach the disk in exactly the order they were decided,
so a device given back and then claimed by another instance is released
before it is inserted again. And a caller costs one wait and one wake-up:
32 threads that each decided under a shared lock spent most of their time
handing that lock and the GIL to one another (``tools/bench claims``).

Decisions are serialized per key (an instance): at most one per
transaction, so a later one sees the earlier one committed or undone,
never in flight. A decision that writes nothing is answered at once. A
decision must not wait for the store: it runs in the thread that would
have to answer.

A batch that fails is retried job by job, each in a savepoint, so a bad
job fails alone. A failed decision's undo runs in this thread before any
later decision is made.

A committer may be given a ``CommitGuard`` (the agent that holds the
state directory gives one: compute_agent/store/holding.py): it adds its own write
to every transaction, and is asked before the transaction and once it is
committed, before any job of it is answered. When it refuses, the batch's
jobs fail (their undo runs) and nothing of them is acknowledged.
"""
from __future__ import annotations

import functools
import logging
import queue
import re
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from compute_agent.store.errors import StoreError

LOG = logging.getLogger(__name__)


# A write as data: an SQL statement and the parameter rows it runs for.
Statement = tuple[str, list[tuple]]

# Rows per multi-row INSERT: well under SQLite's limit on bound values.
INSERT_CHUNK = 256


def run_statements(conn: sqlite3.Connection, statements: list[Statement]) -> None:
    for sql, rows in statements:
        if rows:
            conn.executemany(sql, rows)


_ONE_ROW_INSERT = re.compile(r"(INSERT (?:OR \w+ )?INTO \w+ VALUES )(\([?, ]+\))")


@functools.lru_cache(maxsize=256)
def _insert_rows_sql(sql: str, rows: int) -> str | None:
    """A one-row ``INSERT … VALUES (?, …)`` made into one for ``rows`` rows
    (None for any other statement). Python's sqlite3 gives up the GIL
    around every row's step; one statement gives it up once for them all."""
    match = _ONE_ROW_INSERT.fullmatch(sql)
    if match is None:
        return None
    return match[1] + ",".join([match[2]] * rows)


def _run_rows(conn: sqlite3.Connection, sql: str, rows: list[tuple]) -> None:
    """``sql`` for each of ``rows``, in order."""
    for start in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[start:start + INSERT_CHUNK]
        many = _insert_rows_sql(sql, len(chunk)) if len(chunk) > 1 else None
        if many is None:
            conn.executemany(sql, chunk)
        else:
            conn.execute(many, [value for row in chunk for value in row])


@dataclass
class Decision:
    """What one decided operation does: its answer, its write (None when
    there is nothing to write) and how to undo its in-memory effect if the
    write cannot be committed."""

    result: object = None
    write: list[Statement] | None = None
    undo: Callable[[], None] | None = None


class Job:
    __slots__ = ("_pending", "decide", "error", "key", "result", "undo", "work")

    def __init__(self, work=None, decide: Callable[[], Decision] | None = None,
                 key: str | None = None):
        self.work = work
        self.decide = decide
        self.key = key
        self.undo: Callable[[], None] | None = None
        # Held until the job is committed or failed. A bare lock rather
        # than an Event: waking 32 waiters through Condition objects costs
        # more CPU than the commit they wait for.
        self._pending = threading.Lock()
        self._pending.acquire()
        self.result: object = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        self._pending.release()

    def wait(self):
        """Block until the job is on disk; its result, or its error raised."""
        self._pending.acquire()
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def shape(self) -> tuple[str, ...] | None:
        """The job's statements, when it is data rather than code."""
        if callable(self.work):
            return None
        return tuple(sql for sql, _ in self.work)

    def run(self, conn: sqlite3.Connection) -> None:
        if callable(self.work):
            self.result = self.work(conn)
        else:
            run_statements(conn, self.work)

    def fail(self, error: BaseException) -> None:
        self.error = self.error or error


class CommitGuard(Protocol):
    """What the holder of the store checks and records at each group
    commit. ``check`` and ``committed`` raise StoreError to refuse."""

    def check(self) -> None:
        """Before the transaction: may it be written at all?"""

    def in_transaction(self, conn: sqlite3.Connection) -> None:
        """The guard's own write, last in every transaction."""

    def committed(self) -> None:
        """After the commit, before any of its jobs is answered."""


class GroupCommitter:
    """The writer thread of one connection, and the queue that feeds it."""

    def __init__(self, conn: sqlite3.Connection, label: str,
                 guard: CommitGuard | None = None):
        self._conn = conn
        self._label = label  # what error messages call the store
        self._guard = guard
        # Whether the batch being committed changed a row: a batch that
        # changed none (every job refused, or statements that matched
        # nothing) is no commit of the store's, and leaves its sequence.
        self._changed = False
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        # Orders submissions against close(): a job queued before the
        # closing sentinel is committed, none is queued after it.
        self._queue_lock = threading.Lock()
        self._closed = False
        self.batches = 0  # transactions run, and the jobs they carried
        self.jobs = 0
        self._thread = threading.Thread(target=self._loop, name="store-committer",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Job:
        """Queue ``job``. Jobs commit in the order they are submitted."""
        with self._queue_lock:
            if self._closed:
                raise StoreError(f"{self._label}: the store is closed")
            self._queue.put(job)
        return job

    def queued(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Commit everything queued, then stop."""
        with self._queue_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()

    # --- the writer thread ------------------------------------------------

    def _loop(self) -> None:
        held: list[Job] = []  # decisions waiting for their key's last one
        closing = False
        while True:
            jobs, closed = self._take(wait=not held and not closing)
            closing = closing or closed
            batch, held = self._decide(held + jobs)
            if batch:
                self._commit(batch)
            if closing and not held:
                return

    def _take(self, wait: bool) -> tuple[list[Job], bool]:
        """Every job queued now (waiting for one first if ``wait``), and
        whether the closing sentinel was among them."""
        jobs: list[Job] = []
        try:
            job = self._queue.get() if wait else self._queue.get_nowait()
            while job is not None:
                jobs.append(job)
                job = self._queue.get_nowait()
            return jobs, True
        except queue.Empty:
            return jobs, False

    @staticmethod
    def _decide(jobs: list[Job]) -> tuple[list[Job], list[Job]]:
        """Run the decisions among ``jobs``: the jobs to commit now, and the
        decisions held for the next transaction (their key already has a
        write in this one)."""
        batch: list[Job] = []
        held: list[Job] = []
        writing: set[str | None] = set()
        for job in jobs:
            if job.decide is None:
                batch.append(job)
            elif job.key in writing:
                held.append(job)
            else:
                try:
                    decision = job.decide()
                except BaseException as e:  # noqa: BLE001 - the caller's to see
                    job.error = e
                    job.finish()
                    continue
                job.result = decision.result
                if not decision.write:
                    job.finish()
                    continue
                job.work, job.undo = decision.write, decision.undo
                writing.add(job.key)
                batch.append(job)
        return batch, held

    def _commit(self, batch: list[Job]) -> None:
        conn = self._conn
        self._changed = False
        try:
            if self._guard is not None:
                self._guard.check()
            committed = (self._commit_merged(conn, batch)
                         or self._commit_one_by_one(conn, batch))
            if committed and self._changed and self._guard is not None:
                self._guard.committed()
        except StoreError as e:  # the guard's refusal: it says why
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for job in batch:
                job.fail(e)
        except BaseException as e:  # noqa: BLE001 - the writer outlives any batch
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for job in batch:
                job.fail(StoreError(f"{self._label}: commit failed: {e!r}"))
        finally:
            self.batches += 1
            self.jobs += len(batch)
            for job in batch:
                if job.error is not None and job.undo is not None:
                    try:
                        job.undo()
                    except Exception:
                        LOG.exception("Undoing a decision whose write failed")
                job.finish()

    def _guard_write(self, conn: sqlite3.Connection, changed: bool) -> None:
        self._changed = changed
        if changed and self._guard is not None:
            self._guard.in_transaction(conn)

    def _commit_merged(self, conn: sqlite3.Connection, batch: list[Job]) -> bool:
        """The fast path, for a batch of statement jobs: consecutive jobs
        of one shape run as one statement each. Their order within a job is
        kept; jobs of one batch never touch the same rows (decisions are
        one per key per batch). False when it does not apply or fails, with
        nothing written."""
        shapes = [job_shape for job in batch if (job_shape := job.shape) is not None]
        if len(batch) < 2 or len(shapes) < len(batch):
            return False
        try:
            conn.execute("BEGIN IMMEDIATE")
            before = conn.total_changes
            start = 0
            while start < len(batch):
                shape = shapes[start]
                end = start
                while end < len(batch) and shapes[end] == shape:
                    end += 1
                for i, sql in enumerate(shape):
                    rows = [r for job in batch[start:end] for r in job.work[i][1]]
                    if rows:
                        _run_rows(conn, sql, rows)
                start = end
            self._guard_write(conn, conn.total_changes != before)
            conn.execute("COMMIT")
            return True
        except Exception:  # noqa: BLE001 - the jobs are retried one by one
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return False

    def _commit_one_by_one(self, conn: sqlite3.Connection, batch: list[Job]) -> bool:
        """Each job in a savepoint of one transaction; False when that
        transaction could not be committed (every job failed)."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            changed = False
            for job in batch:
                conn.execute("SAVEPOINT job")
                before = conn.total_changes
                try:
                    job.run(conn)
                    conn.execute("RELEASE job")
                    changed = changed or conn.total_changes != before
                except BaseException as e:  # noqa: BLE001 - the job's caller gets it
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    job.error = e
            self._guard_write(conn, changed)
            conn.execute("COMMIT")
            return True
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for job in batch:
                job.fail(StoreError(f"{self._label}: commit failed: {e}"))
            return False
