"""The store's schema, one step a version: module ``v<N>`` holds the
statements that take a store from version N-1 to N, as a list (SQL is
never split on ``;``), and says what the version added. A step, once
released, never changes: tests/unit/store/schema_history.json pins what
each built."""
from __future__ import annotations

import importlib
import pkgutil
import re


def _steps() -> dict[int, list[str]]:
    """version -> its statements, from every module of this package."""
    steps = {}
    for module in pkgutil.iter_modules(__path__):
        number = re.fullmatch(r"v([1-9][0-9]*)", module.name)
        if number is None:
            raise ImportError(f"{__name__}.{module.name}: a step's module is named "
                              "v<version>")
        steps[int(number[1])] = importlib.import_module(f"{__name__}.{module.name}").STATEMENTS
    return steps


MIGRATIONS: dict[int, list[str]] = _steps()
