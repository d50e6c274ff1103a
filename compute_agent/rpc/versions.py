"""The RPC API's versions, oldest first, each with what it added (pure).

The rule that keeps a rolling upgrade working (N-1): a minor version only
adds, a method or an optional argument, and the server answers every older
1.x call unchanged. So a conductor pinned at an older version
(``[upgrade_levels] compute_agent``) keeps working against a newer agent,
and the client sends a call only when its cap allows the version the call
appeared in. Removing or changing a call is 2.0, served beside 1.x for a
release.

A new version is one new line at the end of VERSIONS; the endpoint's
methods (compute_agent/rpc/server.py) each name the version they appeared in.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Version:
    number: str
    added: str


VERSIONS = (
    Version("1.0", "initial: get_host_info, get_provider_tree, get_instance, "
                   "build_instance, delete_instance; the resize steps prep_resize, "
                   "resize_instance, finish_resize, confirm_resize, revert_resize; "
                   "the live-migration steps check_can_live_migrate_destination, "
                   "live_migrate, post_live_migration_at_destination, "
                   "rollback_live_migration_at_destination; evacuation's "
                   "rebuild_instance"),
    Version("1.1", "list_instances: the instances this host holds, each with its "
                   "state"),
    Version("1.2", "live migration moves the guest: check_can_live_migrate_"
                   "destination also answers claimed and migration_uri, which "
                   "live_migrate takes as destination (refused without it)"),
    Version("1.3", "rebuild_instance takes source_host, the evacuation's source, "
                   "which the caller asserts is down: refused (SourceHostUp) when "
                   "its agent answers a heartbeat, unless force; answered once the "
                   "move and the claim are on disk, the guest built after. "
                   "report_alive, the heartbeat, on topic compute-agent-heartbeat"),
    Version("1.4", "check_can_live_migrate_source: the source records the live "
                   "migration (announced) before the conductor swaps the "
                   "allocations; rollback_live_migration_at_source ends it"),
    Version("1.5", "retries must match: a call naming a record an earlier call made "
                   "(a build's instance, a move) but asking something else, or the "
                   "step that did not end a move, is refused with RetryMismatch (an "
                   "InvalidRequest); so are an instance and a move sharing a uuid, "
                   "prep_resize naming another instance's move, and a spec whose "
                   "vcpus or memory_mb differ from its allocations'"),
    Version("1.6", "one-time-use devices: list_device_uses, the devices used and "
                   "not clean; clean_device runs a device's cleaning again; "
                   "release_device gives back one an operator cleaned by hand"),
)

# The oldest version a client can be pinned at, and the newest: what this
# agent serves, and what its client sends when nothing pins it lower.
OLDEST = VERSIONS[0].number
VERSION = VERSIONS[-1].number


def known(number: str) -> str:
    """``number`` itself, when the ledger lists it."""
    if number not in {v.number for v in VERSIONS}:
        raise ValueError(f"RPC API version {number} is not in the ledger "
                         "(compute_agent/rpc/versions.py)")
    return number
