"""Every module of compute_agent/ with logic has its unit test file, at the
mirrored path: compute_agent/<dir>/<name>.py is tested by
tests/unit/<dir>/test_<name>.py (packages' __init__.py aside). The few
modules without logic are exempt, each by name with its reason, and each
is checked to be still what its exemption says it is: a module that
gains logic, is gone, or has its test file since, fails here, so the list
cannot go stale."""
from __future__ import annotations

import ast
import enum
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "compute_agent"
UNIT = ROOT / "tests" / "unit"


class Kind(enum.Enum):
    """What an exempt module may hold, and nothing else."""

    # Exception classes: a docstring, ``pass``, and at most an __init__
    # that keeps its arguments and a __str__ that formats them.
    EXCEPTIONS = "plain exception classes"
    # Names imported from other modules, and __all__ listing them.
    RE_EXPORTS = "re-exports"
    # One SQL migration step: STATEMENTS, a list of SQL strings.
    MIGRATION_STEP = "SQL migration step"


@dataclass(frozen=True)
class Exemption:
    kind: Kind
    reason: str


MIGRATIONS_TESTED = ("each step's schema is pinned and migrated to by "
                     "tests/unit/store/test_migrations.py")

EXEMPT: dict[str, Exemption] = {
    "cmd/errors.py": Exemption(Kind.EXCEPTIONS, "the commands' exception classes"),
    "conductor/errors.py": Exemption(Kind.EXCEPTIONS, "the conductor's exception classes; "
                                     "their messages are asserted where they are raised"),
    "daemon/errors.py": Exemption(Kind.EXCEPTIONS, "the daemon's exception classes"),
    "heal/errors.py": Exemption(Kind.EXCEPTIONS, "heal's exception class"),
    "store/errors.py": Exemption(Kind.EXCEPTIONS, "the store's exception classes"),
    "rpcapi.py": Exemption(Kind.RE_EXPORTS, "the conductors' stable import path, tested "
                           "where each name is defined"),
    **{f"store/migrations/v{n}.py": Exemption(Kind.MIGRATION_STEP, MIGRATIONS_TESTED)
       for n in range(1, 9)},
}


def modules() -> list[str]:
    """Every module of the package, relative to it, but __init__.py."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                  if p.name != "__init__.py")


def mirrored(module: str) -> Path:
    """The unit test file of ``module`` (relative to compute_agent/)."""
    path = Path(module)
    return UNIT / path.parent / f"test_{path.name}"


def test_every_module_with_logic_has_its_mirrored_test_file():
    missing = [f"compute_agent/{m}: no {mirrored(m).relative_to(ROOT)}"
               for m in modules() if m not in EXEMPT and not mirrored(m).exists()]
    assert missing == [], ("modules without their unit test file (write it, or exempt a "
                           "module without logic in EXEMPT, with its reason):\n"
                           + "\n".join(missing))


def test_each_exemption_is_of_a_module_that_exists_without_a_test_file():
    stale = [f"{m}: no such module" if not (PACKAGE / m).is_file()
             else f"{m}: has {mirrored(m).relative_to(ROOT)}, no need of an exemption"
             for m in sorted(EXEMPT)
             if not (PACKAGE / m).is_file() or mirrored(m).exists()]
    assert stale == []


def test_each_exemption_has_a_one_line_reason():
    assert [m for m, e in EXEMPT.items() if not e.reason.strip() or "\n" in e.reason] == []


# --- what each kind of exempt module may hold ----------------------------------

def is_docstring(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def is_import(node: ast.stmt) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom))


def assigned(node: ast.stmt, name: str) -> ast.expr | None:
    """The value ``node`` assigns to ``name`` alone, if that is what it does."""
    if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
        return node.value
    if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == name:
        return node.value
    return None


def strings(value: ast.expr | None) -> list[str] | None:
    """The strings of a list literal of string constants, else None."""
    if not isinstance(value, ast.List) or not all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts):
        return None
    return [e.value for e in value.elts]


def line(node: ast.AST) -> str:
    """Where ``node`` is, and its first line (a def's without its colon)."""
    first = ast.unparse(node).splitlines()[0].removesuffix(":")
    return f"line {node.lineno}: {first}"


def exception_problems(tree: ast.Module) -> list[str]:
    problems = []
    for node in tree.body:
        if is_docstring(node) or is_import(node):
            continue
        if not isinstance(node, ast.ClassDef):
            problems.append(f"{line(node)}: not an exception class")
            continue
        if not node.bases:
            problems.append(f"line {node.lineno}: class {node.name} derives from nothing")
        for member in node.body:
            if is_docstring(member) or isinstance(member, ast.Pass):
                continue
            if (isinstance(member, ast.FunctionDef)
                    and member.name in ("__init__", "__str__")):
                continue
            problems.append(f"{line(member)}: more than a plain exception class "
                            f"({node.name})")
    return problems


def re_export_problems(tree: ast.Module) -> list[str]:
    problems, imported, exported = [], set(), None
    for node in tree.body:
        if is_docstring(node):
            continue
        if is_import(node):
            imported |= {alias.asname or alias.name
                         for alias in node.names}
            continue
        value = assigned(node, "__all__")
        if value is not None and strings(value) is not None:
            exported = strings(value)
            continue
        problems.append(f"{line(node)}: not an import nor __all__")
    if exported is not None and set(exported) != imported:
        problems.append(f"__all__ is not what the module imports: {sorted(exported)} != "
                        f"{sorted(imported)}")
    return problems


def migration_step_problems(tree: ast.Module) -> list[str]:
    problems = [f"{line(node)}: not a STATEMENTS list of SQL strings"
                for node in tree.body if not is_docstring(node)
                and strings(assigned(node, "STATEMENTS")) is None]
    if not [node for node in tree.body if assigned(node, "STATEMENTS") is not None]:
        problems.append("no STATEMENTS")
    if not (UNIT / "store" / "test_migrations.py").exists():
        problems.append("tests/unit/store/test_migrations.py, which tests the steps, is gone")
    return problems


PROBLEMS = {Kind.EXCEPTIONS: exception_problems, Kind.RE_EXPORTS: re_export_problems,
            Kind.MIGRATION_STEP: migration_step_problems}


def problems_of(module: str, kind: Kind) -> list[str]:
    return PROBLEMS[kind](ast.parse((PACKAGE / module).read_text()))


@pytest.mark.parametrize("module", sorted(m for m in EXEMPT if (PACKAGE / m).is_file()))
def test_an_exempt_module_holds_only_what_its_exemption_says(module):
    kind = EXEMPT[module].kind
    assert problems_of(module, kind) == [], (
        f"compute_agent/{module} is exempt from a test file as {kind.value}, and is no "
        "longer only that: give it its test file and drop its exemption")


# --- the rules above, on modules made for them ---------------------------------

@pytest.mark.parametrize("source, kind, problems", [
    ('"""Errors."""\nfrom x import Base\n\n\nclass A(Base):\n    """a"""\n\n\n'
     'class B(Base):\n    def __init__(self, n):\n        super().__init__(n)\n\n'
     '    def __str__(self):\n        return f"{self.args[0]}"\n', Kind.EXCEPTIONS, []),
    ('class A(Exception):\n    def describe(self):\n        return 1\n', Kind.EXCEPTIONS,
     ["line 2: def describe(self): more than a plain exception class (A)"]),
    ('def helper():\n    return 1\n', Kind.EXCEPTIONS,
     ["line 1: def helper(): not an exception class"]),
    ('class A:\n    pass\n', Kind.EXCEPTIONS, ["line 1: class A derives from nothing"]),
    ('LIMIT = 3\n', Kind.EXCEPTIONS, ["line 1: LIMIT = 3: not an exception class"]),
    ('"""Names."""\nfrom a import b, c as d\n__all__ = ["b", "d"]\n', Kind.RE_EXPORTS, []),
    ('from a import b\n__all__ = ["b", "e"]\n', Kind.RE_EXPORTS,
     ["__all__ is not what the module imports: ['b', 'e'] != ['b']"]),
    ('from a import b\n\ndef c():\n    return b\n', Kind.RE_EXPORTS,
     ["line 3: def c(): not an import nor __all__"]),
    ('"""Version 9."""\nSTATEMENTS = ["CREATE TABLE t (a)", "DROP TABLE u"]\n',
     Kind.MIGRATION_STEP, []),
    ('STATEMENTS = [f"CREATE TABLE {name}"]\n', Kind.MIGRATION_STEP,
     ["line 1: STATEMENTS = [f'CREATE TABLE {name}']: not a STATEMENTS list of SQL "
      "strings"]),
    ('"""Version 9."""\n', Kind.MIGRATION_STEP, ["no STATEMENTS"]),
])
def test_what_each_kind_of_exempt_module_may_hold(source, kind, problems):
    assert PROBLEMS[kind](ast.parse(source)) == problems
