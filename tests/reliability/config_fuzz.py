"""Fuzzed config files through the agent's start-up read
(agent.cmd.common.load_config, as compute-agent calls it): a valid file
with sections, options and values added, overridden or broken, and raw
junk lines. Each file is taken, or refused with one ConfigError (the
exit-2 path, its first line naming the option); nothing else escapes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from agent.cmd.common import load_config
from agent.cmd.config_check import registered_options
from agent.cmd.daemon import cli_opts
from agent.exception import ConfigError
from tests.functional.helpers import write_conf
from tests.reliability.exploring import Outcome
from tests.reliability.host_data_fuzz import junk_text

HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}

_RAW_LINES = ["[", "]", "[DEFAULT", "[]", "=", "= value", "key", "key =", " indented",
              "\tcontinued", "#", ";", "[DEFAULT]\n[DEFAULT]", "a = b = c",
              "%(here)s", "$undefined", "${also}", "\x00", "\ufeff[DEFAULT]",
              "key: value", "KEY = Value"]


@dataclass(frozen=True)
class ConfigLine:
    section: str
    option: str
    value: str


class FuzzedConfig:
    """A valid agent config (fake driver) and the files made from it."""

    def __init__(self, directory: Path):
        self.base = write_conf(directory, "http://127.0.0.1:1", "fuzz-host", HOST)
        self.path = directory / "fuzzed.conf"
        conf = load_config(["--config-file", os.fspath(self.base)], cli_opts,
                           placement_required=True)
        self.options = sorted({(o.section, o.name) for o in registered_options(conf)})

    def inputs(self) -> st.SearchStrategy[str]:
        known = st.sampled_from(self.options)
        sections = sorted({s for s, _ in self.options})
        junk_name = st.text(st.characters(codec="utf-8", exclude_characters="[]=:\n\r"),
                            min_size=1, max_size=12)
        line = st.one_of(
            st.builds(lambda so, v: ConfigLine(so[0], so[1], v), known,
                      junk_text(xml_safe=False)),
            st.builds(ConfigLine, st.sampled_from(sections) | junk_name,
                      junk_name, junk_text(xml_safe=False)))
        raw = st.sampled_from(_RAW_LINES) | st.text(max_size=30)
        return st.builds(self.file_text, st.booleans(), st.lists(line, max_size=6),
                         st.lists(raw, max_size=3))

    def file_text(self, keep_base: bool, lines: list[ConfigLine],
                  raw: list[str]) -> str:
        """The valid file (or none of it), then each line in its section,
        then the raw junk."""
        parts = [self.base.read_text()] if keep_base else []
        for line in lines:
            parts.append(f"[{line.section}]\n{line.option} = {line.value}\n")
        parts += [r + "\n" for r in raw]
        return "".join(parts)

    def check(self, text: str) -> Outcome:
        self.path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            load_config(["--config-file", os.fspath(self.path)], cli_opts,
                        placement_required=True)
        except ConfigError as error:
            assert str(error).splitlines()[0].strip(), repr(error)
            return Outcome.REFUSED
        return Outcome.RESULT
