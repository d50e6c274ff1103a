"""Fuzzed config files through the agent's start-up read
(compute_agent.cmd.common.load_config, as compute-agent calls it): a valid file
with sections, options and values added, overridden or broken, names
misspelt, and raw junk lines. Each file is taken, or refused with one
ConfigError (the exit-2 path, its first line naming the option); nothing
else escapes.

And a sweep (ConfigSweep) of the mistakes an operator makes, each with
the verdict it must get: every option's and section's name with a typing
slip, names of another version, and each class of value that cannot work.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from compute_agent.cmd.common import load_config
from compute_agent.cmd.config_check.options import registered_options
from compute_agent.cmd.daemon import cli_opts
from compute_agent.exception import ConfigError
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
                      junk_name, junk_text(xml_safe=False)),
            # A typing slip in a known option's name, or in a section's.
            st.builds(lambda so, v: ConfigLine(so[0], _slip(so[1]), v), known,
                      junk_text(xml_safe=False)),
            st.builds(lambda so, v: ConfigLine(_slip(so[0]), so[1], v), known,
                      junk_text(xml_safe=False)))
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


# --- the sweep: each kind of mistake, with the verdict it must get ------------

class Expect(str, enum.Enum):
    MISSPELLING = "refused naming the known name"    # did you mean ...?
    REFUSED = "refused in one line naming the option"
    TAKEN = "taken (a name of another version: one warning)"


@dataclass(frozen=True)
class SweepCase:
    kind: str       # the class of mistake, as the counts group them
    text: str       # appended to the valid file
    expect: Expect
    named: str = ""  # what the refusal line must contain


@dataclass
class SweepCounts:
    cases: int = 0
    right: int = 0
    accepted_wrongly: int = 0  # a mistake taken as if valid
    refused_wrongly: int = 0   # a valid name or value refused
    badly_refused: int = 0     # refused, but not in the line it must be
    escaped: int = 0           # anything but a result or a ConfigError
    wrong: list[str] = field(default_factory=list)


def _slip(name: str) -> str:
    """One typing slip in ``name``: two neighbouring letters swapped, or,
    where all are alike, the last one doubled."""
    for i in range(len(name) // 2, len(name) - 1):
        if name[i] != name[i + 1] and name[i].isalpha() and name[i + 1].isalpha():
            return name[:i] + name[i + 1] + name[i] + name[i + 2:]
    return name + name[-1]


def _long(n: int) -> str:
    return "x" * n


class ConfigSweep:
    """The valid file (fake driver, noauth2 Placement) with one mistake
    each, read as compute-agent reads it at start."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.base = write_conf(directory, "http://127.0.0.1:1", "sweep-host", HOST)
        self.path = directory / "swept.conf"
        conf = load_config(["--config-file", os.fspath(self.base)], cli_opts,
                           placement_required=True)
        self.options = sorted({(o.section, o.name) for o in registered_options(conf)
                               if not o.section.startswith("mdev_")})

    def cases(self) -> list[SweepCase]:
        d = self.directory
        (d / "a-directory").mkdir(exist_ok=True)
        out = []
        for section, name in self.options:
            slip = _slip(name) if len(name) >= 4 else name.upper()
            if (section, slip) not in self.options:
                out.append(SweepCase("misspelt option", f"[{section}]\n{slip} = 1\n",
                                     Expect.MISSPELLING, f"did you mean {name}?"))
        for section in sorted({s for s, _ in self.options} | {"DEFAULT"}):
            slip = section + section[-1]
            out.append(SweepCase("misspelt section", f"[{slip}]\nx = 1\n",
                                 Expect.MISSPELLING, f"did you mean [{section}]?"))
        for text in ("[DEFAULT]\nupdate_interval_max = 5\n", "[newer_feature]\nenabled = 1\n",
                     "[compute]\nsome_option_of_2030 = 1\n",
                     "[keystone_authtoken]\nauth_url = http://k/\n",
                     "[devices]\nenabled_mdev_types = nvidia-35\n"
                     "[mdev_nvidia-36]\ndevice_addresses = 0000:81:00.0\n"):
            out.append(SweepCase("unknown name", text, Expect.TAKEN))
        out.append(SweepCase("byte-order mark", "\ufeff", Expect.TAKEN))
        long_name = f"{d}/{_long(300)}"
        values = [
            ("file name length", "DEFAULT", "log_file", f"{long_name}.log"),
            ("file name length", "DEFAULT", "log_dir", long_name),
            ("file name length", "DEFAULT", "state_path", long_name),
            ("file name length", "fake", "state_file", f"{long_name}.json"),
            ("file name length", "pmem", "ndctl_json", long_name),
            ("file name length", "libvirt", "instances_path", long_name),
            ("file or directory", "fake", "state_file", f"{d}/a-directory"),
            ("file or directory", "fake", "host_file", f"{d}/a-directory"),
            ("file or directory", "DEFAULT", "log_file", f"{d}/a-directory"),
            ("file or directory", "pmem", "ndctl_json", f"{d}/a-directory"),
            ("transport driver", "DEFAULT", "transport_url", "kafka://127.0.0.1:9092/"),
            ("transport driver", "oslo_messaging_notifications", "transport_url",
             "kafka://127.0.0.1:9092/"),
            ("trait name", "DEFAULT", "owner_trait", "CUSTOM_" + "X" * 249),
            ("trait name", "DEFAULT", "owner_trait", "CUSTOM_lower_case"),
            ("trait name", "pci", "device_spec",
             '{"vendor_id": "8086", "traits": "' + "T" * 300 + '"}'),
            ("metrics address", "metrics", "listen", "192.0.2.1:9100"),
            ("metrics address", "metrics", "listen", "nosuchhost.invalid:9100"),
        ] + [("log format", "DEFAULT", name, "%(nosuchkey)s")
             for name in ("logging_context_format_string", "logging_default_format_string",
                          "logging_debug_format_suffix", "logging_exception_prefix",
                          "logging_user_identity_format", "instance_format",
                          "instance_uuid_format")] + [
            ("long value", section, name, value) for section, name, value in (
                ("placement", "timeout", _long(200_000)),
                ("pmem", "namespaces", _long(200_000)),
                ("compute", "cpu_dedicated_set", "0," * 200_000 + "a"),
                ("DEFAULT", "host", _long(200_000)),
                ("DEFAULT", "update_interval", "9" * 200_000),
                ("devices", "enabled_mdev_types", "bad type " + _long(200_000)),
                ("pci", "device_spec", "{" + _long(200_000)))]
        for kind, section, name, value in values:
            out.append(SweepCase(kind, f"[{section}]\n{name} = {value}\n", Expect.REFUSED,
                                 f"[{section}] {name}: "))
        out.append(SweepCase("deprecated name", "[DEFAULT]\nreserved_host_memory_mb = abc\n",
                             Expect.REFUSED, "[DEFAULT] reserved_host_memory_mb: "))
        return out

    def verdict(self, case: SweepCase) -> tuple[str, str]:
        """('right' or what went wrong, the line or the error)."""
        text = self.base.read_text() + case.text
        if case.text == "\ufeff":
            text = "\ufeff" + self.base.read_text()
        self.path.write_text(text)
        try:
            load_config(["--config-file", os.fspath(self.path)], cli_opts,
                        placement_required=True)
        except ConfigError as error:
            line = str(error)
            if case.expect is Expect.TAKEN:
                return "refused_wrongly", line
            one_line = "\n" not in line and len(line) <= LINE_LIMIT
            if one_line and case.named in line and (
                    case.expect is Expect.REFUSED or "did you mean" in line):
                return "right", line
            return "badly_refused", line[:200]
        except Exception as error:
            return "escaped", f"{type(error).__name__}: {str(error)[:200]}"
        if case.expect is Expect.TAKEN:
            return "right", ""
        return "accepted_wrongly", ""

    def run(self) -> SweepCounts:
        counts = SweepCounts()
        for case in self.cases():
            counts.cases += 1
            verdict, detail = self.verdict(case)
            if verdict == "right":
                counts.right += 1
                continue
            setattr(counts, verdict, getattr(counts, verdict) + 1)
            counts.wrong.append(f"{verdict}: {case.kind}: {case.text[:80]!r}: {detail}")
        return counts


# An error line's longest, its command's name and "error: " aside.
LINE_LIMIT = 270
