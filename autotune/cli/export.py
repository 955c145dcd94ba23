"""`peagle-tune export`: one stored recommendation in a form vLLM takes, saying on stderr which one it is."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from autotune.cli._common import (
    canonical_model,
    db_option,
    err_console,
    errors,
    open_store,
    write_output,
)
from autotune.errors import NotFoundError


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
@click.option("--recommendation", "rec_id", type=int, default=None,
              help="Recommendation id (`peagle-tune show` lists them). Default: the newest.")
@click.option("--concurrency", type=int, default=None, metavar="C",
              help="The newest recommendation tuned for concurrency C (of --model, if given).")
@click.option("--model", default=None, help="Newest recommendation for this model.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--force", is_flag=True,
    help="Replace --out if it exists (atomically: the old file stays whole until the new one is complete).",
)
@db_option
@errors
def export(
    fmt: str,
    rec_id: int | None,
    concurrency: int | None,
    model: str | None,
    out_path: Path | None,
    force: bool,
    db_url: str | None,
) -> None:
    """Export a recommendation in a form vLLM takes.

    Says on stderr which recommendation it exports (id, model, GPU, concurrency, config and figures; the YAML
    forms also start with it as a comment). After a search over several concurrencies the newest is the last
    concurrency searched: pick another with --concurrency, or export --format schedule, one config whose K follows
    the batch size (from the highest concurrency's recommendation).

    \b
    Example:
      peagle-tune export --format vllm-json
      peagle-tune export --concurrency 8 --format vllm-args
      peagle-tune export --format schedule
      peagle-tune export --format yaml --out serve.yaml
      peagle-tune export --format policy --out policy.yaml

    Then serve the YAML with `vllm serve --config serve.yaml`, or the policy with `peagle-tune serve --policy`.
    """
    from autotune.export import describe, render

    with open_store(db_url) as store:
        rec, siblings = _choose(store, rec_id, concurrency, canonical_model(model) if model else None, fmt)
    record = rec.to_dict()
    text, warnings = render(fmt, record, as_json=out_path is not None and out_path.suffix.lower() == ".json")

    def say(line: str, style: str | None = None) -> None:
        err_console.print(line, style=style, highlight=False, markup=False, soft_wrap=not err_console.is_terminal)

    first, second = describe(record)
    say(f"Exporting {fmt} of {first}")
    say(f"  {second}")
    others = [r for r in siblings if r.id != rec.id]
    if others and rec_id is None and concurrency is None:
        listed = ", ".join(f"c={_concurrency(r)} (#{r.id})" for r in sorted(others, key=_concurrency))
        say(f"  The same search also stored {listed}: pass --concurrency C for another"
            + (", or --format schedule for one config whose K follows the batch size." if fmt != "schedule" else "."))
    for w in warnings:
        say(f"warning: {w}", "yellow")
    if out_path is None:
        click.echo(text, nl=False)
        return
    write_output(out_path, text, force=force)
    say(f"Wrote {fmt} for recommendation #{rec.id} to {out_path}")


def _concurrency(rec: Any) -> int:
    value = (rec.scenario or {}).get("concurrency")
    return int(value) if isinstance(value, int) else 0


def _search_key(rec: Any) -> tuple[Any, ...]:
    """What makes recommendations one search's: model, GPU, workload, objective and the study name without its
    concurrency (and without the space fingerprint, which changes with the concurrency's max_num_seqs)."""
    prefix = re.sub(r"(-[0-9a-f]{6})?-c\d+$", "", rec.study or "")
    return (rec.model, rec.gpu, rec.workload_hash, rec.objective, prefix)


def _choose(store: Any, rec_id: int | None, concurrency: int | None, model: str | None, fmt: str) -> tuple[Any, list]:
    """The recommendation to export and the newest of each concurrency of the same search.

    --recommendation wins; else the newest (for --model) at --concurrency; else the newest, except that a schedule
    comes from the highest concurrency of the newest search (its schedule covers the most batch sizes)."""
    if rec_id is not None:
        rec = store.get_recommendation(rec_id)
        return rec, _same_search(store, rec)
    candidates = store.list_recommendations(model=model)
    if concurrency is not None:
        candidates = [r for r in candidates if _concurrency(r) == concurrency]
    if not candidates:
        what = " for model " + repr(model) if model else ""
        what += f" at concurrency {concurrency}" if concurrency is not None else ""
        hint = ("`peagle-tune show` lists what is stored." if concurrency is not None else
                "Run `peagle-tune search --model MODEL` first.")
        raise NotFoundError(f"There is no recommendation{what} to export. {hint}")
    rec = candidates[0]
    siblings = _same_search(store, rec)
    if fmt == "schedule" and concurrency is None and siblings:
        rec = max(siblings, key=lambda r: (_concurrency(r), r.id))
    return rec, siblings


def _same_search(store: Any, rec: Any) -> list[Any]:
    """The newest recommendation of each concurrency of `rec`'s search (`rec` itself included)."""
    newest: dict[int, Any] = {}
    for r in store.list_recommendations(model=rec.model):
        if _search_key(r) == _search_key(rec):
            newest.setdefault(_concurrency(r), r)
    return list(newest.values())
