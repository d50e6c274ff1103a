"""Each RPC endpoint reaches only what compute_agent/rpc/served.py declares of
the agent it serves, and the daemon's Agent has every member declared: the
calls' endpoint (compute_agent/rpc/server.py) against ServedAgent, the
heartbeat's (compute_agent/rpc/heartbeat.py) against HeartbeatAgent.

An endpoint's paths are read from its module's source: a path
``self._agent.a.b`` is declared when ``a`` is a member of the endpoint's
Protocol and ``b`` a member of the Protocol ``a`` is annotated with. A
member of any other type (a method, ProviderTree) ends a path: reaching
one attribute past it is reaching what no Protocol says. A path that stops
at a Protocol hands the object on (a local name, an argument), past the
reach of this test: it is refused too."""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from compute_agent.daemon.service import Agent
from compute_agent.rpc.heartbeat import HeartbeatEndpoint
from compute_agent.rpc.served import HeartbeatAgent, ServedAgent
from compute_agent.rpc.server import ComputeAgentEndpoint
from tests.unit.daemon.agents import agent_on_fake_host

ROOT = Path(__file__).resolve().parents[3] / "compute_agent" / "rpc"
SERVED = ROOT / "served.py"
# Each endpoint: its module, and the Protocol of the agent it serves.
ENDPOINTS = {ComputeAgentEndpoint: (ROOT / "server.py", ServedAgent),
             HeartbeatEndpoint: (ROOT / "heartbeat.py", HeartbeatAgent)}
ids = [endpoint.__name__ for endpoint in ENDPOINTS]


@cache
def protocols() -> dict[str, dict[str, str | None]]:
    """Each Protocol of served.py: its members, each with the Protocol it
    is annotated with (an attribute's, a property's return), or None (a
    method, or any other type)."""
    classes = [node for node in ast.parse(SERVED.read_text()).body
               if isinstance(node, ast.ClassDef)
               and any(ast.unparse(base) == "Protocol" for base in node.bases)]
    names = {c.name for c in classes}
    out: dict[str, dict[str, str | None]] = {}
    for c in classes:
        members: dict[str, str | None] = {}
        for node in c.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                annotation = ast.unparse(node.annotation)
                members[node.target.id] = annotation if annotation in names else None
            elif isinstance(node, ast.FunctionDef):
                # A read-only property is the attribute its return names.
                returns = ast.unparse(node.returns) if node.returns else ""
                is_property = any(ast.unparse(d) == "property" for d in node.decorator_list)
                members[node.name] = returns if is_property and returns in names else None
        out[c.name] = members
    return out


def agent_paths(endpoint_class: type) -> set[tuple[str, ...]]:
    """Every path of ``self._agent`` the endpoint class reads, whole (the
    longest chain of attributes), outside the assignment that sets it."""
    source = ENDPOINTS[endpoint_class][0].read_text()
    endpoint = next(node for node in ast.parse(source).body
                    if isinstance(node, ast.ClassDef) and node.name == endpoint_class.__name__)
    parents = {child: node for node in ast.walk(endpoint)
               for child in ast.iter_child_nodes(node)}
    paths = set()
    for node in ast.walk(endpoint):
        if not (isinstance(node, ast.Attribute) and node.attr == "_agent"
                and isinstance(node.value, ast.Name) and node.value.id == "self"
                and isinstance(node.ctx, ast.Load)):
            continue
        path: list[str] = []
        while isinstance(parents.get(node), ast.Attribute):
            node = parents[node]
            path.append(node.attr)
        paths.add(tuple(path))
    return paths


def undeclared(path: tuple[str, ...], top: str) -> str | None:
    """Why ``path`` is not declared by the Protocols under ``top``; None
    when it is."""
    protocol: str | None = top
    for depth, name in enumerate(path):
        reached = "self._agent." + ".".join(path[:depth + 1])
        if protocol is None:
            return f"{reached}: one attribute past what the Protocols declare"
        if name not in protocols()[protocol]:
            return f"{reached}: {protocol} does not declare {name}"
        protocol = protocols()[protocol][name]
    if protocol is not None:
        return (f"self._agent{''.join('.' + n for n in path)}: the {protocol} is handed "
                "on whole; reach its members where they are used")
    return None


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_the_endpoint_is_typed_against_its_protocol(endpoint):
    assert endpoint.__init__.__annotations__["agent"] == ENDPOINTS[endpoint][1].__name__


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_the_endpoint_reaches_only_what_its_protocol_declares(endpoint):
    paths = agent_paths(endpoint)
    top = ENDPOINTS[endpoint][1].__name__
    assert paths  # the reading found the endpoint's paths
    assert sorted(filter(None, (undeclared(p, top) for p in paths))) == []


@pytest.mark.parametrize("path, top, why", [
    (("manager", "tracker", "store", "check_file"), "ServedAgent",
     "self._agent.manager.tracker.store: ServedTracker does not declare store"),
    (("last_tree", "copy"), "ServedAgent",
     "self._agent.last_tree.copy: one attribute past what the Protocols declare"),
    (("manager",), "ServedAgent", "self._agent.manager: the ServedManager is handed on "
                                  "whole; reach its members where they are used"),
    (("sync",), "ServedAgent", "self._agent.sync: ServedAgent does not declare sync"),
    (("sync", "root_uuid"), "HeartbeatAgent",
     "self._agent.sync: HeartbeatAgent does not declare sync"),
    (("manager", "tracker", "snapshot"), "HeartbeatAgent",
     "self._agent.manager.tracker.snapshot: HeartbeatTracker does not declare snapshot"),
])
def test_a_path_past_the_protocol_is_refused(path, top, why):
    assert undeclared(path, top) == why


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_every_member_the_protocol_declares_is_read_by_the_endpoint(endpoint):
    """What it declares beyond what the endpoint reaches is a dependency
    nobody has."""
    paths = agent_paths(endpoint)
    declared = set()

    def walk(protocol: str, prefix: tuple[str, ...]) -> None:
        for name, inner in protocols()[protocol].items():
            if inner is None:
                declared.add(prefix + (name,))
            else:
                walk(inner, prefix + (name,))

    walk(ENDPOINTS[endpoint][1].__name__, ())
    assert declared == paths


def missing_members(value: object, protocol: str, where: str = "agent") -> list[str]:
    """The members ``protocol`` declares that ``value`` lacks, recursively."""
    missing = []
    for name, inner in protocols()[protocol].items():
        if not hasattr(value, name):
            missing.append(f"{where}.{name}")
        elif inner is not None:
            missing += missing_members(getattr(value, name), inner, f"{where}.{name}")
    return missing


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_the_daemons_agent_has_every_member_the_endpoint_needs(endpoint, tmp_path):
    agent = agent_on_fake_host(tmp_path)
    try:
        assert isinstance(agent, Agent)
        assert missing_members(agent, ENDPOINTS[endpoint][1].__name__) == []
    finally:
        agent.manager.tracker.store.close()
