"""Stores on disk as the store's unit tests make them: rows of assignments,
a holder's store with some, and one whose holder died after a write."""
from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from compute_agent.claims.model import Assignment, AssignmentState, Owner
from compute_agent.drivers.base import DeviceDetail, DeviceKind
from compute_agent.store.queries import insert_assignments_sql
from compute_agent.store.store import Store

PROVIDER = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"
ROOT_UUID = "5d2bd8a6-8f2f-4f0b-9c55-0e1c9d1b6c11"


def assignment(device="0000:81:10.0", provider=PROVIDER, rc="SRIOV_NET_VF",
               kind=DeviceKind.VF, st=AssignmentState.CLAIMED, instance=None, aid=None) -> Assignment:
    """One row held by its own instance (by default a VF, claimed)."""
    inst = instance or str(uuid.uuid4())
    return Assignment(aid or str(uuid.uuid4()), inst, inst, Owner.INSTANCE, None, rc,
                      provider, kind, device, 1, st, "boot-1", DeviceDetail(numa_node=0))


def held_store_with_assignments(path: Path, n: int = 5) -> list[Assignment]:
    """A store its holder wrote ``n`` assignments to, and closed."""
    rows = [assignment(device=f"0000:81:10.{i}") for i in range(n)]
    store = Store(path, ROOT_UUID)
    store.write([insert_assignments_sql(rows)])
    store.close()
    return rows


def crash_after_a_write(path: Path) -> None:
    """A holder that writes one instance and dies without closing: the
    write is acknowledged and only in the write-ahead log."""
    code = (f"from compute_agent.store.store import Store; import os\n"
            f"from compute_agent.store.queries import put_instance_sql\n"
            f"s = Store({str(path)!r}, {ROOT_UUID!r})\n"
            f"s.write([put_instance_sql('a', {{'name': 'a'}})])\n"
            f"os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
