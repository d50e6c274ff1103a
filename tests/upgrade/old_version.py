"""An earlier version of this project, installed from the repository's own
history into a virtualenv of its own, and run there.

Each pinned commit is unpacked with ``git archive`` and installed (not
editable) into ``<cache>/<commit>/venv``, with the third-party packages at
the versions this checkout's environment has, so what differs between the
two sides of an upgrade is only this project's code. The cache,
``~/.cache/compute-agent/upgrade`` unless ``COMPUTE_AGENT_UPGRADE_CACHE``
names another, is outside the checkout and keyed by the full commit SHA;
an entry is used only once its ``ready`` stamp is written, so a build that
was cut short is made again. A clone without the commit (a shallow one)
is an error that says so, never a skip.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OLD_SIDE = Path(__file__).resolve().parent / "old_side"


class HistoryMissing(RuntimeError):
    """The repository's history lacks a pinned commit."""


def cache_root() -> Path:
    return Path(os.environ.get("COMPUTE_AGENT_UPGRADE_CACHE",
                               Path.home() / ".cache" / "compute-agent" / "upgrade"))


def _git(*args: str, repo: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], check=False,
                          capture_output=True, timeout=120)


def check_in_history(commit: str, repo: Path = REPO) -> None:
    """Raises HistoryMissing, naming the commit and the fix, when the
    clone at ``repo`` does not hold it."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}", repo=repo).returncode == 0:
        return
    shallow = _git("rev-parse", "--is-shallow-repository", repo=repo).stdout.decode().strip()
    raise HistoryMissing(
        f"commit {commit} is not in this clone's history"
        + (" (a shallow clone: run 'git fetch --unshallow')" if shallow == "true" else "")
        + "; the upgrade tests install earlier versions from it")


def descends_from(commit: str, ancestor: str) -> bool:
    """Whether ``commit`` has ``ancestor`` in its history (or is it)."""
    return _git("merge-base", "--is-ancestor", ancestor, commit).returncode == 0


def _constraints(into: Path) -> Path:
    """This environment's third-party packages at their versions."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable",
                             "--exclude", "compute-agent"],
                            check=True, capture_output=True, text=True, timeout=120).stdout
    path = into / "constraints.txt"
    path.write_text("".join(line + "\n" for line in frozen.splitlines()
                            if "==" in line and not line.startswith("#")))
    return path


class OldVersion:
    """One pinned commit, installed."""

    def __init__(self, commit: str):
        self.commit = commit
        self.dir = cache_root() / commit
        self.src = self.dir / "src"
        self.venv = self.dir / "venv"
        self.python = self.venv / "bin" / "python"
        self.built_in: float | None = None  # seconds, when this run built it

    @property
    def ready(self) -> bool:
        return (self.dir / "ready").is_file()

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def install(self) -> OldVersion:
        """Installed once; a second call, or another process's, reuses it."""
        check_in_history(self.commit)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.dir.parent / f"{self.commit}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.ready:
                started = time.monotonic()
                self._build()
                self.built_in = time.monotonic() - started
        return self

    def _build(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.src.mkdir(parents=True)
        archive = _git("archive", "--format=tar", self.commit)
        if archive.returncode != 0:
            raise HistoryMissing(f"git archive {self.commit}: {archive.stderr.decode()}")
        subprocess.run(["tar", "-x", "-C", str(self.src)], input=archive.stdout, check=True,
                       timeout=120)
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True,
                       timeout=300)
        result = subprocess.run(
            [str(self.python), "-m", "pip", "install", "-q", "-c",
             str(_constraints(self.dir)), str(self.src)],
            capture_output=True, text=True, timeout=1200)
        if result.returncode != 0:
            raise RuntimeError(f"installing {self.commit} into {self.venv} failed:\n"
                               f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        (self.dir / "ready").write_text(self.commit + "\n")

    def env(self) -> dict[str, str]:
        """The environment the old version runs in: its own venv, nothing
        of this checkout on its path."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def run(self, script: str, request: dict, timeout: float = 300) -> dict:
        """Runs old_side/<script>.py in the old version's venv."""
        return run_script(self.python, self.env(), self.dir, script, request, timeout,
                          self.commit[:7])

    def rpc_version(self) -> str:
        """The newest RPC API version its ledger lists."""
        ledger = ("try:\n    from agent.rpc.versions import VERSION\n"
                  "except ImportError:  # before the rpc package\n"
                  "    from agent.rpc_versions import VERSION\nprint(VERSION)")
        return subprocess.run([str(self.python), "-c", ledger], env=self.env(), cwd=str(self.dir),
                              capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()

    def popen(self, args: list[str], log: Path) -> subprocess.Popen:
        """A long-running command of the old version (its daemon, say)."""
        return subprocess.Popen(args, env=self.env(), cwd=str(self.dir),
                                stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


def run_script(python: str | Path, env: dict[str, str], cwd: Path, script: str,
               request: dict, timeout: float = 300, who: str = "") -> dict:
    """Runs old_side/<script>.py with ``python`` and ``request`` as JSON on
    its stdin; returns the JSON it prints last."""
    result = subprocess.run([str(python), str(OLD_SIDE / f"{script}.py")],
                            input=json.dumps(request), capture_output=True, text=True,
                            env=env, cwd=str(cwd), timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{script} on {who} exited {result.returncode}:\n"
                           f"{result.stderr[-6000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_here(script: str, request: dict, timeout: float = 300) -> dict:
    """Runs old_side/<script>.py with this checkout's code (the new side)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return run_script(sys.executable, env, REPO, script, request, timeout, "this checkout")
