"""The long reliability scenarios: run every case in tools/reliability_cases
(or those named with --only) for about N minutes each, then print one table
(scenario, seconds, operations, faults injected, violations). Exit status 1
when any row has a violation or a case failed."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

import tools.reliability_cases as cases_package  # noqa: E402 - after the path it needs

COLUMNS = ("scenario", "seconds", "ops", "faults", "violations", "notes")


def discover() -> dict:
    """NAME -> module, for every module in tools/reliability_cases."""
    found = {}
    for info in pkgutil.iter_modules(cases_package.__path__):
        module = importlib.import_module(f"{cases_package.__name__}.{info.name}")
        found[module.NAME] = module
    return dict(sorted(found.items()))


def run_case(module, minutes: float) -> list[dict]:
    """The case's rows; a case that raises is one row with one violation,
    its traceback as the problem."""
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix=f"reliability-{module.NAME}-") as tmp:
            rows = module.run(minutes, Path(tmp))
    except Exception:  # noqa: BLE001 - a case that fails is a violation
        return [{"scenario": module.NAME, "seconds": time.monotonic() - started,
                 "ops": 0, "faults": 0, "violations": 1, "notes": "the case failed",
                 "problems": [traceback.format_exc()]}]
    return rows if isinstance(rows, list) else [rows]


def table(rows: list[dict]) -> str:
    cells = [COLUMNS] + [tuple(_cell(row, c) for c in COLUMNS) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) if i in (0, 5) else v.rjust(w)
                               for i, (v, w) in enumerate(zip(line, widths))).rstrip()
                     for line in cells)


def _cell(row: dict, column: str) -> str:
    value = row.get(column, "")
    if column == "seconds":
        return f"{value:.0f}"
    return str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=5,
                        help="how long each case runs (default 5)")
    parser.add_argument("--only", nargs="+", metavar="NAME", default=[],
                        help="run only these cases")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes must be positive, not {args.minutes}")
    known = discover()
    unknown = set(args.only) - set(known)
    if unknown:
        parser.error(f"unknown case {sorted(unknown)[0]!r}; known: {', '.join(known)}")
    rows = []
    for name, module in known.items():
        if args.only and name not in args.only:
            continue
        print(f"reliability: {name} for {args.minutes:g} min", file=sys.stderr, flush=True)
        rows += run_case(module, args.minutes)
    print(table(rows))
    problems = [(row["scenario"], p) for row in rows for p in row.get("problems", [])]
    for scenario, problem in problems:
        print(f"\n{scenario}: {problem}")
    return 1 if any(row["violations"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
