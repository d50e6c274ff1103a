"""CPU list syntax, as the kernel, libvirt and nova write it: '0-3,8,^2'."""
from __future__ import annotations

# Beyond any host's CPU numbers; bounds what a bad value can make us build.
MAX_CPU = 65535


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
        if lo < 0 or hi < lo or hi > MAX_CPU:
            raise ValueError(f"not a valid CPU range: {part!r}")
        target.update(range(lo, hi + 1))
    return frozenset(include - exclude)



def format_cpu_set(cpus: frozenset[int] | set[int]) -> str:
    """The shortest CPU list without exclusions: {0, 1, 2, 3, 8} -> '0-3,8'."""
    parts: list[str] = []
    ordered = sorted(cpus)
    start = 0
    for i, cpu in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != cpu + 1:
            low = ordered[start]
            parts.append(str(low) if low == cpu else f"{low}-{cpu}")
            start = i + 1
    return ",".join(parts)
