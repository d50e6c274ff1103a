"""The docs stay true to the repository: every relative link in README.md
and docs/*.md reaches a file (and, with an #anchor into a Markdown file, a
heading of it), and every command line the docs show names a subcommand
and options the commands' own parsers have.

A command line is a code span, or a line of a fenced block, that starts
with compute-agent, compute-agent-manage or compute-agent-ctl. Its
metasyntax is read as the docs write it: [optional] parts, a|b
alternatives, ``...`` for what is left out, upper-case placeholders."""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from compute_agent.cmd import common, ctl, daemon, manage

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^ {0,3}```.*?^ {0,3}```[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# An option as argparse's help lists it: "--name METAVAR" or "-d".
HELP_OPTION = re.compile(r"^\s{2}(-\S.*?)(?:\s{2,}|$)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """``text`` without its fenced blocks and with its code spans blanked:
    what Markdown renders as links and headings."""
    return CODE_SPAN.sub("code", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` that reaches no file or no heading."""
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"^[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        reached = (path.parent / file_part).resolve() if file_part else path
        if not reached.exists():
            broken.append(f"{target}: no such file")
        elif anchor and reached.suffix == ".md" and anchor not in anchors(reached):
            broken.append(f"{target}: no heading #{anchor} in {reached.name}")
    return broken


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section: `here`\n")
    page.write_text("[ok](other.md#a-section-here) [gone](missing.md) "
                    "[no](other.md#nowhere) `[in code](missing.md)`\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#nowhere: no heading #nowhere in other.md"]


# --- The commands the docs name -------------------------------------------

@dataclass(frozen=True)
class Parser:
    """What one parser accepts: option -> whether it takes a value, and
    its subcommands' parsers."""
    options: dict[str, bool]
    subcommands: dict[str, Parser]


def options_in_help(help_text: str) -> dict[str, bool]:
    options = {}
    for line in help_text.splitlines():
        match = HELP_OPTION.match(line)
        if match:
            for spelling in match.group(1).split(", "):
                name, _, metavar = spelling.partition(" ")
                options[name] = bool(metavar)
    return options


def top_level_help(cli_opts, command_help: common.CommandHelp) -> str:
    """The help the command prints, from the parser oslo.config builds."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        common.load_config(["--help"], cli_opts, command_help=command_help)
    return out.getvalue()


def subcommand_parsers(add_parsers) -> dict[str, Parser]:
    """The subcommands as the command's own ``add_parsers`` declares them."""
    subparsers = argparse.ArgumentParser().add_subparsers()
    add_parsers(subparsers)
    return {name: Parser(options_in_help(p.format_help()), {})
            for name, p in subparsers.choices.items()}


@functools.cache
def parsers() -> dict[str, Parser]:
    manage_command = manage.cfg.SubCommandOpt("command", handler=manage.add_parsers,
                                              title="commands")
    return {
        "compute-agent": Parser(
            options_in_help(top_level_help(daemon.cli_opts, daemon.HELP)), {}),
        "compute-agent-manage": Parser(
            options_in_help(top_level_help([manage_command], manage.HELP)),
            subcommand_parsers(manage.add_parsers)),
        "compute-agent-ctl": Parser(
            options_in_help(top_level_help(ctl.cli_opts, ctl.HELP)),
            subcommand_parsers(ctl.add_parsers)),
    }


def command_lines(text: str) -> list[str]:
    """Every code span and fenced line that starts with one of the commands
    (``.venv/bin/`` before it, as the quick start writes them, or not)."""
    snippets = CODE_SPAN.findall(FENCE.sub("", text))
    for block in FENCE.findall(text):
        snippets += [re.split(r"\s#\s", line)[0] for line in block.splitlines()[1:-1]]
    # In a table a code span writes its | as \|.
    snippets = [s.replace("\\|", "|").strip().removeprefix(".venv/bin/") for s in snippets]
    return [s for s in snippets if s.split() and s.split()[0] in parsers()]


def refusals(line: str) -> list[str]:
    """What in the command ``line`` its parsers do not know. Options after
    a subcommand are the subcommand's (with a|b subcommands, the first's),
    or the command's own."""
    program, *words = line.split()
    parser = parsers()[program]
    scope, subcommand, refused = parser, None, []
    takes_value = False
    for word in words:
        alternatives = [a for a in word.strip("[]").split("|")
                        if a.strip("[]") not in ("", "...")]
        if takes_value or not alternatives:
            takes_value = False
            continue
        for alternative in (a.strip("[]") for a in alternatives):
            if alternative.startswith("-"):
                name, equals, _ = alternative.partition("=")
                # The command's own options come after its subcommand too.
                options = {**parser.options, **scope.options}
                if name not in options:
                    refused.append(f"{program} {subcommand or ''}: no option {name}")
                else:
                    takes_value = options[name] and not equals
            elif scope is parser and parser.subcommands:
                subcommand = subcommand or alternative
                if alternative not in parser.subcommands:
                    refused.append(f"{program}: no subcommand {alternative}")
            elif not parser.subcommands:
                refused.append(f"{program} takes no subcommand: {alternative}")
        if subcommand in parser.subcommands:
            scope = parser.subcommands[subcommand]
        elif subcommand is not None:
            break  # what follows an unknown subcommand cannot be judged
    return refused


def test_the_parsers_are_read():
    """The check below means something only if the real parsers were read."""
    found = parsers()
    assert {"--once", "--config-file"} <= set(found["compute-agent"].options)
    assert "--timeout" in found["compute-agent-ctl"].options
    assert {"tree", "heal", "rebuild-store"} <= set(found["compute-agent-manage"].subcommands)
    assert {"evacuate", "live-migrate"} <= set(found["compute-agent-ctl"].subcommands)
    assert found["compute-agent-manage"].subcommands["heal"].options["--dry-run"] is False


def test_the_docs_name_each_command():
    lines = [line for path in doc_files() for line in command_lines(path.read_text())]
    assert {line.split()[0] for line in lines} == set(parsers())


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_line_the_docs_show_exists(path):
    assert [(line, refusal) for line in command_lines(path.read_text())
            for refusal in refusals(line)] == []


@pytest.mark.parametrize("line,expected", [
    ("compute-agent-manage --config-file ... heal [--dry-run] [--json] [--yes]", []),
    ("compute-agent-manage --config-file F rebuild-store --dry-run|--yes", []),
    ("compute-agent-ctl --timeout 5 evacuate SOURCE [--target HOST]", []),
    ("compute-agent-ctl evacuate SOURCE --timeout 5 [--target HOST]", []),
    ("compute-agent-manage heal --config-file F --dry-run", []),
    ("compute-agent --config-file F --once", []),
    ("compute-agent-manage repair --yes", ["compute-agent-manage: no subcommand repair"]),
    ("compute-agent-ctl show|mend HOST", ["compute-agent-ctl: no subcommand mend"]),
    ("compute-agent-ctl hosts --force", ["compute-agent-ctl hosts: no option --force"]),
    ("compute-agent --config-file F once", ["compute-agent takes no subcommand: once"]),
])
def test_a_command_line_is_read_as_the_docs_write_it(line, expected):
    assert refusals(line) == expected


def test_every_logger_the_configuration_page_names_is_a_module_that_logs():
    """Loggers follow the modules (``logging.getLogger(__name__)``): a name
    for ``default_log_levels`` is a package, or a module with a logger."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    named = set(re.findall(r"`(compute_agent(?:\.\w+)*)`", text))
    assert len(named) > 5, named

    def logs(name: str) -> bool:
        path = ROOT / Path(*name.split("."))
        if path.is_dir():
            return (path / "__init__.py").exists()
        module = path.with_suffix(".py")
        return module.exists() and "getLogger(__name__)" in module.read_text()

    assert sorted(n for n in named if not logs(n)) == []


# --- The modules, files and facts the docs name ----------------------------

# The changelog records what was true when each entry was written; the
# benchmarks, what was measured then. Neither is rewritten when code moves.
HISTORY = ("CHANGELOG.md", "benchmarks.md")
DOTTED = re.compile(r"(?<![\w./-])compute_agent(?:\.[A-Za-z_]\w*)+")
# A path in the checkout, as the docs write it (not /etc/..., an installed
# host's): compute_agent/x/y.py, compute_agent/x/, tools/demo, tests/...
CHECKOUT_PATH = re.compile(r"(?<![\w./-])(?:compute_agent|tools|tests|etc)/[\w./-]*[\w/]")


def current_docs() -> list[Path]:
    return [p for p in doc_files() if p.name not in HISTORY]


def resolves(dotted: str) -> bool:
    """``dotted`` is a module of ours, or a name defined in one."""
    import importlib
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def unknown_names(text: str) -> list[str]:
    """The dotted names and checkout paths in ``text`` that do not exist.
    ``compute_agent.X``, one capital letter, is a placeholder."""
    gone = [n for n in DOTTED.findall(text)
            if not re.fullmatch(r"[A-Z]", n.rpartition(".")[2]) and not resolves(n)]
    gone += [p for p in CHECKOUT_PATH.findall(text) if not (ROOT / p).exists()]
    return sorted(set(gone))


@pytest.mark.parametrize("path", current_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_and_file_the_docs_name_exists(path):
    assert unknown_names(path.read_text()) == []


def test_a_name_that_went_away_is_found():
    assert unknown_names(
        "`compute_agent.rpcapi.ComputeAgentAPI`, compute_agent/tree/ownership.py, "
        "`compute_agent.X`, /etc/compute-agent/x.conf, tools/demo; gone: "
        "`compute_agent.heartbeat.SourceFence`, compute_agent/agent/ownership.py, "
        "`compute_agent.rpcapi.Nothing`, tools/nothing") == [
        "compute_agent.heartbeat.SourceFence", "compute_agent.rpcapi.Nothing",
        "compute_agent/agent/ownership.py", "tools/nothing"]


def schema_statements(text: str) -> list[tuple[int, bool]]:
    """Each "schema N" or "schema version N" in ``text``: N, and whether it
    says when something came or went ("since schema 7", "schema 5 and
    older") rather than the store's version now."""
    return [(int(n), before.lower() == "since" or after.startswith("and older"))
            for before, n, after in re.findall(
                r"(\w+)\W+(?:store\s+)?schema(?:\s+version)?\s+(\d+)\W*(\w*\s*\w*)",
                text)]


def test_the_docs_give_the_stores_schema_version_the_code_has():
    """Said once, where the store is described; elsewhere only when
    something came or went, never past the code's version."""
    from compute_agent.store.schema import SCHEMA_VERSION
    found = [(p.name, n, history) for p in current_docs()
             for n, history in schema_statements(p.read_text())]
    assert [(name, n) for name, n, history in found if not history] == [
        ("moves.md", SCHEMA_VERSION)]
    assert [(name, n) for name, n, _ in found if n > SCHEMA_VERSION] == []


def test_a_schema_version_is_read_as_the_docs_write_it():
    assert schema_statements("is at schema version 7 (since 6, a digest); "
                             "(store schema 7), a record of schema 5 and older") == [
        (7, False), (7, False), (5, True)]
    assert schema_statements("each commit (since store schema 7)") == [(7, True)]


def served_metrics() -> set[str]:
    """Every metric one agent serves, by the name Prometheus shows."""
    from compute_agent import metrics
    served = metrics.Metrics()
    served.watch_assignments(dict)
    served.watch_capacity(list)
    return {f"{family.name}_total" if family.type == "counter" else family.name
            for family in served.registry.collect()}


def test_the_metrics_table_lists_every_metric_served_and_no_other():
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.partition("\n## Metrics\n")[2].partition("\n#")[0]
    listed = set(re.findall(r"^\| `(compute_agent_\w+)`", table, re.MULTILINE))
    assert len(served_metrics()) > 10
    assert listed == served_metrics()


def console_scripts() -> set[str]:
    import configparser
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    return {line.split("=")[0].strip() for line in lines}


def test_the_readmes_commands_table_names_every_command_and_subcommand():
    """Each console script (setup.cfg) and each subcommand of manage and
    ctl has its row in README's table (a|b rows count for each)."""
    table = (ROOT / "README.md").read_text().partition("\n## Commands\n")[2]
    rows = [line.split("|")[1] for line in table.replace("\\|", "/").splitlines()
            if line.startswith("| `")]
    named = set()
    for row in rows:
        program, *rest = row.strip(" `").split()
        named.add(program)
        if rest and not rest[0].startswith("-"):
            named.update(f"{program} {sub}" for sub in rest[0].split("/"))
    expected = console_scripts() | {
        f"{program} {sub}" for program in ("compute-agent-manage", "compute-agent-ctl")
        for sub in parsers()[program].subcommands}
    assert console_scripts() == {"compute-agent", "compute-agent-manage", "compute-agent-ctl"}
    assert sorted(expected - named) == []


def test_the_readme_and_the_demo_give_the_same_next_steps_in_the_same_order(monkeypatch):
    """README's "What to try next" and what the demo prints at its end:
    the same commands, in the same order (the demo prints its Placement's
    port where README reads it from .demo/placement/port, and ends with
    itself)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo", ROOT / "tools" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(demo, "BIN", ROOT / ".venv" / "bin")
    printed = demo.closing_words(demo.WORK / "compute-agent.conf", 4321, True,
                                 demo.WORK / "instance-spec.json")
    commands = [line.strip().replace("--port 4321", '--port "$(cat .demo/placement/port)"')
                for line in printed.splitlines()
                if re.match(r"    (\.venv/bin/|tools/)", line)]
    assert commands[-1] == "tools/demo"
    section = (ROOT / "README.md").read_text().partition("\n## What to try next\n")[2]
    section = section.partition("\n## ")[0]
    # Fenced lines and code spans, in the order README has them.
    snippets = [m.group(1) or m.group(0).splitlines()[1] for m in re.finditer(
        f"{FENCE.pattern}|{CODE_SPAN.pattern}", section, re.MULTILINE | re.DOTALL)]
    in_readme = [s for s in snippets if s.startswith((".venv/bin/", "tools/"))]
    assert in_readme == commands[:-1]
