"""`peagle-tune export`."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli._common import (
    canonical_model,
    db_option,
    err_console,
    errors,
    open_store,
)
from autotune.errors import UsageError


@click.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["vllm-json", "vllm-args", "yaml", "schedule", "policy"]),
    default="vllm-json",
    show_default=True,
    help="vllm-json: --speculative-config; vllm-args: a `vllm serve` line; yaml: `vllm serve --config` file; "
    "schedule: speculative config with num_speculative_tokens_per_batch_size; policy: the runtime policy file "
    "(YAML, or JSON when --out ends in .json).",
)
@click.option("--recommendation", "rec_id", type=int, default=None, help="Recommendation id (default: the newest).")
@click.option("--model", default=None, help="Newest recommendation for this model.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@db_option
@errors
def export(
    fmt: str, rec_id: int | None, model: str | None, out_path: Path | None, force: bool, db_url: str | None
) -> None:
    """Export a recommendation in a form vLLM takes.

    Example:

        peagle-tune export --format vllm-json

        peagle-tune export --format yaml --out serve.yaml   # then: vllm serve --config serve.yaml

        peagle-tune export --format policy --out policy.yaml
    """
    from autotune.export import render

    store = open_store(db_url)
    if rec_id is not None:
        rec = store.get_recommendation(rec_id)
    else:
        rec = store.latest_recommendation(model=canonical_model(model) if model else None)
        if rec is None:
            raise UsageError(
                "There is no recommendation to export"
                + (f" for model {model!r}" if model else "")
                + ". Run `peagle-tune search --model MODEL` first."
            )
    text, warnings = render(fmt, rec.to_dict(), as_json=out_path is not None and out_path.suffix.lower() == ".json")
    for w in warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}")
    if out_path is None:
        click.echo(text, nl=False)
        return
    if out_path.exists() and not force:
        raise UsageError(f"{out_path} exists; pass --force to overwrite it.")
    out_path.write_text(text)
    err_console.print(f"Wrote {fmt} for recommendation #{rec.id} to {out_path}")
