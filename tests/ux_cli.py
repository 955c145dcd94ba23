"""What the CLI tests share: `peagle-tune` run in-process, and its output drawn at 80 columns.

CliRunner's output is not a terminal: `cli` gets what a pipe gets. A test module takes the helpers with
``from ux_cli import cli, columns_80  # noqa: F401`` (tests/ is on sys.path); importing `columns_80` makes every test
of that module run at COLUMNS=80.
"""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner, Result

from autotune.cli import main


@pytest.fixture(autouse=True)
def columns_80(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables drawn for an 80-column reader, whatever the terminal running the tests."""
    monkeypatch.setenv("COLUMNS", "80")


def cli(*args: str) -> Result:
    """`peagle-tune ARGS...` in this process; its exit code, stdout and stderr in the result."""
    return CliRunner().invoke(main, list(args))


def command_tree(
    group: click.Group = main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command under `group` with its path (the group first), through click's public lookup: the top group
    loads its commands on first use, so its ``commands`` dict is empty."""
    yield path, group
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        if isinstance(cmd, click.Group):
            yield from command_tree(cmd, (*path, name))
        else:
            yield (*path, name), cmd
