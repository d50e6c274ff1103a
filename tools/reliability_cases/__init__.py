"""The long reliability scenarios that tools/reliability runs.

Each module here is one scenario and exposes:

    NAME: str                 # short name, used by --only
    run(minutes: float, workdir: pathlib.Path) -> dict | list[dict]

``run`` works for about ``minutes`` (its own components started under
``workdir``, a fresh temporary directory removed afterwards) and returns one
row, or several (e.g. one per fault rate), each a dict with:

    scenario:   str    what the row is, e.g. "placement faults 20%"
    seconds:    float  how long it ran
    ops:        int    operations done (cycles, calls, inputs, kills, ...)
    faults:     int    faults injected
    violations: int    invariant violations found (must be 0)
    notes:      str    optional: one line, e.g. "p99 41 ms; rss +2 MiB"
    problems:   list[str]  optional: one line per violation, printed below the table

A module is found by being here: adding a scenario touches no other file.
"""
