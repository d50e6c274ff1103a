"""CPU list syntax, as the kernel and nova write it: '0-3,8,^2'."""
from __future__ import annotations


def parse_cpu_set(text: str, allow_exclusions: bool = True) -> frozenset[int]:
    """Parse a CPU list. Raises ValueError naming the bad part."""
    include: set[int] = set()
    exclude: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        target = include
        if part.startswith("^"):
            if not allow_exclusions:
                raise ValueError(f"exclusion not allowed here: {part!r}")
            target, part = exclude, part[1:]
        low, sep, high = part.partition("-")
        try:
            lo = int(low)
            hi = int(high) if sep else lo
        except ValueError:
            raise ValueError(f"not a CPU number or range: {part!r}") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"not a valid CPU range: {part!r}")
        target.update(range(lo, hi + 1))
    return frozenset(include - exclude)


def format_cpu_set(cpus: frozenset[int]) -> str:
    """The shortest list form: '0-3,8'."""
    out, run = [], []
    for cpu in sorted(cpus):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(_run(run))
        run = [cpu]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
