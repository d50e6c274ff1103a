"""Crash consistency: an agent process killed with SIGKILL at random points
inside claims and moves, hundreds of times, on one store that accumulates.

Each iteration forks a child agent. The child opens the store itself (no
SQLite connection crosses a fork), then builds, resizes on the same host
(then confirms or reverts) and deletes instances in a loop. Before each
call it appends ``intent ...`` to a log, and after the call returned
``acked ...`` with the assignment ids it got; every line is fsynced. The
parent kills it 0-30 ms after it reported ready, then plays the restarted
agent and the conductor: it opens the store afresh, runs reconcile
(at_start=True), finishes the one operation the log shows in flight the way
a conductor would (retry a confirm or revert, revert an unfinished resize),
and checks:

- no device is held by two live assignments;
- every live assignment belongs to an instance the store and the parent
  know of, and no move is left open;
- every acknowledged claim is still there with exactly its assignment ids
  (a revert restores exactly the ids of before the resize);
- the hypervisor agrees: each guest carries exactly its instance's ids;
- an audit (reconcile, fix=False) finds nothing.

The hypervisor must outlive the agent, so the child's FakeDriver keeps
its guests and created mdevs in a state file (compute_agent/drivers/fake.py), written
atomically after each change: a guest definition either happened or did
not, as with libvirt's define.
"""
from __future__ import annotations

import os
import random
import select
import signal
import time
from pathlib import Path

import pytest

from compute_agent.claims.model import AssignmentState, Owner
from compute_agent.compute.reconcile import ReconcileInputs, reconcile
from compute_agent.drivers.base import DeviceKind
from compute_agent.drivers.fake import FakeDriver
from compute_agent.exception import ClaimFailed
from tests.functional.claims_world import PMEM_RC, host_dict, make_world, new_uuid, spec

KILLS = 200
# Only a hang guard, far above what a slow machine needs (a child is ready
# in milliseconds): the test counts kills, not seconds.
READY_TIMEOUT = 120.0
HOST = host_dict(vfs=6, vgpus=4)


def open_world(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    return make_world(directory, "crash", HOST, driver=FakeDriver(
        HOST, "crash-boot-1", state_file=directory / "hypervisor.json"))


MIXES = [
    {"pf": {"SRIOV_NET_VF": 1}},
    {"pf": {"SRIOV_NET_VF": 2}, "gpu": {"VGPU": 1}},
    {"gpu": {"VGPU": 1}, "numa1": {"PCPU": 1, "VCPU": 1, "MEMORY_MB": 256}},
    {"pmem0": {PMEM_RC: 1}, "numa0": {"PCPU": 1}},
    {"pmem1": {PMEM_RC: 1}, "gpu": {"VGPU": 2}, "root": {"DISK_GB": 1}},
    {"numa0": {"VCPU": 1, "MEMORY_MB": 256}, "root": {"DISK_GB": 2}},
]


# --- the child --------------------------------------------------------------------

def child_main(directory: Path, log_path: Path, ready_fd: int, seed: int,
               mixes: list[dict]) -> None:
    rng = random.Random(seed)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def log(*words):
        os.write(log_fd, (" ".join(words) + "\n").encode())
        os.fsync(log_fd)

    w = open_world(directory)
    m = w.manager
    os.write(ready_fd, b"r")
    while True:
        instances, live, moves = w.tracker.snapshot()
        idle = sorted(instances)
        op = rng.choices(["build", "resize", "delete"],
                         [5 if len(idle) < 6 else 1, 4 if idle else 0,
                          3 if idle else 0])[0]
        if op == "build":
            inst = new_uuid()
            log("intent", "build", inst)
            try:
                m.build_instance(inst, spec(), w.allocations(rng.choice(mixes)))
            except ClaimFailed:
                log("refused", "build", inst)
                continue
            ids = sorted(a.id for a in w.tracker.instance(inst)[1])
            log("acked", "build", inst, *ids)
        elif op == "delete":
            inst = rng.choice(idle)
            log("intent", "delete", inst)
            m.delete_instance(inst)
            log("acked", "delete", inst)
        else:
            inst, mig = rng.choice(idle), new_uuid()
            log("intent", "resize", inst, mig)
            try:
                m.prep_resize(mig, inst, spec(vcpus=2), w.allocations(rng.choice(mixes)))
            except ClaimFailed:
                log("refused", "resize", inst, mig)
                continue
            m.resize_instance(mig, inst)
            m.finish_resize(mig, inst)
            new = sorted(a.id for a in w.tracker.instance(inst)[1] if a.owner is Owner.INSTANCE)
            log("acked", "finish", inst, mig, *new)
            if rng.random() < 0.5:
                log("intent", "confirm", inst, mig)
                m.confirm_resize(mig, inst)
                log("acked", "confirm", inst, mig)
            else:
                log("intent", "revert", inst, mig)
                m.revert_resize(mig, inst)
                ids = sorted(a.id for a in w.tracker.instance(inst)[1])
                log("acked", "revert", inst, mig, *ids)


# --- the parent -------------------------------------------------------------------

class Truth:
    """What the log says was acknowledged: instance -> its assignment ids."""

    def __init__(self):
        self.known: dict[str, frozenset[str]] = {}
        self.pending: dict[str, tuple[str, frozenset[str]]] = {}  # inst -> (mig, new ids)

    def apply(self, words: list[str]) -> None:
        kind, op, inst, rest = words[0], words[1], words[2], words[3:]
        if kind != "acked":
            return
        if op == "build":
            assert inst not in self.known
            self.known[inst] = frozenset(rest)
        elif op == "delete":
            del self.known[inst]
        elif op == "finish":
            self.pending[inst] = (rest[0], frozenset(rest[1:]))
        elif op == "confirm":
            self.known[inst] = self.pending.pop(inst)[1]
        elif op == "revert":
            self.pending.pop(inst)
            # Exactly the ids it had before the resize.
            assert frozenset(rest[1:]) == self.known[inst], "revert changed the ids"


def resolve_in_flight(w, truth: Truth, last: list[str] | None, rng: random.Random,
                      stats: dict) -> None:
    """Finish what the child was doing when it died, as a conductor would."""
    if not last or last[0] == "refused":
        return
    kind, op, inst = last[0], last[1], last[2]
    instances = w.instances()
    moves = w.migrations()
    if kind == "acked" and op != "finish":
        return  # nothing in flight
    stats[f"{kind} {op}"] = stats.get(f"{kind} {op}", 0) + 1
    if op == "build":  # intent build, not acked
        if inst in instances:
            rows = [a for a in w.live() if a.instance_uuid == inst]
            assert rows and all(a.state is AssignmentState.CLAIMED for a in rows), rows
            truth.known[inst] = frozenset(a.id for a in rows)
        return
    if op == "delete":
        if inst not in instances:
            del truth.known[inst]
        return
    mig = last[3]
    m = moves.get(mig)
    if op == "resize":  # prep, resize or finish in flight
        if m is not None:
            assert m.open, m
            w.manager.revert_resize(mig, inst)
        return
    if op == "finish":  # acked finish, the child had not chosen yet
        truth.pending[inst] = (mig, frozenset(last[4:]))
        op = rng.choice(["confirm", "revert"])
    assert m is not None
    # Every step is idempotent: the conductor retries the one that got no
    # answer, whether or not its commit landed before the kill.
    if op == "confirm":
        w.manager.confirm_resize(mig, inst)
        truth.known[inst] = truth.pending.pop(inst)[1]
    else:
        w.manager.revert_resize(mig, inst)
        truth.pending.pop(inst)


def check(w, truth: Truth, iteration: int) -> None:
    where = f"iteration {iteration}"
    live = w.live()
    held = [(a.provider_uuid, a.resource_class, a.device_id) for a in live
            if not a.kind.counted]
    assert len(held) == len(set(held)), f"{where}: a device is held twice"
    instances = w.instances()
    assert set(instances) == set(truth.known), \
        f"{where}: store has {sorted(set(instances) ^ set(truth.known))} differently"
    by_inst: dict[str, set[str]] = {}
    for a in live:
        assert a.instance_uuid in instances, f"{where}: {a} belongs to no instance"
        assert a.owner is Owner.INSTANCE and a.state is AssignmentState.CLAIMED, \
            f"{where}: {a}"
        by_inst.setdefault(a.instance_uuid, set()).add(a.id)
    for inst, ids in truth.known.items():
        assert by_inst.get(inst, set()) == ids, f"{where}: {inst} lost or changed devices"
    assert not any(m.open for m in w.migrations().values()), f"{where}: a move is open"
    assert not truth.pending
    guests = w.driver.list_guests()
    disk = {a.id for a in live if a.kind is DeviceKind.HOST_RESOURCES}
    assert {u: g.saved for u, g in guests.items()} == \
        {i: frozenset(ids - disk) for i, ids in truth.known.items()}, \
        f"{where}: guests differ from the store"
    assert all(g.live == g.saved for g in guests.values() if g.running), \
        f"{where}: a running guest runs on devices it is not defined with"
    audit = w.reconcile(None, at_start=False, fix=False)
    assert not audit.findings, f"{where}: {audit.as_dict()}"


@pytest.mark.parametrize("root_disk", [False, True], ids=["devices", "devices+root-disk"])
def test_sigkill_at_random_points_loses_and_doubles_nothing(tmp_path, root_disk):
    """``devices+root-disk`` adds claims with DISK_GB on the root provider,
    which the regression test_build_killed_after_spawn_is_completed_not_
    rolled_back pins in one deterministic case."""
    mixes = MIXES if root_disk else [m for m in MIXES if "root" not in m]
    directory = tmp_path / "host"
    log_path = tmp_path / "ops.log"
    log_path.touch()
    rng = random.Random(20240601)
    truth = Truth()
    stats: dict[str, int] = {}
    offset = 0
    started = time.monotonic()
    for iteration in range(KILLS):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 0
            try:
                os.close(read_fd)
                child_main(directory, log_path, write_fd,
                           rng.randrange(1 << 30) + iteration, mixes)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 3
            os._exit(code)
        os.close(write_fd)
        if not select.select([read_fd], [], [], READY_TIMEOUT)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"iteration {iteration}: the child was not ready after "
                        f"{READY_TIMEOUT:.0f}s: it hangs")
        ready = os.read(read_fd, 1)
        os.close(read_fd)
        assert ready == b"r", "the child died before it was ready"
        # The kill lands at a random moment of the child's work: anywhere
        # in a claim is what is tested.
        time.sleep(rng.uniform(0, 0.030))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
            f"the child ended on its own (status {status}): it failed"

        with open(log_path) as f:
            f.seek(offset)
            text = f.read()
        # A kill inside a write that crosses a page of the log leaves a torn
        # last line: it never happened (its call got no answer), and its
        # bytes are cut off so that the next child's first line is not
        # glued onto them.
        complete = text[:text.rfind("\n") + 1]
        offset += len(complete.encode())
        os.truncate(log_path, offset)
        lines = [line.split() for line in complete.splitlines() if line.strip()]
        for words in lines:
            truth.apply(words)

        w = open_world(directory)  # the agent restarts
        try:
            running = {u for u, g in w.driver.list_guests().items() if g.running}
            report = w.reconcile(None, at_start=True)
            assert report.consistent, report.as_dict()
            destroyed = running - set(w.driver.list_guests())
            assert not destroyed, \
                f"iteration {iteration}: reconcile deleted running guests {destroyed}: " \
                f"{report.as_dict()}"
            for f in report.findings:
                stats[f"reconcile {f.kind}"] = stats.get(f"reconcile {f.kind}", 0) + 1
            resolve_in_flight(w, truth, lines[-1] if lines else None, rng, stats)
            check(w, truth, iteration)
        finally:
            w.stop()
    print(f"{KILLS} kills in {time.monotonic() - started:.1f}s; in flight at the kill: "
          f"{stats}; {len(truth.known)} instances at the end")
    # The kills landed inside operations, not only between them.
    assert sum(v for k, v in stats.items() if k.startswith("intent")) >= 50, stats


# --- the two windows, deterministically ----------------------------------------------

def test_build_killed_after_spawn_is_completed_not_rolled_back(tmp_path):
    """Killed between the guest's spawn and the claim's completion: the
    guest runs with every device it was given, so reconcile must complete
    the claim. Regression: with a root disk in the allocations the claim
    has a DISK_GB row that guest_spec leaves out of the guest's metadata;
    reconcile's subset test used to fail on it and delete the running
    guest."""
    w = open_world(tmp_path)
    try:
        for mix in ({"pf": {"SRIOV_NET_VF": 1}},
                    {"pf": {"SRIOV_NET_VF": 1}, "root": {"DISK_GB": 1}}):
            inst = new_uuid()
            w.tracker.claim_build(inst, spec(), w.allocations(mix))
            w.driver.spawn(w.manager.host.guest(inst))  # then the kill
            w.restart()
            report = w.reconcile(None, at_start=True)
            assert inst in w.driver.list_guests(), \
                f"{mix}: reconcile deleted the running guest: {report.as_dict()}"
            assert all(a.state is AssignmentState.CLAIMED for a in w.live() if a.instance_uuid == inst)
    finally:
        w.stop()


def test_revert_killed_before_the_guest_is_redefined_is_seen_by_reconcile(tmp_path):
    """Killed after revert_move's commit and before the guest is redefined
    with its old devices: the guest still carries the new set's ids, which
    the store has released. A conductor retry repairs it, but without one
    the hypervisor and the store disagree. Regression: reconcile used to
    compare only which instances have guests, never the ids in a guest's
    metadata, so the audit reported nothing."""
    w = open_world(tmp_path)
    try:
        inst, mig = new_uuid(), new_uuid()
        w.manager.build_instance(inst, spec(), w.allocations({"pf": {"SRIOV_NET_VF": 1}}))
        w.manager.prep_resize(mig, inst, spec(vcpus=2),
                              w.allocations({"pf": {"SRIOV_NET_VF": 2}}))
        w.manager.resize_instance(mig, inst)
        w.manager.finish_resize(mig, inst)
        w.tracker.revert_move(mig)  # then the kill, before driver.spawn
        w.restart()
        rows = {a.id for a in w.live() if a.instance_uuid == inst}
        assert w.driver.list_guests()[inst].saved != rows  # the window exists
        report = w.reconcile(None, at_start=True)
        fixed = w.driver.list_guests()[inst].saved == rows
        assert fixed or not report.consistent, \
            f"guest carries released devices and the audit is silent: {report.as_dict()}"
    finally:
        w.stop()


def test_bug_a_source_killed_before_recording_its_resize_kept_the_instance(tmp_path):
    """Found by the crash loop (tests/reliability/crash_loop.py, seed 5):
    a cross-host resize's source, killed after the conductor's allocation
    swap and before resize_instance reached its disk, restarted, found the
    instance's allocations all on the destination and no move of its own,
    took it for evacuated and destroyed its guest. An evacuation leaves its
    own migration consumer holding this host's share; a resize's does not
    name the instance."""
    w = open_world(tmp_path)
    try:
        inst, mig = new_uuid(), new_uuid()
        w.manager.build_instance(inst, spec(), w.allocations({"pf": {"SRIOV_NET_VF": 1}}))
        w.restart()  # killed before resize_instance; the conductor had swapped
        report = reconcile(w.manager, ReconcileInputs(
            {mig: set(w.names.values())}, at_start=True, elsewhere={inst: {new_uuid()}}))
        assert inst in w.instances() and inst in w.driver.list_guests(), report.as_dict()
        # An evacuation's hold says it: then the source gives it up.
        report = reconcile(w.manager, ReconcileInputs(
            {mig: set(w.names.values())}, at_start=True, elsewhere={inst: {new_uuid()}},
            evacuation_holds={inst: mig}))
        assert inst not in w.instances() and inst not in w.driver.list_guests()
    finally:
        w.stop()
