"""tools/install-service's own checks, without installing anything (the
install itself: tests/functional/test_install_service.py)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    loader = importlib.machinery.SourceFileLoader(
        "install_service", str(ROOT / "tools" / "install-service"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # its dataclasses look their module up
    loader.exec_module(module)
    return module


def test_a_checkout_under_tmp_is_warned_of_once():
    install = load()
    lines = install.private_tmp_warnings(
        (Path("/tmp/compute-agent"), Path("/tmp/compute-agent"), Path("/var/tmp/venv"),
         Path("/opt/compute-agent"), Path("/tmpfoo")))
    assert [line.split(":")[2].split()[0] for line in lines] == [
        "/tmp/compute-agent", "/var/tmp/venv"]
    assert all("PrivateTmp=yes" in line and "\n" not in line for line in lines)


def test_what_the_unit_makes_private_is_what_it_says():
    """PrivateTmp=yes, and ProtectHome=yes for the refusal beside it."""
    unit = (ROOT / "etc" / "systemd" / "compute-agent.service").read_text().splitlines()
    assert {"PrivateTmp=yes", "ProtectHome=yes"} <= set(unit)
