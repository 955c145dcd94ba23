"""docs/quickstart.md is the README's path as `scripts/quickstart.py` ran it: the same commands in the same order,
each one a command click accepts, the README's quick-start commands among them, tables within 80 columns. (The
script's `--check` re-runs everything and diffs; it takes a minute, so it is left to whoever changes the output.)"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
from _scripts import load_script  # tests/ is on sys.path (pytest prepend import mode)
from test_ux_help import parses  # tests/ is on sys.path (pytest prepend import mode)

ROOT = Path(__file__).resolve().parent.parent


def script() -> ModuleType:
    return load_script("scripts/quickstart.py")


def doc_commands() -> list[str]:
    return [line[2:] for line in (ROOT / "docs" / "quickstart.md").read_text().splitlines() if line.startswith("$ ")]


def test_the_doc_is_the_scripts_transcript() -> None:
    assert doc_commands() == [command for _, _, command in script().STEPS]


def test_every_command_in_the_doc_parses() -> None:
    for command in doc_commands():
        for part in command.split(" && "):
            part = part.split(" | ")[0]
            if part.startswith("peagle-tune "):
                parses(part)


def test_the_readme_quick_start_is_in_the_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Quick start")
    quick = readme[start:readme.index("\n## ", start)]
    wanted = {re.sub(r"\s+#.*$", "", m).strip() for m in re.findall(r"\.venv/bin/(peagle-tune [^\n]+)", quick)}
    shown = {c.split(" && ")[0].split(" | ")[0] for c in doc_commands()}
    for command in wanted:
        verb = command.split()[1]
        assert any(c.split()[1] == verb for c in shown), command
    assert {"search", "show", "export", "report", "serve"} <= {c.split()[1] for c in shown}


def test_tables_in_the_doc_fit_80_columns() -> None:
    text = (ROOT / "docs" / "quickstart.md").read_text()
    blocks = re.findall(r"```console\n(.*?)```", text, flags=re.S)
    for block in blocks:
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("─"):  # a table's header rule: the header, the rule and the rows fit
                assert len(line) <= 80 and len(lines[i - 1]) <= 80, lines[i - 1]
    assert "…" not in text


#: The quick start's first steps (search, show, the first export): what most of the page shows, in ~20 s. The whole
#: `scripts/quickstart.py --check` (report and serve too) takes minutes on a shared machine.
CHEAP_STEPS = 3


@pytest.mark.slow
def test_the_doc_is_what_its_first_commands_print_now(tmp_path: Path) -> None:
    """docs/quickstart.md is stale when the commands print something else: regenerate it with
    `.venv/bin/python scripts/quickstart.py` (this test reruns its first steps the way the script does)."""
    module = script()
    text = (ROOT / "docs" / "quickstart.md").read_text()
    shown = re.findall(r"```console\n\$ (.*?)\n(.*?)\n```", text, flags=re.S)
    home = tmp_path / "home"
    home.mkdir()
    for (command, output), (_, _, step) in zip(shown[:CHEAP_STEPS], module.STEPS, strict=False):
        assert command == step
        assert module.run(command, home).rstrip("\n") == output, (
            f"docs/quickstart.md is stale at `{command}`: run `.venv/bin/python scripts/quickstart.py`")
