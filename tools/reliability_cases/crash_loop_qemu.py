"""The crash loop (tools/reliability_cases/crash_loop.py) on the libvirt
driver over two private libvirtds with QEMU/KVM: real guests that outlive
the agents, real live migrations, kills while libvirtd migrates. A restart
takes seconds here, so the kills count in the hundreds."""
from __future__ import annotations

from pathlib import Path

from tests.functional.private_services import running_libvirtd_pair
from tests.reliability.crash_loop import QemuHypervisors
from tools.reliability_cases.crash_loop import rounds, services

NAME = "crash_loop_qemu"


def run(minutes: float, workdir: Path) -> list[dict]:
    with services(workdir) as placement_url, \
            running_libvirtd_pair(workdir / "libvirtd") as daemons:
        return [rounds("libvirt driver, QEMU/KVM", minutes * 60, workdir / "qemu",
                       placement_url, lambda root: QemuHypervisors(daemons))]
