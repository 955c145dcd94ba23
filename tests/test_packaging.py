"""The distribution: top-level packages, console script, lazy engine imports."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from ux_cli import command_tree

from autotune.cli import main


@pytest.mark.parametrize("package", ["autotune", "policies", "store"])
def test_top_level_packages_belong_to_peagle_tune_alone(package: str) -> None:
    # The card asks for three top-level import names; no other installed distribution may provide them.
    # A set: an editable install seen twice (site-packages and an egg-info beside the sources) is still ours alone.
    assert set(importlib.metadata.packages_distributions()[package]) == {"peagle-tune"}


def test_console_script_points_at_the_cli() -> None:
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts["peagle-tune"] == "autotune.cli:main"


def test_cli_store_model_backend_and_controller_do_not_import_vllm_or_torch() -> None:
    # `peagle-tune --help`, the store, the model backend and the controller core must work without an engine.
    code = (
        "import sys\n"
        "from autotune.cli import main\n"
        "import autotune.backends.model, autotune.backends.vllm, autotune.search, store, policies\n"
        "bad = [m for m in ('vllm', 'torch', 'transformers') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _commands(group: click.Group) -> list[tuple[str, click.Command]]:
    return [(" ".join(path), cmd) for path, cmd in command_tree(group) if path]


@pytest.mark.parametrize("name,command", _commands(main), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_has_help_with_an_example(name: str, command: click.Command) -> None:
    result = CliRunner().invoke(main, [*name.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Example:" in (command.help or ""), f"`peagle-tune {name}` needs an Example: block in its docstring"


def test_python_dash_m_smoke() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert "peagle-tune" in out.stdout
