"""The earlier versions the upgrade tests install from this repository's
own history, each with why it is pinned: the one list. A tagged release
is added here when it is made (its tag's commit, "release X.Y.Z")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pinned:
    commit: str  # the full SHA: the cache of installed versions is keyed by it
    why: str
    # d1b250d has no manager (its tracker and guest manager are its API),
    # and before 964717c no RPC version ledger.
    has_manager: bool
    has_rpc_ledger: bool


PINNED: tuple[Pinned, ...] = (
    Pinned("d1b250d63167e2e6ed4f3382cb8b267d131ae459",
           "the first with the libvirt driver and the store (schema 2); no RPC, no "
           "manager: its tracker and guest manager are its API", False, False),
    Pinned("0c79eb6e26ea06aa65c90819343edcdc74b40c2f",
           "the last before 88f9c57: domains named after the instance's name, a "
           "finished resize left running on its old devices (schema 3)", True, False),
    Pinned("964717c053ff6deffedad15b510e1058913e4a3c",
           "the first RPC version ledger (RPC 1.1, schema 4)", True, True),
    Pinned("cf20264c6b678de83d1dcb494aecb90005e347d8",
           "schema 5 and RPC 1.4", True, True),
    Pinned("d748ab61c9005d3cee504612224093372be7523f",
           "release 0.2.0: schema 6 and RPC 1.5", True, True),
    Pinned("058dc397361f952601add4d0fe78d5a089b0b553",
           "release 0.3.0: schema 7 and RPC 1.6; the last installed as the top-level "
           "agent, drivers and compute_common (its errors named agent.exception on "
           "the wire)", True, True),
)


def short(pinned: Pinned) -> str:
    return pinned.commit[:7]
