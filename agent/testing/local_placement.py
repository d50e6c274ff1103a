"""Run a real ``openstack-placement`` locally on SQLite, for the demo, the
benchmarks and functional tests (ours and our users').

``LocalPlacement`` starts this module as a child process. The child serves
Placement on a loopback port with noauth2, and appends one line per request
("METHOD PATH STATUS") to a log file, so tests count requests at the HTTP
level, as Placement saw them.

    python -m agent.testing.local_placement --dir D [--port P]
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


def serve(directory: Path, port: int) -> None:
    faulthandler.register(signal.SIGUSR1)  # stacks to stderr, for a hang
    conf = write_config(directory)
    if not (directory / "placement.db").exists():
        subprocess.run([str(Path(sys.executable).with_name("placement-manage")),
                        "--config-file", str(conf), "db", "sync"],
                       check=True, stdout=subprocess.DEVNULL)
    os.environ["OS_PLACEMENT_CONFIG_DIR"] = str(directory)
    from placement.wsgi import api  # reads the config at import

    app = _counting(api.application, directory / "requests.log")
    server = make_server("127.0.0.1", port, app, server_class=_ThreadingServer,
                         handler_class=_QuietHandler)
    print(f"{READY} http://127.0.0.1:{server.server_port}", flush=True)
    # Nobody reads the pipe after that line; Placement's own request log
    # would fill it and block the server. Send it where stderr goes.
    os.dup2(2, 1)
    server.serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPlacement:
    """A Placement child process that can be stopped and started again on
    the same port and database."""

    def __init__(self, directory: Path, port: int | None = None):
        self.directory = Path(directory)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def request_log(self) -> Path:
        return self.directory / "requests.log"

    def start(self, timeout: float = 60) -> "LocalPlacement":
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.testing.local_placement",
             "--dir", str(self.directory), "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=open(self.directory / "server.err", "a"),
            text=True)
        deadline = time.monotonic() + timeout
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
    args = parser.parse_args(argv)
    serve(args.dir.resolve(), args.port)


if __name__ == "__main__":
    main()
