"""One agent per host, at start: the facts compute_agent/daemon/one_agent.py's
rules judge, gathered before the start writes anything in the state
directory (a mistyped ``state_path`` is refused before it gets a store or
a compute_id).

Placement is asked first, in one request on a restart: the tree of the
state path's compute_id, which the first cycle then takes as its own tree
read (``StartCheck.tree``); by the host's name only when that tree cannot
tell (a new host, a root not in Placement or named otherwise). The client
that asked is the agent's (``StartCheck.client``): its microversion is
negotiated once a process. When Placement cannot be asked, the agent
starts all the same and its first cycle that reaches Placement asks
(``PlacementCheck`` on the Agent): a conflict found then stops the daemon
the same way. The daemon then asks the bus, once, for at
most PROBE_DEADLINE_SECONDS (compute_agent/rpc/heartbeat.py's agent_serving).

The host name the state directory belongs to (compute_agent/daemon/renamed_host.py)
is checked first, from the store; a store from before its record learns
it from Placement with the same check.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oslo_config import cfg

from compute_agent.daemon.errors import AnotherAgentServesHost, StateOfAnotherHost
from compute_agent.daemon.one_agent import (
    AnsweringAgent,
    ThisAgent,
    agent_answering_for_host,
    root_of_another_agent,
    roots_named_from_tree,
)
from compute_agent.daemon.renamed_host import (
    StateOwner,
    learns_from_placement,
    owner_of_state,
    state_of_another_host,
)
from compute_agent.dependencies import Unknown
from compute_agent.exception import DependencyUnavailable, PlacementError
from compute_agent.metrics import Metrics
from compute_agent.placement.client import DEFAULT_TIMEOUT_SECONDS, PlacementClient, adapter_from_conf
from compute_agent.rpc.heartbeat import agent_serving
from compute_agent.store import node_identity
from compute_agent.store.inspection import inspect_store, stored_host
from compute_agent.store.store import STORE_FILE

LOG = logging.getLogger(__name__)

# The bus probe's bound: an agent that serves the host answers in
# milliseconds; this is waited only when its queue has a consumer that
# does not answer. Short, so that a fleet's restart stays quick.
PROBE_DEADLINE_SECONDS = 2.0


@dataclass(frozen=True)
class PlacementCheck:
    """Placement's half of the check, for the agent of ``host`` whose
    state directory is ``state_path``."""

    host: str
    state_path: str
    # The store records no host name (a store from before the record):
    # its root's name in Placement is the name it belongs to.
    learns_name: bool = False

    def run(self, client: PlacementClient, compute_id: str | None,
            store_root: str | None = None) -> list[dict[str, Any]] | None:
        """One request on a restart (the tree of ``compute_id``), two when
        that tree cannot tell (roots_named_from_tree). ``compute_id``: the
        state path's now (None: none yet), ``store_root`` as ThisAgent's.
        When the name is learnt, the tree's root names the host the state
        belongs to. Returns the tree read (None: not read, no compute_id).
        Raises AnotherAgentServesHost (StateOfAnotherHost) with the line,
        or the client's errors when Placement cannot be asked."""
        me = ThisAgent(self.host, self.state_path, compute_id, store_root)
        tree = None if compute_id is None else client.get_tree(compute_id)
        roots = None if tree is None else roots_named_from_tree(me, tree)
        if roots is None:
            roots = frozenset(client.get_roots_named(self.host))
        refused = root_of_another_agent(me, roots)
        if refused:
            raise AnotherAgentServesHost(refused)
        if self.learns_name and compute_id is not None:
            root_name = next((p["name"] for p in tree or [] if p["uuid"] == compute_id), None)
            owner = owner_of_state(None, True, root_name)
            refuse_state_of_another_host(self.host, self.state_path, compute_id, owner)
            LOG.info("State path %s records no host name: it belongs to host %s (%s)",
                     self.state_path, self.host, owner.source.value)
        return tree


def refuse_state_of_another_host(host: str, state_path: str, compute_id: str | None,
                                 owner: StateOwner) -> None:
    """Raises StateOfAnotherHost when the state directory is another host
    name's."""
    refused = state_of_another_host(host, state_path, compute_id, owner)
    if refused:
        raise StateOfAnotherHost(refused)


@dataclass(frozen=True)
class StartCheck:
    """What the start's check hands the agent it composes: the Placement
    client it asked with (the agent's: one microversion negotiation a
    process), the tree it read (None: not read), for the first cycle, and
    Placement's check still to run when Placement could not be asked."""

    client: PlacementClient
    tree: list[dict[str, Any]] | None = None
    pending: PlacementCheck | None = None


def check_one_agent_per_host(conf: cfg.ConfigOpts, ask_the_bus: bool) -> StartCheck:
    """Raises AnotherAgentServesHost (the one line) when another agent
    serves ``[DEFAULT] host``. Returns the client, the tree it read and the
    Placement check still to run (at the first cycle that reaches
    Placement) when Placement could not be asked. ``ask_the_bus``: the
    daemon, which joins the host's queues (``--once`` does not)."""
    compute_id = node_identity.load(conf.state_path)
    path = Path(conf.state_path) / STORE_FILE
    stored = stored_host(path)
    learns_name = learns_from_placement(stored.name, stored.store_there, compute_id)
    if not learns_name:
        refuse_state_of_another_host(conf.host, conf.state_path, compute_id,
                                     owner_of_state(stored.name, stored.store_there, None))
    store_root = None if compute_id is not None else inspect_store(path).root_uuid
    me = ThisAgent(conf.host, conf.state_path, compute_id, store_root)
    conf.set_default("timeout", DEFAULT_TIMEOUT_SECONDS, group="placement")
    check = PlacementCheck(me.host, me.state_path, learns_name)
    client = PlacementClient(adapter_from_conf(conf), Metrics())
    try:
        start = StartCheck(client, check.run(client, me.compute_id, me.store_root))
    except (DependencyUnavailable, PlacementError) as e:
        # The first cycle says that Placement is away, once.
        LOG.debug("Whether another agent serves host %s is asked of Placement at the "
                  "first cycle that reaches it: %s", me.host, e)
        start = StartCheck(client, pending=check)
    if ask_the_bus:
        answer = agent_serving(conf, me.host, PROBE_DEADLINE_SECONDS)
        if isinstance(answer, Unknown):
            LOG.warning("Whether another agent serves host %s was not asked on the "
                        "bus: %s", me.host, answer.why)
        else:
            refused = agent_answering_for_host(
                me, None if answer is None else AnsweringAgent.from_report(answer))
            if refused:
                raise AnotherAgentServesHost(refused)
    return start
