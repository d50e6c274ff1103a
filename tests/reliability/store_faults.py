"""Store faults under the real daemon: its state directory on a small file
system of our own, which fills up, turns read-only, or has its store cut
while the agent is stopped. Used by tests/reliability/test_store_faults.py and
tools/reliability.

What must hold whatever happens: a call either answers (and what it
answered is on disk) or fails with the declared StoreUnavailable; an
acknowledged assignment is never forgotten; a device is never in two live
assignments; and the daemon stays up, or refuses to start in one line
with exit 2.
"""
from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from compute_agent.cmd.common import load_config
from compute_agent.exception import StoreUnavailable
from compute_agent.messaging import messaging
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.store import node_identity
from tests.functional.helpers import placement_tree, put_allocations, unallocate, wait_for
from tests.functional.test_store_lost import PF, Daemon

SPEC = {"name": "g", "vcpus": 1, "memory_mb": 256}


class StoreDisk:
    """A small ext4 file system of our own (an image file on a loop
    device), mounted at ``path``, with ``errors=remount-ro`` as production
    hosts mount theirs: it fills up, and turns read-only under the running
    daemon the way the kernel does it on a detected error."""

    def __init__(self, image: Path, path: Path, size_mb: int = 8):
        self.image = image
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        # -m 0: root, which the agent runs as, gets no reserved blocks.
        _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
        self.mount()
        self.filler = path / "filler"
        self.repairs = 0

    def mount(self, mode: str = "rw") -> None:
        _run("mount", "-o", f"loop,{mode},errors=remount-ro", str(self.image),
             str(self.path))
        options = _run("findmnt", "-n", "-o", "OPTIONS", str(self.path)).split(",")
        if mode not in options:
            kernel = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
            raise AssertionError(f"{self.image} mounted {options}, not {mode}: "
                                 f"{kernel.splitlines()[-5:]}")
        if mode == "rw":
            os.chmod(self.path, 0o700)

    def fill(self) -> None:
        """Take every free block."""
        with open(self.filler, "ab", buffering=0) as f:
            chunk = b"\0" * 4096
            try:
                while True:
                    f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise

    def unfill(self) -> None:
        self.filler.unlink(missing_ok=True)
        # Into the journal now: an error that turns the file system
        # read-only aborts what is not, and the filler would come back.
        os.sync()

    def fail_read_only(self) -> None:
        """What ext4 does on an error it detects: the kernel remounts the
        file system read-only, files open for writing included."""
        device = _run("findmnt", "-n", "-o", "SOURCE", str(self.path)).strip()
        Path(f"/sys/fs/ext4/{Path(device).name}/trigger_fs_error").write_text(
            "reliability test\n")

    def repair(self) -> None:
        """What an operator does next: unmount, fsck, mount again (the
        daemon stopped)."""
        _run("umount", str(self.path))
        # On a copy: the loop device may hold the old file a while after
        # the unmount, and a mount meanwhile would reuse it, with its cache
        # of the file system from before the repair (and come up read-only).
        self.repairs += 1
        repaired = self.image.with_name(f"{self.image.name.split('.')[0]}.{self.repairs}.img")
        _run("cp", "--sparse=always", str(self.image), str(repaired))
        self.image.unlink()
        self.image = repaired
        done = subprocess.run(["e2fsck", "-f", "-y", str(self.image)],
                              capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: errors were corrected
            raise AssertionError(f"e2fsck: {done.stdout}{done.stderr}")
        self.mount()

    def remount(self, mode: str) -> None:
        """``mode``: "ro" or "rw"; only with no file open for writing."""
        _run("mount", "-o", f"remount,{mode}", str(self.path))

    def unmount(self) -> None:
        # Lazy: a process that still has a file open there keeps it, and
        # the loop device goes with the last of them.
        if os.path.ismount(self.path):
            _run("umount", "-l", str(self.path))


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)}: exit {done.returncode}: "
                             f"{done.stderr.strip()}")
    return done.stdout


@dataclass
class Ledger:
    """What the conductor was told: acknowledged instances and the devices
    they hold, and the calls that failed."""

    acknowledged: dict[str, list[str]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    refusals: int = 0  # calls answered StoreUnavailable, retries included
    consumers: list[str] = field(default_factory=list)


class StoreFaultHost:
    """A daemon (fake driver, one PF with 8 VFs) whose state directory is a
    StoreDisk, and a conductor that builds on it over RPC."""

    def __init__(self, directory: Path, placement_url: str, size_mb: int = 8):
        self.daemon = Daemon(directory, placement_url)
        self.disk = StoreDisk(directory / "state.img", directory / "state", size_mb)
        self.api = ComputeAgentAPI(load_config(["--config-file", str(self.daemon.conf)]),
                                   timeout=30)
        self.ledger = Ledger()
        self.proc: subprocess.Popen | None = None

    @property
    def store(self) -> Path:
        return self.daemon.store

    def start(self) -> None:
        """Start the daemon and wait until it answers RPC with its tree."""
        self.proc, log = self.daemon.start()

        def answering() -> bool:
            assert self.proc.poll() is None, log.read_text()
            try:
                info = self.api._call(self.daemon.name, "get_host_info", timeout=1)
            except messaging.MessagingTimeout:
                return False
            return bool(info["providers"])

        wait_for(answering, timeout=60, interval=0.05)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.disk.unmount()
            self.api.close()
            for consumer in self.ledger.consumers:
                unallocate(self.daemon.placement_url, consumer)

    def stop(self) -> int | None:
        """SIGTERM; the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.terminate()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the daemon did not stop on SIGTERM")

    def allocations(self) -> dict:
        root = node_identity.load(str(self.store.parent))
        tree = placement_tree(self.daemon.placement_url, root)
        name = self.daemon.name
        return {tree[f"{name}_numa_0"]["uuid"]: {"resources": {"VCPU": 1,
                                                               "MEMORY_MB": 256}},
                tree[f"{name}_{PF}"]["uuid"]: {"resources": {"SRIOV_NET_VF": 1}}}

    def build(self, instance: str | None = None) -> str:
        """Build (or retry the build of) an instance, allocated in Placement
        first; the answer goes in the ledger: acknowledged, or refused
        with StoreUnavailable. Any other outcome raises."""
        if instance is None:
            instance = str(uuid.uuid4())
            put_allocations(self.daemon.placement_url, instance, self.allocations())
            self.ledger.consumers.append(instance)
        try:
            answer = self.api.build_instance(self.daemon.name, instance, SPEC,
                                             self.allocations())
        except StoreUnavailable:
            self.ledger.refusals += 1
            if instance not in self.ledger.refused:
                self.ledger.refused.append(instance)
            return instance
        self.ledger.acknowledged[instance] = sorted(
            a["device_id"] for a in answer["assignments"] if a["kind"] != "numa")
        if instance in self.ledger.refused:
            self.ledger.refused.remove(instance)
        return instance

    def delete(self, instance: str) -> None:
        """Delete an acknowledged instance; on StoreUnavailable it stays
        acknowledged (and held), for the conductor to retry."""
        try:
            self.api.delete_instance(self.daemon.name, instance)
        except StoreUnavailable:
            self.ledger.refusals += 1
            return
        del self.ledger.acknowledged[instance]
        unallocate(self.daemon.placement_url, instance)
        self.ledger.consumers.remove(instance)

    def violations(self) -> list[str]:
        """Read the store file directly (the daemon stopped or running):
        every acknowledged assignment there and live, no device held twice."""
        conn = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT instance_uuid, device_id, kind FROM assignments "
                                "WHERE state != 'released'").fetchall()
        finally:
            conn.close()
        problems = []
        held: dict[str, list[str]] = {}
        for instance, device, kind in rows:
            if kind != "numa":
                held.setdefault(instance, []).append(device)
        for instance, devices in sorted(self.ledger.acknowledged.items()):
            if sorted(held.get(instance, [])) != devices:
                problems.append(f"instance {instance}: acknowledged {devices}, "
                                f"the store holds {sorted(held.get(instance, []))}")
        devices = [d for ds in held.values() for d in ds]
        for device in sorted({d for d in devices if devices.count(d) > 1}):
            problems.append(f"device {device} is in two live assignments")
        return problems


def refusal(proc: subprocess.Popen, log: Path) -> tuple[int, list[str], str]:
    """(exit status, the error lines, the whole log) of a daemon that
    should refuse to start."""
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    text = log.read_text()
    return code, [line for line in text.splitlines()
                  if line.startswith("compute-agent: error:")], text


def cut_in_half(path: Path) -> None:
    """Truncate the file to half its pages, as a crash of the file system
    or a careless copy might leave it."""
    size = path.stat().st_size
    os.truncate(path, size // 2 // 4096 * 4096 or 4096)
