"""The crash loop (tests/reliability/crash_loop.py), short: two agent
daemons on the libvirt driver over two private libvirtds with QEMU/KVM, so
the guests are real and outlive every SIGKILL of their agent. Builds,
deletes, resizes on one host and across, live migrations (QEMU really
moves the guest) and their rollbacks, an evacuation and a host reboot,
with kills aimed at calls in flight and at start-up; every invariant
checked after every operation. `tools/reliability --only crash_loop_qemu` runs it for minutes;
`--only crash_loop` on the fake driver with a state file (many more kills
a minute)."""
from __future__ import annotations

from tests.reliability.crash_loop import CrashLoop, QemuHypervisors

SEED = 16
# A count, not a time: on a busy machine a time would hold fewer operations.
OPERATIONS = 4
# Where a kill lands (in flight, at start-up) is the machine's timing, not
# the seed's: one operation more at a time, up to this, until both did.
MOST_OPERATIONS = 12


def kills_of_each_kind(figures) -> bool:
    return figures.kills["in flight"] >= 3 and figures.kills["start-up"] >= 1


def test_sigkills_during_nova_protocol_on_qemu_lose_and_double_nothing(
        tmp_path, placement, services, two_private_libvirtds):
    loop = CrashLoop(tmp_path, placement.url, QemuHypervisors(two_private_libvirtds),
                     seed=SEED, kill_rate=0.5, command_audit_every=1000)
    runs = 1
    try:
        figures = loop.start().run(operations=OPERATIONS)
        while not kills_of_each_kind(figures) and \
                sum(figures.ops.values()) < MOST_OPERATIONS:
            figures = loop.run(operations=1)
            runs += 1
        # A host reboot, whatever the seed drew: its guests stopped, a new
        # boot ID, every invariant and both audits after it.
        loop.op_reboot()
        loop.check(command_audit=True)
    finally:
        loop.close()
    print(figures.line())
    # It did what it is for: operations went through, and kills landed
    # while calls were outstanding and during start-up.
    assert kills_of_each_kind(figures), figures.line()
    assert sum(figures.ops.values()) == OPERATIONS + runs - 1, figures.line()
    # Both hosts, at the end of each run and after the reboot.
    assert figures.command_audits == 2 * runs + 2, figures.line()
    assert figures.kills["reboot"] >= 1, figures.line()
