"""Help a newcomer can follow (issue 13.6, 13.7): every example in every command's --help pastes as shown (one
command per line, no continuation backslash, options the command takes), help wraps to the terminal, one exit code
for "not found", and no object reprs in messages."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from ux_cli import command_tree

from autotune.cli import main


def commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    return command_tree(main)


def help_text(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def examples(text: str) -> list[str]:
    """The example lines of a help text: lines that start with `peagle-tune ` (after indentation)."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith("peagle-tune ")]


def parses(line: str) -> None:
    """Parse an example the way the shell and click would, without running it (a `--help`-free dry parse)."""
    command = line.split("  #", 1)[0].split(" && ", 1)[0]
    argv = shlex.split(command)[1:]
    ctx = main.make_context("peagle-tune", list(argv), resilient_parsing=False)
    with ctx:
        rest = [*ctx._protected_args, *ctx.args]
        cmd_ctx = ctx
        cmd: click.Command = main
        while isinstance(cmd, click.Group) and rest:
            name, sub, rest = cmd.resolve_command(cmd_ctx, rest)
            assert sub is not None and name is not None, line
            cmd_ctx = sub.make_context(name, list(rest), parent=cmd_ctx)
            cmd = sub
            rest = [*getattr(cmd_ctx, "_protected_args", []), *cmd_ctx.args] if isinstance(sub, click.Group) else []


@pytest.mark.parametrize("path", [p for p, _ in commands()], ids=lambda p: " ".join(p) or "peagle-tune")
def test_every_example_pastes_as_shown(path: tuple[str, ...]) -> None:
    text = help_text(path)
    found = examples(text)
    assert found, f"`peagle-tune {' '.join(path)} --help` has no example"
    for line in found:
        assert not line.rstrip().endswith("\\"), line  # one command per line, no continuation
        parses(line)


def help_at(columns: int, *path: str) -> str:
    """`--help` in a terminal `columns` wide (a subprocess: CliRunner pins click's help to 80 columns)."""
    env = {**os.environ, "COLUMNS": str(columns)}
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", *path, "--help"], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    return proc.stdout


@pytest.mark.parametrize("path", [p for p, _ in commands()], ids=lambda p: " ".join(p) or "peagle-tune")
@pytest.mark.slow
def test_examples_stay_whole_in_a_narrow_terminal(path: tuple[str, ...]) -> None:
    # In a 60-column terminal click rewraps paragraphs; examples are verbatim blocks, so each stays one line (the
    # terminal wraps it visually, and it still pastes as one command).
    assert examples(help_at(60, *path)) == examples(help_text(path))


@pytest.mark.slow
def test_help_wraps_to_the_terminal_width() -> None:
    wide = help_at(120, "search")
    prose = [line for line in wide.splitlines() if not line.strip().startswith("peagle-tune ")]
    assert 100 < max(len(line) for line in prose) <= 120
    narrow = help_at(70, "search")
    prose = [line for line in narrow.splitlines() if not line.strip().startswith("peagle-tune ")]
    assert max(len(line) for line in prose) <= 70


def test_exit_codes_are_documented_and_not_found_is_3(tmp_path: Path) -> None:
    assert "3 not found" in help_text(())
    db = str(tmp_path / "empty.db")
    for args in (["export"], ["export", "--recommendation", "7"], ["show", "--trials", "nope"],
                 ["serve", "--model", "gpt-oss-120b", "--recommendation", "7", "--dry-run"]):
        result = CliRunner().invoke(main, [*args, "--db", db])
        assert result.exit_code == 3, (args, result.output)


def test_messages_hold_no_object_reprs(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--concurrency", "1", "--max-k", "2",
                                       "--trials", "5", "--db", db])
    assert result.exit_code == 0, result.output
    assert not re.search(r"<[A-Za-z_.]+ [^>]*>", result.output), result.output
    assert f"sqlite:///{Path(db).resolve()}" in result.output
