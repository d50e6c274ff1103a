"""The compute node's UUID, which is the root provider's UUID.

It is kept in ``<state_path>/compute_id``, the file and format nova-compute
uses, so an agent given a nova host's state path adopts its providers."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

from agent.exception import ConfigError

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


def load_or_create(state_path: str) -> str:
    return load(state_path) or _create(Path(state_path) / FILENAME)


def _create(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    node_uuid = str(uuid.uuid4())
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(node_uuid + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return node_uuid
