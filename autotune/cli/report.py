"""`peagle-tune report`."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli._common import canonical_model, console, db_option, errors, open_store


@click.command()
@click.option("--model", default=None, help="Only this model (catalog name, HF id or local path). Default: all.")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for index.html and the PNG figures (created if missing).",
)
@click.option("--force", is_flag=True, help="Replace an existing index.html and figures in --out (each atomically; a "
              "symbolic link is replaced, never followed).")
@db_option
@errors
def report(model: str | None, out_dir: Path, force: bool, db_url: str | None) -> None:
    """Write PNG plots and an HTML page explaining the stored tuning results.

    The page starts with the recommended config per scenario (the --speculative-config JSON to paste and the
    speedups), then acceptance per draft position, AL(K), the step-cost surface T(B, K), predicted tokens/s
    against K per batch size, and the trials of each search. Every figure says whether it is measured or
    predicted.

    \b
    Example:
      peagle-tune search --model gpt-oss-120b --gpu h200
      peagle-tune report --out report/ && xdg-open report/index.html
    """
    from autotune.report import write_report

    store = open_store(db_url, existing=True)
    try:
        with console.status("Drawing the report figures..."):
            index = write_report(store, out_dir, canonical_model(model) if model else None, force=force)
    finally:
        store.close()
    console.print(f"Wrote {index} (open it in a browser; PNG figures are beside it).")
