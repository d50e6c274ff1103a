"""The RPC tests' in-memory broker: kombu's memory transport, emptied for
each test (its queues and exchanges are its module's globals)."""
from __future__ import annotations

from collections import defaultdict

import pytest
from kombu.transport import memory, virtual


@pytest.fixture
def memory_broker(monkeypatch):
    """An empty in-memory broker; ``kombu+memory:////`` reaches it. Its
    queues by name."""
    queues: defaultdict = defaultdict(memory.Queue)
    monkeypatch.setattr(memory.Channel, "queues", queues)
    monkeypatch.setattr(memory.Transport, "global_state", virtual.BrokerState())
    return queues
