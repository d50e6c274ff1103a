"""New assignment ids: UUIDs of version 7, led by the time in milliseconds,
so that new rows land at the right edge of the assignments' b-trees."""
from __future__ import annotations

import re
import uuid
from types import SimpleNamespace

import pytest

from compute_agent.store import assignment_id
from compute_agent.store.assignment_id import new_assignment_id

# 2024-06-01 12:00:00.123456789 UTC, in nanoseconds.
NOW_NS = 1_717_243_200_123_456_789


@pytest.fixture
def at_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assignment_id, "time", SimpleNamespace(time_ns=lambda: NOW_NS))


@pytest.mark.parametrize("random_bits", [0, (1 << 80) - 1])
def test_an_id_is_an_rfc_9562_version_7_uuid_led_by_the_milliseconds(
        at_now, monkeypatch, random_bits):
    monkeypatch.setattr(assignment_id, "random",
                        SimpleNamespace(getrandbits=lambda bits: random_bits))
    text = new_assignment_id()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                        text)
    parsed = uuid.UUID(text)
    assert str(parsed) == text
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert parsed.int >> 80 == NOW_NS // 1_000_000


# Every bit but the time's, the version's and the variant's.
RANDOM_BITS = ((1 << 80) - 1) & ~(0xF << 76) & ~(0x3 << 62)


def test_ids_made_later_sort_after_and_ids_made_at_once_differ(monkeypatch):
    now = [NOW_NS]
    monkeypatch.setattr(assignment_id, "time", SimpleNamespace(time_ns=lambda: now[0]))
    same_millisecond = {new_assignment_id() for _ in range(1000)}
    assert len(same_millisecond) == 1000
    # All 74 random bits vary (each is 0 in all 1000 with odds of 2**-1000).
    varied = 0
    for text in same_millisecond:
        varied |= uuid.UUID(text).int & RANDOM_BITS
    assert varied == RANDOM_BITS
    now[0] += 1_000_000
    later = new_assignment_id()
    assert all(later > earlier for earlier in same_millisecond)
