"""One-time-use devices end to end: a compute-agent process on the libvirt
test driver over a fake sysfs tree, the session's real Placement and
RabbitMQ. The NIC (a whole device) and the PF's VFs are one-time-use, each
cleaned by a script whose outcome the test sets (ok, fail, hang, or wait
for a go file). A build claims the device, a delete gives it back: it stays
out of Placement's candidates until its cleaning succeeds; a failed or
timed-out cleaning keeps it out with one WARNING and the reason trait;
compute-agent-manage device clean and device release reach the running
agent over RPC; a restart keeps a device waiting.

update_interval is an hour: only the agent's own wake-ups (a device used
or freed, a cleaning's end, a release) start the cycles these tests wait
for.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from compute_agent.cmd.common import load_config
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.tree.ownership import CLEANING_FAILED_TRAIT
from tests.functional.helpers import get, put_allocations, unallocate, wait_for
from tests.functional.libvirt_host import NIC0, NO_NUMA, PF, Host

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
SPEC = {"name": "guest", "vcpus": 1, "memory_mb": 512}
NIC_CLASS = "CUSTOM_PCI_15B3_101B"
# The other whole device's: its cleanings time out soon.
QUICK_CLASS = "CUSTOM_PCI_1AF4_1041"
QUICK_TIMEOUT_S = 2
BOUND_S = 20.0
CLEANER = """#!/bin/sh
# A cleaning command: $1 is the device's PCI address; $DIR/mode says how
# it ends.
echo "cleaning $1"
case "$(cat {dir}/mode)" in
    ok) exit 0 ;;
    fail) echo "no media in $1"; exit 4 ;;
    hang) exec sleep 60 ;;
    wait) while [ ! -e {dir}/go ]; do sleep 0.01; done; rm -f {dir}/go; exit 0 ;;
esac
exit 9
"""


class Daemon:
    """The agent process, its host and what the test asks it."""

    def __init__(self, directory: Path, placement_url: str) -> None:
        self.dir = directory
        self.host = Host(directory, placement_url)
        self.host.build_default()
        script = directory / "clean.sh"
        script.write_text(CLEANER.format(dir=directory))
        script.chmod(0o755)
        self.mode("ok")
        specs = [
            json.dumps({"vendor_id": "8086", "product_id": "10ed",
                        "resource_class": "SRIOV_NET_VF", "one_time_use": "yes",
                        "clean_command": [str(script)]}),
            json.dumps({"vendor_id": "15b3", "product_id": "101b", "one_time_use": "yes",
                        "clean_command": f"{script}"}),
            json.dumps({"address": NO_NUMA, "one_time_use": "yes",
                        "clean_command": f"{script}", "clean_timeout": QUICK_TIMEOUT_S}),
        ]
        self.conf = self.host.write_conf(
            {"transport_url": BROKER, "update_interval": 3600},
            pci={"device_spec": specs})
        self.log = directory / "agent.log"
        self.api = ComputeAgentAPI(load_config(["--config-file", str(self.conf)]),
                                   timeout=30)
        self.proc: subprocess.Popen | None = None
        self._uuids: dict[str, str] = {}

    def mode(self, how: str) -> None:
        (self.dir / "go").unlink(missing_ok=True)
        (self.dir / "mode").write_text(how)

    def go(self) -> None:
        (self.dir / "go").touch()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "compute-agent"), "--config-file",
             str(self.conf)], stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=60)

    def _answers(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        try:
            self.api._call(self.host.name, "get_host_info", timeout=2)
            return True
        except Exception:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def uuid(self, suffix: str) -> str:
        """A provider's uuid, by its name's suffix (read once)."""
        if not self._uuids:
            self._uuids = {name: p["uuid"] for name, p in self.host.tree().items()}
        return self._uuids[self.host.p(suffix) if suffix else self.host.name]

    def provider(self, address: str) -> dict:
        """Placement's inventories and traits of the device's provider."""
        at = f"/resource_providers/{self.uuid(address.upper())}"
        return {"uuid": self.uuid(address.upper()),
                "inventories": get(self.host.url, f"{at}/inventories")["inventories"],
                "traits": set(get(self.host.url, f"{at}/traits")["traits"])}

    def numa(self, cell: int) -> str:
        return self.uuid(f"numa_{cell}")

    def build(self, address: str, rc: str, cell: int = 0) -> str:
        instance = str(uuid.uuid4())
        allocations = {
            self.numa(cell): {"resources": {"VCPU": 1, "MEMORY_MB": 512}},
            self.provider(address)["uuid"]: {"resources": {rc: 1}}}
        put_allocations(self.host.url, instance, allocations)
        self.api.build_instance(self.host.name, instance, SPEC, allocations)
        return instance

    def delete(self, instance: str) -> None:
        """As a conductor deletes: the agent first, then Placement."""
        self.api.delete_instance(self.host.name, instance)
        unallocate(self.host.url, instance)

    def offered(self, rc: str, amount: int = 1) -> bool:
        """Whether a scheduler asking for ``amount`` of ``rc`` finds this
        host."""
        return bool(get(self.host.url, f"/allocation_candidates?resources={rc}:{amount}"
                                       f"&in_tree={self.uuid('')}")["allocation_requests"])

    def cleaning(self, address: str) -> bool:
        """Whether the agent runs the device's cleaning now."""
        return any(e["address"] == address and e["cleaning"]
                   for e in self.api.list_device_uses(self.host.name))

    def reserved(self, address: str, rc: str) -> int:
        return self.provider(address)["inventories"][rc]["reserved"]

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).parent / "compute-agent-manage"), "--config-file",
             str(self.conf), *args], capture_output=True, text=True, timeout=120)

    def warnings_about(self, address: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines()
                if " WARNING " in line and address in line]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, placement, services):
    d = Daemon(tmp_path_factory.mktemp("one-time-use"), placement.url)
    d.start()
    yield d
    d.stop()
    d.api.close()


@pytest.fixture
def nic(daemon):
    """The NIC clean and offered, as each test leaves it."""
    daemon.mode("ok")
    wait_for(lambda: daemon.offered(NIC_CLASS), timeout=BOUND_S, interval=0.05)
    yield daemon
    daemon.mode("ok")


def test_the_nic_carries_novas_trait(nic):
    assert "HW_PCI_ONE_TIME_USE" in nic.provider(NIC0)["traits"]
    assert "HW_PCI_ONE_TIME_USE" in nic.provider(PF)["traits"]


def test_a_used_device_stays_out_until_its_cleaning_succeeds(nic):
    nic.mode("wait")
    instance = nic.build(NIC0, NIC_CLASS)
    # Out from the claim on, as nova does: the allocation holds the unit,
    # and the reserved holds it past the delete.
    wait_for(lambda: nic.reserved(NIC0, NIC_CLASS) == 1, timeout=BOUND_S, interval=0.05)
    nic.delete(instance)
    wait_for(lambda: nic.cleaning(NIC0), timeout=BOUND_S, interval=0.05)
    assert not nic.offered(NIC_CLASS)
    assert nic.reserved(NIC0, NIC_CLASS) == 1
    nic.go()
    wait_for(lambda: nic.offered(NIC_CLASS), timeout=BOUND_S, interval=0.05)
    assert nic.reserved(NIC0, NIC_CLASS) == 0
    assert f"cleaning {NIC0}" in nic.log.read_text()  # its output logged


def test_a_used_vf_takes_one_unit_of_its_pf_until_cleaned(nic):
    pf_units = nic.provider(PF)["inventories"]["SRIOV_NET_VF"]["total"]
    nic.mode("wait")
    instance = nic.build(PF, "SRIOV_NET_VF", 1)
    nic.delete(instance)
    wait_for(lambda: nic.reserved(PF, "SRIOV_NET_VF") == 1, timeout=BOUND_S,
             interval=0.05)
    assert nic.offered("SRIOV_NET_VF", pf_units - 1)
    assert not nic.offered("SRIOV_NET_VF", pf_units)
    nic.go()
    wait_for(lambda: nic.reserved(PF, "SRIOV_NET_VF") == 0, timeout=BOUND_S,
             interval=0.05)
    assert nic.offered("SRIOV_NET_VF", pf_units)


@pytest.mark.parametrize("address,rc,how,reason", [
    (NIC0, NIC_CLASS, "fail", f"exit status 4: no media in {NIC0}"),
    (NO_NUMA, QUICK_CLASS, "hang", f"timed out after {QUICK_TIMEOUT_S} s")])
def test_a_failed_cleaning_keeps_the_device_out_until_cleaned_again(
        nic, address, rc, how, reason):
    nic.mode(how)
    before = len(nic.warnings_about(address))
    nic.delete(nic.build(address, rc))
    wait_for(lambda: CLEANING_FAILED_TRAIT in nic.provider(address)["traits"],
             timeout=BOUND_S, interval=0.05)
    assert not nic.offered(rc)
    warnings = nic.warnings_about(address)[before:]
    assert len(warnings) == 1 and reason in warnings[0], warnings
    assert nic.api.list_device_uses(nic.host.name) == [{
        "address": address, "state": "cleaning_failed", "reason": reason,
        "held": False, "cleaning": False}]

    nic.mode("ok")
    cleaned = nic.manage("device", "clean", address.upper())
    assert (cleaned.returncode, cleaned.stdout.strip()) == (0, f"{address}: clean")
    wait_for(lambda: nic.offered(rc), timeout=BOUND_S, interval=0.05)
    assert CLEANING_FAILED_TRAIT not in nic.provider(address)["traits"]


def test_device_clean_says_when_the_cleaning_fails_again(nic):
    nic.mode("fail")
    nic.delete(nic.build(NIC0, NIC_CLASS))
    wait_for(lambda: CLEANING_FAILED_TRAIT in nic.provider(NIC0)["traits"],
             timeout=BOUND_S, interval=0.05)
    again = nic.manage("device", "clean", NIC0)
    assert again.returncode == 1
    assert again.stdout.strip() == (f"{NIC0}: cleaning failed (exit status 4: no media "
                                    f"in {NIC0})")
    listed = nic.manage("device", "list")
    assert (listed.returncode, listed.stdout.strip()) == (
        0, f"{NIC0}: cleaning failed (exit status 4: no media in {NIC0})")
    released = nic.manage("device", "release", NIC0, "--yes")
    assert (released.returncode, released.stdout.strip()) == (0, f"{NIC0}: clean")
    wait_for(lambda: nic.offered(NIC_CLASS), timeout=BOUND_S, interval=0.05)


def test_a_device_waiting_stays_out_across_a_restart(nic):
    nic.mode("fail")
    nic.delete(nic.build(NIC0, NIC_CLASS))
    wait_for(lambda: CLEANING_FAILED_TRAIT in nic.provider(NIC0)["traits"],
             timeout=BOUND_S, interval=0.05)
    nic.stop()
    nic.mode("ok")  # a cleaning run at the start would give it back: none runs
    nic.start()
    assert nic.api.list_device_uses(nic.host.name) == [{
        "address": NIC0, "state": "cleaning_failed", "held": False, "cleaning": False,
        "reason": f"exit status 4: no media in {NIC0}"}]
    assert not nic.offered(NIC_CLASS)
    assert nic.reserved(NIC0, NIC_CLASS) == 1
    released = nic.api.release_device(nic.host.name, NIC0)
    assert released == {"address": NIC0, "state": "clean"}
    wait_for(lambda: nic.offered(NIC_CLASS), timeout=BOUND_S, interval=0.05)


def test_device_release_of_a_held_device_is_refused_in_one_line(nic):
    held = nic.build(NIC0, NIC_CLASS)
    try:
        refused = nic.manage("device", "release", NIC0, "--yes")
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            "compute-agent-manage: address: is held by an instance; a device is cleaned "
            f"once its instance gave it back (value: '{NIC0}')")
    finally:
        nic.delete(held)


def test_cleaning_overhead(nic):
    """From the release (the delete's call) to Placement offering the
    unit again, with a cleaning command that does nothing."""
    seconds = []
    for _ in range(3):
        instance = nic.build(NIC0, NIC_CLASS)
        wait_for(lambda: nic.reserved(NIC0, NIC_CLASS) == 1, timeout=BOUND_S,
                 interval=0.05)
        started = time.monotonic()
        nic.delete(instance)
        wait_for(lambda: nic.offered(NIC_CLASS), timeout=BOUND_S, interval=0.01)
        seconds.append(time.monotonic() - started)
    print(f"\ncleaning overhead, release to offered again: median "
          f"{statistics.median(seconds):.3f} s, max {max(seconds):.3f} s "
          f"({', '.join(f'{s:.3f}' for s in seconds)})")
    assert max(seconds) < 5
