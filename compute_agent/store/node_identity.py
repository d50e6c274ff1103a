"""The compute node's UUID, which is the root provider's UUID.

It is kept in ``<state_path>/compute_id``, the file and format nova-compute
uses, so an agent given a nova host's state path adopts its providers."""
from __future__ import annotations

import uuid
from pathlib import Path

from compute_agent.exception import ConfigError
from compute_agent.store.atomic_file import write_private

FILENAME = "compute_id"


def load(state_path: str) -> str | None:
    """The recorded UUID, or None when there is none yet."""
    path = Path(state_path) / FILENAME
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise ConfigError(f"{path}: not a UUID (value: {text[:80]!r})") from None


def new_uuid() -> str:
    """A UUID for a host that has none yet; nothing is written until the
    start has decided to serve with it (``record``)."""
    return str(uuid.uuid4())


def record(state_path: str, node_uuid: str) -> None:
    write_private(Path(state_path) / FILENAME, node_uuid + "\n")
