"""A renamed host (pure): does this state directory belong to another host name?

The store, compute_id and the root provider in Placement are one host's.
Started with another ``[DEFAULT] host``, the agent would rename the root
provider and go on, so two machines cloned from one image with a baked
state directory would take one tree in turns, and a short name changed to
an FQDN would move every record without a word. nova refuses a compute
node whose UUID belongs to another host name; so does the agent (exit 2,
one line naming ``[DEFAULT] host``, both names, the root provider's UUID
and the state path), before
anything is written.

What is compared is the host name the store records (``owner_of_state``)
with ``[DEFAULT] host``. A store from before the record learns its name
once: its root provider's name in Placement, or, when Placement has no
root of that UUID, the configured one. A state directory without a store
of ours (a new host, or a host nova-compute ran, whose root is named after
its hypervisor hostname) takes the configured name. Placement's name of
the root is then only the name the next cycle brings to the recorded one:
``compute-agent-manage rename-host`` records a new name on purpose, and the
start after it renames the root.

A rename on purpose (``rename-host``) is refused while another agent
serves either name (``served_elsewhere``).

The facts are gathered by compute_agent/daemon/one_agent_run.py, and
rename-host's by compute_agent/cmd/manage.py.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

RENAME_HINT = ("a cloned VM image or a changed [DEFAULT] host is the usual cause; "
               "if the host was renamed on purpose, stop the agent and run "
               "'compute-agent-manage rename-host {configured}'")


class NameSource(enum.Enum):
    """Where the host name a state directory belongs to is known from."""

    STORE = "its store's record"
    PLACEMENT = "its root provider's name in Placement"
    # Nothing names it yet (no store of ours, or an older store whose root
    # Placement does not have): the configured name is taken.
    CONFIGURED = "[DEFAULT] host, nothing having recorded a name before"


@dataclass(frozen=True)
class StateOwner:
    """The host name a state directory belongs to; None unless known."""

    name: str | None
    source: NameSource


def learns_from_placement(recorded: str | None, store_there: bool,
                          compute_id: str | None) -> bool:
    """A store from before the record, beside the root it was made for:
    its name is its root's in Placement, which is asked (and, while
    Placement does not answer, nothing is recorded)."""
    return store_there and recorded is None and compute_id is not None


def owner_of_state(recorded: str | None, store_there: bool,
                   root_name: str | None) -> StateOwner:
    """``recorded``: the name the store records (None: it records none,
    or there is no store); ``store_there``: a store of ours is there;
    ``root_name``: the name Placement gives the root provider compute_id
    names, None when it has no such root (asked only of an older store)."""
    if recorded is not None:
        return StateOwner(recorded, NameSource.STORE)
    if store_there and root_name is not None:
        return StateOwner(root_name, NameSource.PLACEMENT)
    return StateOwner(None, NameSource.CONFIGURED)


def state_of_another_host(configured: str, state_path: str, compute_id: str | None,
                          owner: StateOwner) -> str | None:
    """The refusal line when the state directory (its root provider
    ``compute_id``, None: none) belongs to another host name than
    ``configured`` ([DEFAULT] host), or None."""
    if owner.name is None or owner.name == configured:
        return None
    root = "" if compute_id is None else f" (root provider {compute_id})"
    return (f"[DEFAULT] host is {configured}, but state path {state_path}{root} belongs "
            f"to host {owner.name} ({owner.source.value}): nothing was renamed; "
            + RENAME_HINT.format(configured=configured))


def served_elsewhere(new: str, old: str | None, compute_id: str | None,
                     new_roots: frozenset[str], answered: frozenset[str]) -> str | None:
    """Why ``rename-host new`` is refused, or None. ``old``: the name the
    store records (None: none); ``new_roots``: the UUIDs of Placement's
    root providers named ``new``; ``answered``: the names an agent answers
    the heartbeat for. This host's agent is stopped (rename-host holds the
    state directory), so any answer is another agent's: a clone of this
    machine still serving the old name would take the renamed root back."""
    others = sorted(new_roots - {compute_id})
    if others:
        return (f"rename-host {new}: another agent serves host {new}: Placement's root "
                f"provider {others[0]} has that name; nothing was written")
    for name in (new, old):
        if name in answered:
            return (f"rename-host {new}: another agent serves host {name}: it answers on "
                    "the bus (a clone of this machine?); nothing was written")
    return None
