"""The order of the packages, from the pure core up to the entry points
(compute_agent/__init__.py declares it, docs/architecture.md lists it):
a module imports only from its own unit or from units before it, no two
modules import each other however far round, a module marked pure
imports nothing that does I/O, the conductor's side never imports the
daemon, and drivers never import the agent.

Every import counts: at module level, inside functions and under
``if TYPE_CHECKING``, since each is a dependency a reader must follow."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = "compute_agent"



def declared_order() -> tuple[str, ...]:
    """The order as compute_agent/__init__.py's docstring draws it, the one
    place it is written: its indented lines, read left to right and top to
    bottom, units apart by "->" or ",", a "(...)" being a remark. A unit
    is a package of compute_agent/ or one of the few modules left directly
    in it."""
    doc = ast.get_docstring(ast.parse((ROOT / TOP / "__init__.py").read_text()))
    drawn = ",".join(re.sub(r"\(.*?\)", "", line) for line in doc.splitlines()
                     if line.startswith("    "))
    return tuple(f"{TOP}.{name.strip()}" for name in re.split(r"->|,", drawn)
                 if name.strip())


# The host syntaxes both sides read (common) and the drivers come first, so
# the drivers never import the agent. compute_agent.testing stands apart
# (below).
ORDER = declared_order()
# What the drivers may import of ours: the rest is the agent.
DRIVERS_SIDE = (f"{TOP}.common", f"{TOP}.drivers")
# Libraries that talk to the world: a pure module reaches none of them,
# directly or through what it imports.
IO_LIBRARIES = frozenset({"requests", "libvirt", "sqlite3", "oslo_messaging", "kombu",
                          "keystoneauth1", "socket", "subprocess", "urllib", "http"})


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / TOP).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _owner(name: str) -> str | None:
    """The module of ours that ``name`` (a module or a name in one) is."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@cache
def imports(module: str) -> tuple[frozenset[str], frozenset[str]]:
    """(the modules of ours ``module`` imports, the other top-level
    packages it imports)."""
    ours, others = set(), set()
    for node in ast.walk(ast.parse(modules()[module].read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import"
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            owner = _owner(name)
            if owner is None:
                others.add(name.split(".")[0])
            elif owner != module and not module.startswith(owner + "."):
                ours.add(owner)
    return frozenset(ours), frozenset(others)


def reached(module: str) -> set[str]:
    """Every module of ours that importing ``module`` imports."""
    seen, todo = set(), [module]
    while todo:
        for target in imports(todo.pop())[0]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def unit(module: str) -> str | None:
    return next((u for u in ORDER if module == u or module.startswith(u + ".")), None)


def imports_running_back_up() -> list[str]:
    found = []
    for module in sorted(modules()):
        here = unit(module)
        for target in sorted(imports(module)[0]):
            there = unit(target)
            if here and there and ORDER.index(there) > ORDER.index(here):
                found.append(f"{module} -> {target}")
    return found


def circles() -> list[list[str]]:
    """The groups of modules that import each other, however far round."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in imports(module)[0]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(modules()):
        if module not in index:
            visit(module)
    return found


def marked_pure(module: str) -> bool:
    """Its docstring's first paragraph says it is pure."""
    doc = ast.get_docstring(ast.parse(modules()[module].read_text())) or ""
    return re.search(r"\bpure\b", doc.split("\n\n")[0], re.IGNORECASE) is not None


def test_the_order_is_read_from_its_one_place():
    assert ORDER[:3] == (f"{TOP}.common", f"{TOP}.drivers", f"{TOP}.dependencies")
    assert ORDER[-1] == f"{TOP}.cmd"
    assert len(set(ORDER)) == len(ORDER) > 15
    assert all(modules().get(u) for u in ORDER), [u for u in ORDER if u not in modules()]


def architecture_table() -> list[str]:
    """The units of docs/architecture.md's package table, in its order."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return [f"{TOP}." + path.removesuffix("/").removesuffix(".py").replace("/", ".")
            for path in re.findall(r"^\| \d+ \| `compute_agent/([\w/.]+)` \|",
                                   text, re.MULTILINE)]


def test_the_architecture_table_lists_the_units_in_the_declared_order():
    assert architecture_table() == list(ORDER)


def test_no_package_restates_what_it_may_import():
    """What a package may import is the declared order, said once: a
    package's docstring that lists its imports goes stale (it did)."""
    restating = [p for p, path in modules().items() if path.name == "__init__.py"
                 and re.search(r"\bImports\b", ast.get_docstring(
                     ast.parse(path.read_text())) or "")]
    assert restating == []


def test_every_module_of_the_agent_is_in_a_declared_unit():
    loose = [m for m in modules() if m != TOP and unit(m) is None
             and not m.startswith(f"{TOP}.testing")]
    assert loose == []


def test_no_import_runs_back_up_the_declared_order():
    assert imports_running_back_up() == []


def test_no_modules_import_each_other():
    assert circles() == []


def test_the_core_is_marked_pure():
    """The marks the next test relies on: losing one is a change to see."""
    pure = {m for m in modules() if marked_pure(m)}
    assert {"compute_agent.claims.model", "compute_agent.claims.choice", "compute_agent.tree.provider_tree",
            "compute_agent.tree.host_tree", "compute_agent.heal.rules", "compute_agent.heal.realign",
            "compute_agent.moves.evacuation", "compute_agent.moves.live_migration",
            "compute_agent.health.rules", "compute_agent.reports.status", "compute_agent.reports.tree",
            "compute_agent.store.rebuild", "compute_agent.store.adoption"} <= pure


@pytest.mark.parametrize("module", sorted(m for m in modules() if marked_pure(m)))
def test_a_pure_module_reaches_no_io_library(module):
    reaching = {m: sorted(imports(m)[1] & IO_LIBRARIES)
                for m in {module} | reached(module) if imports(m)[1] & IO_LIBRARIES}
    assert reaching == {}


def test_the_conductors_side_never_imports_the_daemon():
    conductor = [m for m in modules() if unit(m) in ("compute_agent.conductor", "compute_agent.rpcapi")]
    assert conductor
    assert {m: sorted(d for d in reached(m) if unit(d) == "compute_agent.daemon")
            for m in conductor} == {m: [] for m in conductor}


def test_the_testing_helpers_stand_apart_from_the_agent():
    """compute_agent.testing (a local Placement, a fault proxy) is for tests and
    tools: the agent never imports it, and it imports none of the agent."""
    testing = {m for m in modules() if m.startswith("compute_agent.testing")}
    assert {m for m in modules() if m not in testing
            and imports(m)[0] & testing} == set()
    assert {m for m in testing if imports(m)[0] - testing} == set()


def test_every_package_says_what_it_holds_and_may_import():
    packages = [m for m, path in modules().items() if path.name == "__init__.py"]
    assert [p for p in packages if not ast.get_docstring(
        ast.parse(modules()[p].read_text()))] == []


def test_the_conductors_import_path_names_the_client_and_the_live_migration_run():
    """compute_agent.rpcapi is what conductors import (docs/architecture.md):
    stable across the move of its parts into their packages."""
    from compute_agent import rpcapi
    from compute_agent.conductor.live_migration import live_migrate_instance
    from compute_agent.placement.allocations import move_allocations
    from compute_agent.rpc.client import ComputeAgentAPI
    assert (rpcapi.ComputeAgentAPI, rpcapi.move_allocations,
            rpcapi.live_migrate_instance) == (ComputeAgentAPI, move_allocations,
                                              live_migrate_instance)


def test_the_architecture_names_every_name_rpcapi_exports():
    from compute_agent import rpcapi
    text = (ROOT / "docs" / "architecture.md").read_text()
    paragraph = text.partition("Conductors import from `compute_agent.rpcapi`")[2]
    named = set(re.findall(r"`(\w+)`", paragraph.partition("\n\n")[0]))
    assert named == set(rpcapi.__all__)


def defined_errors(units: tuple[str, ...]) -> dict[str, type]:
    """Every exception class defined in a module of these units, by where
    it is defined."""
    import importlib
    found = {}
    for module in sorted(m for m in modules() if unit(m) in units
                         or m.startswith(tuple(u + "." for u in units))):
        loaded = importlib.import_module(module)
        for name, value in vars(loaded).items():
            if (isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__ == module):
                found[f"{module}.{name}"] = value
    return found


def test_every_error_of_the_agent_has_one_home_and_is_an_agent_error():
    """Those that cross RPC in compute_agent/exception.py (the path is on the
    wire), every other in its package's errors module."""
    from compute_agent.exception import AgentError
    errors = defined_errors(tuple(u for u in ORDER if u not in DRIVERS_SIDE)
                            + (f"{TOP}.testing",))
    assert errors
    assert {where for where in errors
            if not where.startswith(("compute_agent.exception.", "compute_agent.testing."))
            and where.rpartition(".")[0].rpartition(".")[2] != "errors"} == set()
    assert {where for where, error in errors.items()
            if not where.startswith("compute_agent.testing.")
            and not issubclass(error, AgentError)} == set()


def test_every_error_of_the_drivers_is_a_driver_error_in_drivers_errors():
    from compute_agent.drivers.errors import DriverError
    errors = defined_errors((f"{TOP}.drivers",))
    assert errors
    assert {where for where, error in errors.items()
            if not where.startswith("compute_agent.drivers.errors.")
            or not issubclass(error, DriverError)} == set()
