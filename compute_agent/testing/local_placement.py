"""Run a real ``openstack-placement`` locally on SQLite, for the demo, the
benchmarks and functional tests (ours and our users').

``LocalPlacement`` starts this module as a child process. The child serves
Placement on a loopback port with noauth2, and appends one line per request
("METHOD PATH STATUS") to a log file, so tests count requests at the HTTP
level, as Placement saw them.

By default one process serves, a thread per request: Placement's work is
Python under one GIL, so concurrent requests take turns. ``workers`` > 1
forks that many serving processes on one listening socket, as a
production Placement runs under uwsgi or mod_wsgi with several processes;
the benchmarks use it. Each process appends whole lines to the same log
(O_APPEND: one write per line), and writes a request's line before its
response is sent, so the log stays exact.

    python -m compute_agent.testing.local_placement --dir D [--port P] [--workers N]
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

READY = "placement ready"


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def _counting(app, log_path: Path):
    lock = threading.Lock()
    log = open(log_path, "a", buffering=1)

    def wrapper(environ, start_response):
        line = [environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")]
        if environ.get("QUERY_STRING"):
            line[1] += "?" + environ["QUERY_STRING"]

        def counting_start(status, headers, exc_info=None):
            line.append(status.split()[0])
            return start_response(status, headers, exc_info)

        try:
            return app(environ, counting_start)
        finally:
            with lock:
                log.write(" ".join(line) + "\n")

    return wrapper


def write_config(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "placement.conf"
    conf.write_text(
        "[api]\nauth_strategy = noauth2\n"
        "[placement_database]\n"
        f"connection = sqlite:///{directory / 'placement.db'}\n")
    return conf


def check_each_schema_once() -> None:
    """Make ``jsonschema.validate`` check a schema against its meta-schema
    once per process rather than on every call.

    Placement validates every query string and body with
    ``jsonschema.validate``, which checks the schema itself first each
    time; with jsonschema 4.18 or later that check is most of a
    ``GET /resource_providers?in_tree=``'s CPU (about 7 of 13 ms here).
    Placement's schemas are constants, so checking each once gives the
    same answers; the instance is still validated on every request. The
    checked schemas are kept so that no id is reused."""
    import jsonschema

    checked: dict[int, object] = {}

    def validate(instance, schema, cls=None, *args, **kwargs):
        cls = cls or jsonschema.validators.validator_for(schema)
        if id(schema) not in checked:
            cls.check_schema(schema)
            checked[id(schema)] = schema
        error = jsonschema.exceptions.best_match(
            cls(schema, *args, **kwargs).iter_errors(instance))
        if error is not None:
            raise error

    jsonschema.validate = validate


def serve(directory: Path, port: int, workers: int = 1) -> None:
    faulthandler.register(signal.SIGUSR1)  # stacks to stderr, for a hang
    conf = write_config(directory)
    if not (directory / "placement.db").exists():
        subprocess.run([str(Path(sys.executable).with_name("placement-manage")),
                        "--config-file", str(conf), "db", "sync"],
                       check=True, stdout=subprocess.DEVNULL)
    os.environ["OS_PLACEMENT_CONFIG_DIR"] = str(directory)
    check_each_schema_once()
    from placement.wsgi import api  # reads the config at import

    server = make_server("127.0.0.1", port, api.application,
                         server_class=_ThreadingServer, handler_class=_QuietHandler)
    children = [_fork_worker(server, directory) for _ in range(workers - 1)]
    server.set_app(_counting(api.application, directory / "requests.log"))
    print(f"{READY} http://127.0.0.1:{server.server_port}", flush=True)
    # Nobody reads the pipe after that line; Placement's own request log
    # would fill it and block the server. Send it where stderr goes.
    os.dup2(2, 1)

    if children:
        def stop(signum, frame):
            for pid in children:
                os.kill(pid, signal.SIGTERM)
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


def _fork_worker(server: WSGIServer, directory: Path) -> int:
    """A process that serves the same listening socket, and ends when the
    process that forked it does (stop() signals it; a kill cannot)."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.dup2(2, 1)

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    server.set_app(_counting(server.get_app(), directory / "requests.log"))
    try:
        server.serve_forever()
    finally:
        os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPlacement:
    """A Placement child process that can be stopped and started again on
    the same port and database."""

    def __init__(self, directory: Path, port: int | None = None, workers: int = 1):
        self.directory = Path(directory)
        self.port = port or free_port()
        self.workers = workers
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def request_log(self) -> Path:
        return self.directory / "requests.log"

    def start(self, timeout: float = 60) -> LocalPlacement:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compute_agent.testing.local_placement",
             "--dir", str(self.directory), "--port", str(self.port),
             "--workers", str(self.workers)],
            stdout=subprocess.PIPE, stderr=open(self.directory / "server.err", "a"),
            text=True)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None  # stdout=PIPE
        line = self.proc.stdout.readline()
        if READY not in line:
            self.stop()
            raise RuntimeError(f"Placement did not start: {line!r}; see "
                               f"{self.directory / 'server.err'}")
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("Placement did not open its port")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def requests(self) -> list[str]:
        """Every request served so far, oldest first."""
        if not self.request_log.exists():
            return []
        return self.request_log.read_text().splitlines()

    def mark(self) -> int:
        return len(self.requests())

    def requests_since(self, mark: int) -> list[str]:
        return self.requests()[mark:]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1,
                        help="serving processes (default 1)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, not {args.workers}")
    serve(args.dir.resolve(), args.port, args.workers)


if __name__ == "__main__":
    main()
