"""Logging what a driver could not read, once per occurrence.

A device that cannot be read is skipped with the same warning every cycle
for as long as it stays broken; an operator needs it once. It is logged
again when its text changes (another reason or value) and when it comes
back after a cycle without it (the device recovered and failed again).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable


class WarningsOnce:
    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._last_cycle: frozenset[str] = frozenset()

    def log_cycle(self, warnings: Iterable[str]) -> None:
        """Log this cycle's warnings that the last cycle did not have."""
        current = list(dict.fromkeys(warnings))
        for warning in current:
            if warning not in self._last_cycle:
                self._logger.warning("%s", warning)
        self._last_cycle = frozenset(current)
