"""The fleet's Placement, counted at its own side, and read from its
database.

Production shape (``GunicornPlacement``): placement's WSGI application
under gunicorn's worker processes, on a MariaDB database of the run's own;
every request is a line of gunicorn's access log, with its duration and
time. For the functional test, ``compute_agent.testing.local_placement`` on SQLite
serves it (``SqlitePlacement``): its log has the request lines without
times. Either way the fleet's "in step" is read from the database with
one query per table, so checking it costs Placement no request.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from compute_agent.testing.local_placement import LocalPlacement, free_port

# method, path?query, status, microseconds, [time], user agent
ACCESS_FORMAT = '%(m)s %(U)s?%(q)s %(s)s %(D)s %(t)s "%(a)s"'
ACCESS_LINE = re.compile(r'(\S+) (\S+) (\d+)(?: (\d+) \[([^\]]+)\] "(.*)")?$')
# What the fleet tool itself sends as a scheduler (its instances, its
# candidate queries): kept apart from the agents' requests.
TOOL_AGENT = "fleet-scheduler"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    status: int
    seconds: float | None = None
    at: float | None = None
    user_agent: str = ""

    @property
    def from_agent(self) -> bool:
        return self.user_agent != TOOL_AGENT


def parse_line(line: str) -> Request | None:
    m = ACCESS_LINE.match(line.strip())
    if m is None:
        return None
    method, path, status, micros, when, agent = m.groups()
    path = path[:-1] if path.endswith("?") else path
    at = (datetime.strptime(when, "%d/%b/%Y:%H:%M:%S %z").timestamp()
          if when else None)
    return Request(method, path, int(status),
                   None if micros is None else int(micros) / 1e6, at, agent or "")


class RequestLog:
    """Lines read as they come; ``mark()`` and ``since(mark)`` delimit a
    scenario."""

    def __init__(self, path: Path):
        self.path = path
        self._lines: list[Request] = []
        self._offset = 0

    def read(self) -> list[Request]:
        if self.path.exists():
            with open(self.path) as f:
                f.seek(self._offset)
                chunk = f.read()
            whole = chunk[:chunk.rfind("\n") + 1]
            self._offset += len(whole.encode())
            self._lines += [r for r in map(parse_line, whole.splitlines()) if r]
        return self._lines

    def mark(self) -> int:
        return len(self.read())

    def since(self, mark: int, end: int | None = None) -> list[Request]:
        return self.read()[mark:end]


def digest(tree: dict[str, list]) -> str:
    """One tree's digest: {name: [parent name, {class: [total, reserved]},
    traits]}."""
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


def _trees(rows_providers, rows_inventories, rows_traits) -> dict[str, str]:
    """root uuid -> the digest of its tree"""
    out: dict[str, dict] = {}
    where: dict[str, dict] = {}
    for name, parent, root in rows_providers:
        tree = out.setdefault(root, {})
        tree[name] = [parent, {}, []]
        where[name] = tree
    for name, rc, total, reserved in rows_inventories:
        where[name][name][1][rc] = [total, reserved]
    for name, trait in rows_traits:
        where[name][name][2].append(trait)
    for tree in out.values():
        for entry in tree.values():
            entry[2].sort()
    return {root: digest(tree) for root, tree in out.items()}


PROVIDERS_SQL = ("SELECT rp.name, parent.name, root.uuid FROM resource_providers rp "
                 "LEFT JOIN resource_providers parent ON rp.parent_provider_id = parent.id "
                 "JOIN resource_providers root ON rp.root_provider_id = root.id")
INVENTORIES_SQL = ("SELECT rp.name, rc.name, i.total, i.reserved FROM inventories i "
                   "JOIN resource_providers rp ON i.resource_provider_id = rp.id "
                   "JOIN resource_classes rc ON i.resource_class_id = rc.id")
TRAITS_SQL = ("SELECT rp.name, t.name FROM resource_provider_traits rpt "
              "JOIN resource_providers rp ON rpt.resource_provider_id = rp.id "
              "JOIN traits t ON rpt.trait_id = t.id")


class SqlitePlacement:
    """compute_agent.testing.local_placement on SQLite, one process."""

    def __init__(self, directory: Path):
        self.server = LocalPlacement(directory)
        self.url = self.server.url
        self.log = RequestLog(self.server.request_log)
        self.workers = 1
        self.database = "sqlite"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def close(self) -> None:
        self.stop()

    def trees(self) -> dict[str, str]:
        db = sqlite3.connect(self.server.directory / "placement.db", timeout=30)
        try:
            return _trees(db.execute(PROVIDERS_SQL), db.execute(INVENTORIES_SQL),
                          db.execute(TRAITS_SQL))
        finally:
            db.close()


class GunicornPlacement:
    """Placement as production runs it: ``workers`` processes (gunicorn's
    sync workers) on a MariaDB database created for the run and dropped by
    ``close()``; the server at ``mysql_host``:``mysql_port`` is not
    otherwise touched."""

    def __init__(self, directory: Path, workers: int, mysql_host: str = "127.0.0.1",
                 mysql_port: int = 3306, mysql_user: str = "root", mysql_password: str = "",
                 max_allocation_candidates: int = 1000):
        import pymysql  # the fleet extra (setup.cfg)
        self._pymysql = pymysql
        self.directory = directory
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database = f"fleet_{uuid.uuid4().hex[:12]}"
        self._mysql = {"host": mysql_host, "port": mysql_port, "user": mysql_user,
                       "password": mysql_password}
        self.log = RequestLog(directory / "access.log")
        self.proc: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)
        with self._connect(None) as db, db.cursor() as cur:
            cur.execute(f"CREATE DATABASE {self.database}")
        credentials = mysql_user + (f":{mysql_password}" if mysql_password else "")
        (directory / "placement.conf").write_text(
            "[api]\nauth_strategy = noauth2\n"
            f"[placement]\nmax_allocation_candidates = {max_allocation_candidates}\n"
            "[placement_database]\n"
            f"connection = mysql+pymysql://{credentials}@{mysql_host}:{mysql_port}/"
            f"{self.database}\n")
        subprocess.run([str(Path(sys.executable).with_name("placement-manage")),
                        "--config-file", str(directory / "placement.conf"), "db", "sync"],
                       check=True, stdout=subprocess.DEVNULL)

    def _connect(self, database: str | None):
        return self._pymysql.connect(database=database, autocommit=True, **self._mysql)

    def start(self, timeout: float = 600) -> None:
        env = {**os.environ, "OS_PLACEMENT_CONFIG_DIR": str(self.directory)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--workers", str(self.workers),
             "--bind", f"127.0.0.1:{self.port}", "--backlog", "4096",
             "--access-logfile", str(self.directory / "access.log"),
             "--access-logformat", ACCESS_FORMAT, "--no-control-socket",
             "placement.wsgi.api:application"],
            env=env, stdout=subprocess.DEVNULL,
            stderr=open(self.directory / "gunicorn.err", "a"))
        deadline = time.monotonic() + timeout
        import requests
        while time.monotonic() < deadline:
            try:
                requests.get(self.url, timeout=2)
                return
            except requests.RequestException:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gunicorn exited; see {self.directory}/gunicorn.err") from None
                time.sleep(0.1)
        raise RuntimeError("Placement did not answer")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()
        with self._connect(None) as db, db.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {self.database}")

    def trees(self) -> dict[str, str]:
        with self._connect(self.database) as db:
            rows = []
            for sql in (PROVIDERS_SQL, INVENTORIES_SQL, TRAITS_SQL):
                with db.cursor() as cur:
                    cur.execute(sql)
                    rows.append(cur.fetchall())
        return _trees(*rows)
