"""One agent per host (pure): is another agent already serving this host?

Two agents with one ``[DEFAULT] host`` share the host's RPC queues, so
calls to the host are split between them, and they fight over its root
provider: Placement's names are unique, so the second's root is refused
(409) every cycle. The usual cause is a mistyped ``state_path`` (a new,
empty state directory gets a new compute_id) or a cloned VM image (the
same host name, often the same compute_id). So a start is refused (exit
2, one line naming the host, both root UUIDs and the state path) when:

- Placement has a root provider named as the host whose UUID is not this
  state path's compute_id (``root_of_another_agent``). A host nova-compute
  ran is adopted with nova's compute_id, which is its root's UUID, so it
  is never taken for another agent's.
  Placement's tree of this state path's compute_id answers it when its
  root is there, named as the host (``roots_named_from_tree``): names are
  unique, so no other root has the name, and a restart asks nothing more
  than the tree read its first cycle needs anyway.
- Another agent answers the host's heartbeat on the bus
  (``agent_answering_for_host``): any answer is a live agent.

The facts are gathered by compute_agent/daemon/one_agent_run.py; what could not
be asked is its to handle (Placement is asked again at the first cycle
that reaches it), never read here as "no other agent".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HINT = "a mistyped state_path or a cloned VM image is the usual cause"
# What an answer on the bus may put in the line: it is another process's.
SHOWN_LENGTH = 80


@dataclass(frozen=True)
class ThisAgent:
    """The agent starting, as its start knows it before writing anything."""

    host: str
    state_path: str
    # The root provider's UUID from <state_path>/compute_id; None when
    # there is none yet (this start would make a new one).
    compute_id: str | None
    # The root provider the store names, read only when compute_id is
    # missing: a store there makes the start refuse on its own, naming
    # its root (compute_agent/store/check.py), which is this agent's, not another's.
    store_root: str | None = None


@dataclass(frozen=True)
class AnsweringAgent:
    """What an agent that answered the host's heartbeat said of itself
    (report_alive); None for what it did not say (an older agent)."""

    root_uuid: str | None = None
    state_path: str | None = None
    machine: str | None = None

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> AnsweringAgent:
        def said(key: str) -> str | None:
            value = report.get(key) if isinstance(report, dict) else None
            if not isinstance(value, str) or not value:
                return None
            return value if len(value) <= SHOWN_LENGTH else value[:SHOWN_LENGTH - 3] + "..."
        return cls(said("root_uuid"), said("state_path"), said("machine"))


def _ours(me: ThisAgent) -> str:
    if me.compute_id is None:
        return f"state path {me.state_path} has no compute_id (this start would make one)"
    return f"state path {me.state_path} has compute_id {me.compute_id}"


def root_of_another_agent(me: ThisAgent, roots: frozenset[str]) -> str | None:
    """``roots``: the UUIDs of Placement's root providers named as the host
    (names are unique: none or one). The refusal line, or None."""
    others = sorted(roots - {me.compute_id or me.store_root})
    if not others:
        return None
    return (f"another agent serves host {me.host}: Placement's root provider "
            f"{others[0]} has that name, but {_ours(me)}; {HINT}")


def roots_named_from_tree(me: ThisAgent, tree: list[dict[str, Any]]
                          ) -> frozenset[str] | None:
    """The roots named as the host, as ``tree`` (Placement's providers in
    the tree of ``me.compute_id``: GET /resource_providers?in_tree=) tells
    them: that root alone when it is there and named as the host, since
    Placement's names are unique. None when the tree cannot tell (no
    compute_id, its root not in Placement or named otherwise): Placement
    is then asked by name."""
    if me.compute_id is None:
        return None
    for row in tree:
        if row["uuid"] == me.compute_id:
            return frozenset({me.compute_id}) if row["name"] == me.host else None
    return None


def agent_answering_for_host(me: ThisAgent, other: AnsweringAgent | None) -> str | None:
    """``other``: the agent that answered the host's heartbeat, None when
    none did. Any answer is another agent: this one serves nothing yet.
    The refusal line, or None."""
    if other is None:
        return None
    where = f" on {other.machine}" if other.machine else ""
    return (f"another agent serves host {me.host}: it answers on the bus{where} "
            f"(root provider {other.root_uuid or 'not said'}, state path "
            f"{other.state_path or 'not said'}), and this one's {_ours(me)}; {HINT}")
