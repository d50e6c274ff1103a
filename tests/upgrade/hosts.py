"""The hosts an upgrade test runs: their configs (which every pinned version
reads: options an older version does not know are ignored by it), the new
agent's daemon, and what the tests compare across the upgrade."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

from compute_agent.drivers.fake_sysfs import SysfsBuilder
from tests.functional.helpers import get, wait_for, write_conf
from tests.functional.libvirt_host import DEVICE_SPECS, PF

REPO = Path(__file__).resolve().parents[2]
BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
PMEM_BYTES = 64 << 20
PMEM_RC = "CUSTOM_PMEM_NAMESPACE_SMALL"
# The QEMU hosts' CPUs (this machine has two): CPU 0 shared, CPU 1
# dedicated, so a resize can move a guest between a pinned and a shared CPU.
SHARED_CPU, DEDICATED_CPU = 0, 1


class QemuHost:
    """A host on a private libvirtd (QEMU/KVM): a shared and a dedicated
    CPU, and two pmem namespaces whose "devices" are files (ndctl JSON names
    them; a regular file backs an nvdimm as a dax device does)."""

    def __init__(self, root: Path, daemon, placement_url: str, prefix: str):
        self.dir = root
        self.daemon = daemon
        self.url = placement_url
        self.name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        (root / "sys").mkdir(parents=True)
        namespaces = []
        for n in range(2):
            backing = daemon.root / f"pmem-{self.name}-{n}"
            backing.write_bytes(b"")
            os.truncate(backing, PMEM_BYTES)
            namespaces.append({"dev": f"namespace0.{n}", "mode": "devdax",
                               "size": PMEM_BYTES, "name": f"ns-{self.name}-{n}",
                               "numa_node": 0, "chardev": f"..{backing}"})
        (root / "ndctl.json").write_text(json.dumps(namespaces))
        self.conf = write_conf(
            root, placement_url, self.name, host_dict=None,
            DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(root / "sys"),
                     "transport_url": BROKER},
            libvirt={"connection_uri": daemon.uri, "live_migration_uri": daemon.uri,
                     "instances_path": str(root / "instances")},
            compute={"cpu_dedicated_set": str(DEDICATED_CPU),
                     "cpu_shared_set": str(SHARED_CPU)},
            pmem={"namespaces": "SMALL:" + "|".join(n["name"] for n in namespaces),
                  "ndctl_json": str(root / "ndctl.json")})

    @property
    def state(self) -> Path:
        return self.dir / "state"

    def providers(self) -> dict[str, str]:
        """Placement's providers of this host: name -> uuid."""
        root = (self.state / "compute_id").read_text().strip()
        return {r["name"]: r["uuid"] for r in
                get(self.url, f"/resource_providers?in_tree={root}")["resource_providers"]}

    def allocations(self, pinned: bool, pmem: bool) -> dict:
        cell = self.providers()[f"{self.name}_numa_0"]
        out = {cell: {"resources": {"PCPU" if pinned else "VCPU": 1, "MEMORY_MB": 64}}}
        if pmem:
            out[self.providers()[f"{self.name}_pmem_SMALL_numa_0"]] = {
                "resources": {PMEM_RC: 1}}
        return out


class DeviceHost:
    """A host on libvirt's test driver, for what QEMU here cannot have: a
    VF and an mdev (tests/functional/libvirt_host.py's devices). The test
    driver keeps its domains only in the connection that made them, so the
    domains an old version defined are written into the host file, as a
    libvirtd keeps its domains across an agent's restart."""

    def __init__(self, root: Path, placement_url: str):
        self.dir = root
        self.url = placement_url
        self.name = f"td-{uuid.uuid4().hex[:6]}"
        self.sys = SysfsBuilder(root / "sys")
        b = self.sys
        b.add_numa_node(0, "0-3", 8192)
        b.add_numa_node(1, "4-7", 8192)
        b.add_pf(PF, "8086", "10fb", "10ed", numa_node=1, total_vfs=8, num_vfs=2,
                 driver="ixgbe", vf_driver="ixgbevf")
        b.add_mdev_parent(GPU, 1, {MDEV_TYPE: ("GRID M60-2Q", 4)})
        # pmem as ndctl lists it, as on the QEMU hosts: every pinned
        # version reads that the same way.
        (root / "ndctl.json").write_text(json.dumps([
            {"dev": f"namespace1.{n}", "mode": "devdax", "size": 64 << 30,
             "name": f"ns{n}", "numa_node": 1, "chardev": f"dax1.{n}"} for n in range(2)]))
        self.host_xml = root / "host.xml"
        self.domains: list[str] = []
        self.conf = write_conf(
            root, placement_url, self.name, host_dict=None,
            DEFAULT={"compute_driver": "libvirt", "sysfs_root": str(b.root),
                     "transport_url": BROKER},
            libvirt={"connection_uri": self.write_host(),
                     "instances_path": str(root / "instances")},
            compute={"cpu_dedicated_set": "6-7", "cpu_shared_set": "0-5"},
            pci={"device_spec": DEVICE_SPECS},
            devices={"enabled_mdev_types": MDEV_TYPE},
            pmem={"namespaces": "LARGE:ns0|ns1", "ndctl_json": str(root / "ndctl.json")})

    @property
    def state(self) -> Path:
        return self.dir / "state"

    def write_host(self) -> str:
        """The host file from the sysfs builder, with the kept domains."""
        text = self.sys.test_driver_host_xml()
        closing = text.rindex("</node>")
        self.host_xml.write_text(text[:closing] + "".join(self.domains) + text[closing:])
        return f"test://{self.host_xml}"

    def keep(self, domains: list[str]) -> None:
        """The old version's domains, and what its sysfs writes made (an
        mdev), into the host file the new agent's connection starts from."""
        self.sys.answer_mdev_writes()
        self.domains = domains
        self.write_host()

    def providers(self) -> dict[str, str]:
        root = (self.state / "compute_id").read_text().strip()
        return {r["name"]: r["uuid"] for r in
                get(self.url, f"/resource_providers?in_tree={root}")["resource_providers"]}

    def allocations(self, vf: bool = True) -> dict:
        p = self.providers()
        out = {p[f"{self.name}_numa_1"]: {"resources": {"VCPU": 1, "MEMORY_MB": 64}},
               p[f"{self.name}_pci_{GPU.replace(':', '_').replace('.', '_')}"]: {
                   "resources": {"VGPU": 1}},
               p[f"{self.name}_pmem_LARGE_numa_1"]: {
                   "resources": {"CUSTOM_PMEM_NAMESPACE_LARGE": 1}}}
        if vf:
            out[p[f"{self.name}_{PF.upper()}"]] = {"resources": {"SRIOV_NET_VF": 1}}
        return out


GPU = "0000:06:00.0"
MDEV_TYPE = "nvidia-35"


def this_checkout(module: str, *args: str) -> list[str]:
    """A command of this checkout's (the new version's)."""
    return [sys.executable, "-m", module, *args]


def new_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


class NewAgent:
    """This checkout's compute-agent daemon on a host's config."""

    def __init__(self, host, api):
        self.host = host
        self.log = host.dir / "new-agent.log"
        self.proc = subprocess.Popen(this_checkout("compute_agent.cmd.agent", "--config-file",
                                                   str(host.conf)),
                                     env=new_env(), cwd=str(REPO),
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"))
        self.api = api
        wait_for(self._answers, timeout=120, interval=0.5)

    def _answers(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-4000:]
        try:
            info = self.api.probe.get_host_info(self.host.name)
        except Exception:  # not serving yet: not subscribed, or no cycle yet
            return False
        return bool(info.get("providers"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                # Where each of its threads waits, from the daemon's SIGUSR2
                # (faulthandler's dump to its log), before it is killed.
                dumped = self.log.stat().st_size
                self.proc.send_signal(signal.SIGUSR2)
                try:
                    wait_for(lambda: b"Thread 0x" in self.log.read_bytes()[dumped:], timeout=10,
                             message=f"{self.host.name}: no thread dump after SIGUSR2")
                finally:
                    self.proc.kill()
                    self.proc.wait()
                raise AssertionError(f"{self.host.name}: no exit 60 s after SIGTERM\n"
                                     + self.log.read_text()[-12000:])
            assert code == 0, self.log.read_text()[-4000:]


def manage(host, *args: str) -> subprocess.CompletedProcess:
    """This checkout's compute-agent-manage on the host's config."""
    return subprocess.run(this_checkout("compute_agent.cmd.manage", "--config-file", str(host.conf),
                                        *args),
                          env=new_env(), cwd=str(REPO), capture_output=True, text=True,
                          timeout=180)


def store_schema(state: Path) -> int:
    conn = sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
                   .fetchone()[0])
    finally:
        conn.close()


def placement_view(url: str, providers: dict[str, str]) -> dict[str, dict]:
    """What Placement holds of a host's providers: by name, uuid,
    inventories (without generations) and traits."""
    out = {}
    for name, rp in providers.items():
        out[name] = {"uuid": rp,
                     "inventories": get(url, f"/resource_providers/{rp}/inventories")[
                         "inventories"],
                     "traits": set(get(url, f"/resource_providers/{rp}/traits")["traits"])}
    return out


def consumer_allocations(url: str, consumer: str) -> dict:
    return {rp: body["resources"]
            for rp, body in get(url, f"/allocations/{consumer}")["allocations"].items()}
