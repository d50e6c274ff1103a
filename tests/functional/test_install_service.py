"""tools/install-service into a root of the test's own, and the installed
unit checked by systemd's own verifier."""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

from compute_agent import config

TOP = Path(__file__).resolve().parents[2]
INSTALL = TOP / "tools/install-service"
UNIT = Path("etc/systemd/system/compute-agent.service")
CONFIG = Path("etc/compute-agent/compute-agent.conf")
VENV = Path(sys.prefix)  # the project's virtualenv, which runs these tests


def install(root: Path, *args: str, venv: Path = VENV) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(INSTALL), "--root", str(root),
                           "--venv", str(venv), *args],
                          capture_output=True, text=True, timeout=60)


def with_system_units(root: Path) -> None:
    """What the unit needs of the host besides our files: systemd's own
    units (sysinit.target, network-online.target...) and ExecReload='s kill,
    laid out as on Debian (/bin is /usr/bin)."""
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system",
                    symlinks=True)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2("/usr/bin/kill", root / "usr/bin/kill")
    (root / "bin").symlink_to("usr/bin")


def verify(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}", f"/{UNIT}"],
                          capture_output=True, text=True, timeout=60)


def unit_settings(root: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(root / UNIT)
    return dict(parser["Service"])


def test_the_installed_unit_passes_systemd_analyze_verify(tmp_path):
    root = tmp_path / "root"
    done = install(root)
    assert done.returncode == 0, done.stderr
    with_system_units(root)
    verified = verify(root)
    # verify exits 0 on mere warnings (an unknown directive, a bad value):
    # it must have nothing at all to say.
    assert (verified.returncode, verified.stdout + verified.stderr) == (0, "")

    # The command ExecStart= names is the one install-service put there.
    (root / "usr/local/bin/compute-agent").unlink()
    verified = verify(root)
    assert verified.returncode != 0
    assert "/usr/local/bin/compute-agent" in verified.stderr


def test_the_unit_agrees_with_the_agent_on_state_and_config(tmp_path):
    root = tmp_path / "root"
    assert install(root).returncode == 0
    service = unit_settings(root)
    assert service["Type"] == "notify" and service["WatchdogSec"]
    [state_path] = [opt.default for group, opts in config.list_opts() if group is None
                    for opt in opts if opt.name == "state_path"]
    assert f"/var/lib/{service['StateDirectory']}" == state_path
    assert f"--config-file /{CONFIG}" in service["ExecStart"]


def test_the_commands_run_the_projects_virtualenv(tmp_path):
    root = tmp_path / "root"
    assert install(root).returncode == 0
    for command in ("compute-agent", "compute-agent-manage", "compute-agent-ctl"):
        wrapper = root / "usr/local/bin" / command
        assert f"exec {VENV}/bin/{command} " in wrapper.read_text()
    ran = subprocess.run([str(root / "usr/local/bin/compute-agent-manage"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "compute-agent-manage" in ran.stdout


def test_install_is_idempotent_and_never_overwrites_the_operators_config(tmp_path):
    root = tmp_path / "root"
    assert install(root).returncode == 0
    config = root / CONFIG
    assert config.stat().st_mode & 0o777 == 0o640
    assert config.read_text() == (TOP / "etc/compute-agent/compute-agent.conf.skeleton"
                                  ).read_text()
    config.write_text("[DEFAULT]\nhost = mine\n")

    again = install(root)
    assert again.returncode == 0, again.stderr
    said = {line.split(": ", 1)[1]: line.split(": ", 1)[0]
            for line in again.stdout.splitlines() if ": /" in line}
    assert said.pop(str(config)) == "kept (exists)"
    assert set(said.values()) == {"unchanged"}, said
    assert config.read_text() == "[DEFAULT]\nhost = mine\n"


def test_dry_run_changes_nothing(tmp_path):
    root = tmp_path / "root"
    done = install(root, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"would install: {root / UNIT}" in done.stdout
    assert not root.exists()


def test_a_virtualenv_the_unit_would_hide_is_refused_in_one_line(tmp_path):
    done = install(tmp_path / "root", venv=Path("/root/compute-agent/.venv"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "/root" in done.stderr and "ProtectHome" in done.stderr
    assert not (tmp_path / "root").exists()
