"""New assignment ids."""
from __future__ import annotations

import random
import time


def new_assignment_id() -> str:
    """A UUID led by the time in milliseconds (RFC 9562's version 7). New
    rows then land at the right edge of the assignments' b-trees, so a
    group commit dirties a few pages rather than one or more per row. The
    rest is from the process's PRNG, like claims.new_mdev_uuid, and for
    the same reason: it is drawn inside the tracker's lock."""
    value = (time.time_ns() // 1_000_000) << 80 | random.getrandbits(80)
    value = value & ~(0xF << 76) | 0x7 << 76  # version
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant
    # Formatted here: uuid.UUID would check again what was just built, at
    # twice the cost, and this runs four times a claim in the writer thread.
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
