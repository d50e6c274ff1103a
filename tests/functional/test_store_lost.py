"""A store that is missing, empty, behind or corrupt at start, and a second
agent on one state directory: the real compute-agent daemon (fake driver)
over the real RabbitMQ and Placement, as an operator runs it.

Placement outlives the store: the allocation of an instance built before
the loss is what tells a lost store from a new host (the fake driver's
guests live only as long as its process). Rebuilding the store needs
guests that outlive the agent: a real QEMU guest on the real libvirtd."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

from lxml import etree

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.daemon.service import Agent
from compute_agent.store import node_identity
from tests.functional.helpers import provider_uuid, put_allocations, unallocate, wait_serving, write_conf
from tests.functional.test_ctl import HOST, PF, RABBIT, VF_SPEC, ctl
from tests.functional.test_daemon import run
from tests.store_damage import drop_from_unique_index, page_with_free_space_corruption, strip_sequence

BIN = Path(sys.executable).parent


class Daemon:
    """compute-agent processes on one state directory, one at a time or
    several (for the lock)."""

    def __init__(self, directory: Path, placement_url: str):
        self.name = f"lost-{uuid.uuid4().hex[:8]}"
        self.dir = directory
        self.placement_url = placement_url
        self.conf = write_conf(directory, placement_url, self.name, HOST,
                               pci={"device_spec": VF_SPEC},
                               DEFAULT={"transport_url": RABBIT})
        self.store = directory / "state" / "state.db"
        self.starts = 0

    def start(self) -> tuple[subprocess.Popen, Path]:
        self.starts += 1
        log = self.dir / f"agent-{self.starts}.log"
        proc = subprocess.Popen([str(BIN / "compute-agent"), "--config-file",
                                 str(self.conf)],
                                stdout=open(log, "w"), stderr=subprocess.STDOUT)
        return proc, log

    def start_serving(self) -> subprocess.Popen:
        proc, log = self.start()
        wait_serving(self.conf, self.name, proc, log)
        return proc

    def uuid_of(self, suffix: str) -> str:
        return provider_uuid(self.placement_url, f"{self.name}_{suffix}")

    def build(self) -> tuple[str, str]:
        """(instance uuid, the VF it got), allocated in Placement first as a
        scheduler would."""
        instance = str(uuid.uuid4())
        allocations = {self.uuid_of("numa_0"): {"resources": {"VCPU": 1,
                                                              "MEMORY_MB": 512}},
                       self.uuid_of(PF): {"resources": {"SRIOV_NET_VF": 1}}}
        put_allocations(self.placement_url, instance, allocations)
        spec = self.dir / f"{instance}.json"
        spec.write_text(json.dumps({"instance_uuid": instance, "allocations": allocations,
                                    "spec": {"name": "g", "vcpus": 1, "memory_mb": 512}}))
        done = ctl(self.conf, "build", self.name, "--spec", str(spec), "--json")
        assert done.returncode == 0, done.stderr
        vf = [a["device_id"] for a in json.loads(done.stdout)["assignments"]
              if a["resource_class"] == "SRIOV_NET_VF"]
        return instance, vf[0]


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def refused(proc: subprocess.Popen, log: Path) -> str:
    """The daemon exits 2 at start with one error line, and no traceback;
    that line is returned."""
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the daemon started and served:\n" + log.read_text())
    text = log.read_text()
    assert code == 2, text
    errors = [line for line in text.splitlines()
              if line.startswith("compute-agent: error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    return errors[0]


def lose_store_after_a_build(tmp_path, placement, lose) -> tuple[Daemon, str]:
    d = Daemon(tmp_path, placement.url)
    proc = d.start_serving()
    instance, _ = d.build()
    lose(d, proc)
    return d, instance


def stop_and_delete(d: Daemon, proc) -> None:
    stop(proc)
    d.store.unlink()


def test_a_deleted_store_is_refused_while_an_instance_holds_allocations(
        tmp_path, placement, services):
    d, instance = lose_store_after_a_build(tmp_path, placement, stop_and_delete)
    try:
        line = refused(*d.start())
        assert f"store {d.store} is missing" in line
        assert "rebuild-store" in line and "allocations" in line
        assert not d.store.exists()  # nothing created in its place
    finally:
        unallocate(placement.url, instance)


def test_a_store_truncated_to_nothing_is_refused_while_an_instance_holds_allocations(
        tmp_path, placement, services):
    def truncate(d: Daemon, proc) -> None:
        stop(proc)
        d.store.write_bytes(b"")

    d, instance = lose_store_after_a_build(tmp_path, placement, truncate)
    try:
        line = refused(*d.start())
        assert f"store {d.store} is empty" in line and "rebuild-store" in line
        assert d.store.stat().st_size == 0
    finally:
        unallocate(placement.url, instance)


def test_a_store_whose_write_ahead_log_is_lost_after_a_crash_is_refused(
        tmp_path, placement, services):
    wal = Path(f"{tmp_path}/state/state.db-wal")

    def crash_and_lose_the_log(d: Daemon, proc) -> None:
        proc.kill()
        proc.wait()
        # The build's rows are acknowledged but still only in the log.
        assert wal.stat().st_size > 0
        wal.unlink()

    d, instance = lose_store_after_a_build(tmp_path, placement, crash_and_lose_the_log)
    try:
        line = refused(*d.start())
        assert f"{d.store}-wal is missing" in line and "rebuild-store" in line
    finally:
        unallocate(placement.url, instance)


def test_a_new_host_starts_and_a_clean_restart_opens_its_store(tmp_path, placement,
                                                               services):
    d = Daemon(tmp_path, placement.url)
    stop(d.start_serving())  # a new host: no store, nothing allocated
    proc = d.start_serving()  # the store it made, closed cleanly
    instance, _ = d.build()
    try:
        stop(proc)
        stop(d.start_serving())  # with an instance in it
    finally:
        unallocate(placement.url, instance)


def test_a_corrupt_store_is_one_line_naming_the_file(tmp_path, placement):
    d = Daemon(tmp_path, placement.url)
    d.store.parent.mkdir(parents=True)
    d.store.write_bytes(b"this is not an SQLite database\n" * 200)
    line = refused(*d.start())
    assert f"store {d.store} is unusable" in line and "not a database" in line


def test_a_second_agent_on_the_same_state_directory_exits_2(tmp_path, placement,
                                                            services):
    d = Daemon(tmp_path, placement.url)
    first = d.start_serving()
    try:
        line = refused(*d.start())
        assert f"state directory {d.store.parent} is in use" in line
        assert f"pid {first.pid}" in line
        assert first.poll() is None
    finally:
        stop(first)


# --- a store checked before it is believed --------------------------------------

def live_assignment_ids(store: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute(
            "SELECT id FROM assignments WHERE state != 'released' ORDER BY id")]
    finally:
        conn.close()


def test_bug_a_row_missing_from_an_index_was_served(tmp_path, placement, services):
    # quick_check at start passed a store whose unique index of assignments
    # lacked a row; integrity_check does not.
    d = Daemon(tmp_path, placement.url)
    proc = d.start_serving()
    instance, _ = d.build()
    try:
        stop(proc)
        ids = live_assignment_ids(d.store)
        drop_from_unique_index(d.store, ids[len(ids) // 2])
        line = refused(*d.start())
        assert f"store {d.store} is unusable (integrity check: row " in line, line
        assert "missing from index sqlite_autoindex_assignments_1" in line
        assert "compute-agent-manage rebuild-store" in line
    finally:
        unallocate(placement.url, instance)


def test_bug_sqlites_message_over_several_lines_made_a_refusal_of_several(
        tmp_path, placement, services):
    d = Daemon(tmp_path, placement.url)
    stop(d.start_serving())
    page_with_free_space_corruption(d.store)
    line = refused(*d.start())  # one error line
    # SQLite's "*** in database main ***\n..." made one line.
    assert f"store {d.store} is unusable (integrity check: *** in database main *** " in line


def test_bug_an_emptied_log_after_a_crash_gave_a_forgotten_guests_vf_again(
        tmp_path, placement, services):
    # The agent started without the build it had acknowledged, and the
    # next build got the VF the forgotten guest still held.
    wal = Path(f"{tmp_path}/state/state.db-wal")

    def crash_and_empty_the_log(d: Daemon, proc) -> None:
        proc.kill()
        proc.wait()
        assert wal.stat().st_size > 0  # the build is only in the log
        wal.write_bytes(b"")

    d, instance = lose_store_after_a_build(tmp_path, placement, crash_and_empty_the_log)
    try:
        line = refused(*d.start())
        assert f"store {d.store} is at commit sequence" in line, line
        assert "but the host recorded" in line and "acknowledged are lost" in line
        assert "rebuild-store" in line and "accept-store" in line
    finally:
        unallocate(placement.url, instance)


def test_bug_an_older_copy_of_the_store_put_back_was_believed_until_accepted(
        tmp_path, placement, services):
    d = Daemon(tmp_path, placement.url)
    proc = d.start_serving()
    first, _ = d.build()
    second = None
    try:
        stop(proc)
        older = d.store.read_bytes()  # stopped cleanly: the whole store
        proc = d.start_serving()
        second, _ = d.build()
        stop(proc)
        d.store.write_bytes(older)
        line = refused(*d.start())
        assert "but the host recorded" in line and "older copy put back" in line, line

        done = run("compute-agent-manage", d.conf, "accept-store")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"accepting store {d.store} at commit sequence "), \
            done.stdout
        assert "; the host recorded " in done.stdout
        stop(d.start_serving())
    finally:
        for instance in (first, second):
            if instance:
                unallocate(placement.url, instance)


def test_a_store_from_before_the_commit_sequence_is_accepted_once(
        tmp_path, placement, services):
    d = Daemon(tmp_path, placement.url)
    proc = d.start_serving()
    instance, _ = d.build()
    try:
        stop(proc)
        strip_sequence(d.store)  # as the agent before the sequence left it
        before = d.store.read_bytes()
        proc = d.start_serving()  # accepted: it starts a sequence
        second, _ = d.build()  # a commit the host records
        unallocate(placement.url, second)
        stop(proc)
        d.store.write_bytes(before)  # that same copy again
        line = refused(*d.start())
        assert f"store {d.store} is at no commit sequence, but the host recorded" in line
    finally:
        unallocate(placement.url, instance)


def test_bug_a_deleted_compute_id_was_replaced_before_the_refusal(
        tmp_path, placement, services):
    # The start wrote a new random compute_id, then refused "...but
    # compute_id names <that new uuid>".
    d = Daemon(tmp_path, placement.url)
    stop(d.start_serving())
    state = d.store.parent
    compute_id = state / node_identity.FILENAME
    root = compute_id.read_text().strip()
    compute_id.unlink()
    before = {p.name: p.read_bytes() for p in state.iterdir() if p.name != "lock"}
    line = refused(*d.start())
    assert line.endswith(f"compute_id is missing beside store {d.store}, which belongs "
                         f"to root provider {root}: write that UUID into compute_id and "
                         "start again; nothing was written"), line
    assert not compute_id.exists()
    after = {p.name: p.read_bytes() for p in state.iterdir() if p.name != "lock"}
    assert after == before
    compute_id.write_text(root + "\n")  # what the line says to do
    stop(d.start_serving())


# --- rebuild-store, with a real QEMU guest on the real libvirtd ---------------

def pinned_cpu(agent: Agent, instance: str) -> str:
    dom = etree.fromstring(agent.driver.guest_definition(instance).encode())
    return dom.find("cputune/vcpupin").get("cpuset")


def test_rebuild_store_gives_a_lost_stores_pinned_cpu_back_to_its_guest(
        tmp_path, placement, private_libvirtd):
    # Only CPUs and memory: no device of this machine is ever given to a
    # guest. Two dedicated CPUs, so Placement lets a second guest in, and
    # only the store says which CPU the first one holds.
    conf = write_conf(
        tmp_path, placement.url, f"rebuild-{uuid.uuid4().hex[:8]}", host_dict=None,
        DEFAULT={"compute_driver": "libvirt", "sysfs_root": "/sys"},
        compute={"cpu_dedicated_set": "0-1"},
        libvirt={"connection_uri": private_libvirtd.uri,
                 "instances_path": str(tmp_path / "instances")})
    store = tmp_path / "state" / "state.db"
    agent = compose(load_config(["--config-file", str(conf)]))
    agent.start()
    cell = next(p.uuid for p in agent.sync.cache if p.name.endswith("_numa_0"))
    wanted = {cell: {"resources": {"PCPU": 1, "MEMORY_MB": 64}}}
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    put_allocations(placement.url, first, wanted)
    agent.manager.build_instance(first, {"name": f"ca-test-{first[:8]}", "vcpus": 1,
                                         "memory_mb": 64}, wanted)
    again = None
    try:
        cpu = pinned_cpu(agent, first)
        agent.stop()
        store.unlink()

        refused_once = run("compute-agent", conf, "--once")
        assert refused_once.returncode == 2, refused_once.stderr
        assert f"store {store} is missing" in refused_once.stderr
        assert first in refused_once.stderr

        shown = run("compute-agent-manage", conf, "rebuild-store", "--dry-run")
        assert shown.returncode == 0, shown.stderr
        assert f"instance {first}" in shown.stdout
        assert f"PCPU x1  device {cpu}" in shown.stdout
        assert not store.exists()

        done = run("compute-agent-manage", conf, "rebuild-store", "--yes")
        assert done.returncode == 0, done.stderr
        # Never over a store that is there.
        twice = run("compute-agent-manage", conf, "rebuild-store", "--yes")
        assert twice.returncode == 1 and "never overwritten" in twice.stderr

        again = compose(load_config(["--config-file", str(conf)]))
        again.start()
        assert again.reconcile(at_start=False, fix=False).consistent
        put_allocations(placement.url, second, wanted)
        again.manager.build_instance(second, {"name": f"ca-test-{second[:8]}",
                                              "vcpus": 1, "memory_mb": 64}, wanted)
        assert pinned_cpu(again, second) != cpu
    finally:
        for instance in (first, second):
            (again or agent).driver.destroy(instance)
            unallocate(placement.url, instance)
        if again is not None:
            again.stop()


def test_rebuild_store_refuses_what_no_guest_explains_and_writes_nothing(
        tmp_path, placement, services):
    # The fake driver's guests end with its process: the allocation of
    # the instance built before is left unexplained.
    d, instance = lose_store_after_a_build(tmp_path, placement, stop_and_delete)
    try:
        done = run("compute-agent-manage", d.conf, "rebuild-store", "--yes")
        assert done.returncode == 1
        assert f"consumer {instance}: holds allocations" in done.stderr
        assert not d.store.exists()
    finally:
        unallocate(placement.url, instance)
