"""Which package may import which: drivers never import the agent, and the
shared helpers in compute_common import neither, so the agent can use the
drivers without the two depending on each other both ways."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_packages(package: str) -> dict[str, set[str]]:
    """Each module file under ``package`` -> the top-level packages it
    imports (absolute imports only; the code uses no relative ones)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("package,forbidden", [
    ("drivers", {"agent"}),
    ("compute_common", {"agent", "drivers"}),
])
def test_package_does_not_import(package, forbidden):
    modules = imported_packages(package)
    assert modules, f"no modules found under {package}"
    offenders = {path: sorted(names & forbidden)
                 for path, names in modules.items() if names & forbidden}
    assert offenders == {}
