"""What every console script does alike, run as operators run them (the
console scripts, in subprocesses, this checkout's code): --help says what
the command does, --version, errors as JSON with --json, and a reader that
closes stdout early (``| head -c 1``) gets no traceback. compute-agent-ctl
against a live agent: tests/functional/test_ctl.py."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from compute_agent.testing.local_placement import free_port
from tests.functional.helpers import write_conf

BIN = Path(sys.executable).parent
HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}
SUBCOMMANDS = {
    "compute-agent": [],
    "compute-agent-manage": ["tree", "audit", "rebuild-store", "heal"],
    "compute-agent-ctl": ["host-info", "build", "prep-resize", "live-migrate"],
}


def run(command: str, *args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True,
                          timeout=timeout)


def run_with_stdout_closed(command: str, *args) -> tuple[int, str]:
    """As ``command ... | head -c 0``: the reader has gone before the
    command writes anything. Returns the exit code and stderr."""
    proc = subprocess.Popen([str(BIN / command), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(60), err


def description_of(help_text: str) -> str:
    """The paragraph after the usage lines."""
    return help_text.split("\n\n")[1]


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_starts_with_what_the_command_does(command):
    done = run(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {command} --config-file F")
    description = description_of(done.stdout)
    assert len(description.split()) > 10 and not description.startswith("options")
    # The generic options are there, after it, and said to be generic.
    assert done.stdout.index("--log-file") > done.stdout.index(description)
    assert "oslo.config's and oslo.log's" in done.stdout
    for sub in SUBCOMMANDS[command]:
        sub_help = run(command, sub, "--help")
        assert sub_help.returncode == 0, sub_help.stderr
        assert sub_help.stdout.startswith(f"usage: {command} "), sub_help.stdout
        assert len(description_of(sub_help.stdout).split()) > 4, (sub, sub_help.stdout)
        assert "--log-file" not in sub_help.stdout


def test_ctl_build_help_says_what_the_spec_file_holds():
    done = run("compute-agent-ctl", "build", "--help")
    text = " ".join(done.stdout.split())
    for field in ('"instance_uuid"', '"spec"', '"name"', '"vcpus"', '"memory_mb"',
                  '"allocations"', '"resources"'):
        assert field in text, field
    assert "etc/compute-agent/instance-spec.example.json" in text


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_version(command):
    done = run(command, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{command} {metadata.version('compute-agent')}\n"


@pytest.fixture
def registered(tmp_path, placement) -> Path:
    """A fake-driver host, registered in Placement by one cycle."""
    conf = write_conf(tmp_path, placement.url, f"cli-{tmp_path.name[-12:]}", HOST)
    assert run("compute-agent", "--config-file", str(conf), "--once").returncode == 0
    return conf


def test_no_traceback_when_the_reader_closes_stdout(registered, tmp_path):
    """Each case writes to stdout when it is open (its normal run is
    tested elsewhere); closed, it ends as it would have: same exit code."""
    conf = ["--config-file", str(registered)]
    cases = [
        ("compute-agent", ["--help"], 0),
        ("compute-agent", ["--version"], 0),
        ("compute-agent", [*conf, "--once"], 0),
        ("compute-agent-manage", ["--help"], 0),
        ("compute-agent-manage", [*conf, "tree"], 0),
        ("compute-agent-manage", [*conf, "tree", "--json"], 0),
        ("compute-agent-manage", [*conf, "audit"], 0),
        ("compute-agent-manage", [*conf, "audit", "--json"], 0),
        ("compute-agent-manage", [*conf, "heal", "--dry-run", "--json"], 0),
        ("compute-agent-manage", ["--config-file", str(tmp_path / "absent.conf"), "tree",
                                  "--json"], 2),
        ("compute-agent-ctl", ["--help"], 0),
        ("compute-agent-ctl", ["build", "--help"], 0),
    ]
    for command, args, expected in cases:
        code, err = run_with_stdout_closed(command, *args)
        assert "Traceback" not in err and "BrokenPipe" not in err, (command, args, err)
        assert code == expected, (command, args, code, err)


def one_json_error(done: subprocess.CompletedProcess, exit_code: int) -> str:
    """An error with --json: the exit code, one JSON object on stdout."""
    assert done.returncode == exit_code, (done.returncode, done.stdout, done.stderr)
    answer = json.loads(done.stdout)
    assert answer["exit_code"] == exit_code and set(answer) == {"error", "exit_code"}
    return answer["error"]


def test_manage_errors_with_json_are_json(tmp_path):
    gone = write_conf(tmp_path / "gone", f"http://127.0.0.1:{free_port()}", "cli-gone",
                      HOST)
    done = run("compute-agent-manage", "--config-file", str(gone), "tree", "--json")
    assert "has not run on this host yet" in one_json_error(done, 2)
    assert "tree unknown" not in done.stderr

    bad = write_conf(tmp_path / "bad", f"http://127.0.0.1:{free_port()}", "cli-bad",
                     HOST, DEFAULT={"update_interval": "soon"})
    for args in (["tree", "--json"], ["audit", "--json"], ["heal", "--json"]):
        done = run("compute-agent-manage", "--config-file", str(bad), *args)
        assert "[DEFAULT] update_interval" in one_json_error(done, 2), args
    # Without --json, the same error is the one line on stderr.
    done = run("compute-agent-manage", "--config-file", str(bad), "tree")
    assert done.returncode == 2 and done.stdout == ""
    assert "[DEFAULT] update_interval" in done.stderr


def test_once_says_what_the_cycle_did(registered):
    done = run("compute-agent", "--config-file", str(registered), "--once")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    # Registered already: this cycle reads and finds nothing to write.
    assert line.startswith("cycle ok: 2 providers in Placement, 0 writes, 0 warnings, ")
    requests = int(line.split(", ")[3].split()[0])
    assert requests >= 1 and line.endswith(" s")
