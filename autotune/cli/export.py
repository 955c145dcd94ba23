"""`peagle-tune export`: one stored recommendation in a form vLLM takes, saying on stderr which one it is."""

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
from autotune.cli._common import (
    say as say_prose,
)
from autotune.cli._select import choose, search_words, selection_options
from autotune.selection import Criteria


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
@selection_options
@click.option("--model", default=None, help="Only recommendations for this model.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--force", is_flag=True,
    help="Replace --out if it exists (atomically: the old file stays whole until the new one is complete; a "
    "symbolic link is replaced, never followed).",
)
@db_option
@errors
def export(
    fmt: str,
    rec_id: int | None,
    concurrency: int | None,
    gpu: str | None,
    workload: str | None,
    objective: str | None,
    model: str | None,
    out_path: Path | None,
    force: bool,
    db_url: str | None,
) -> None:
    """Export a recommendation in a form vLLM takes.

    Selects by --model, --gpu, --workload, --objective and --concurrency (as `serve` and `show` do). When several
    stored recommendations match and differ in config it lists them and exits 2 naming the option to add; it never
    picks one silently. --format schedule without --concurrency takes a search's highest concurrency, whose
    schedule (K per batch size) covers every load searched. Says on stderr which recommendation it exports (id,
    model, GPU, concurrency, config and figures; the YAML forms also start with it as a comment).

    \b
    Example:
      peagle-tune export --concurrency 64 --format vllm-json
      peagle-tune export --concurrency 8 --format vllm-args
      peagle-tune export --format schedule
      peagle-tune export --concurrency 64 --format yaml --out serve.yaml
      peagle-tune export --concurrency 64 --format policy --out policy.yaml

    Then serve the YAML with `vllm serve --config serve.yaml`, or the policy with `peagle-tune serve --policy`.
    """
    from autotune.export import clean_formats, describe, render

    criteria = Criteria(model=canonical_model(model) if model else None, gpu=gpu, workload=workload,
                        objective=objective, concurrency=concurrency)
    with open_store(db_url, existing=True) as store:
        choice = choose(store, criteria, rec_id, "search" if fmt == "schedule" and concurrency is None else "one")
    rec = choice.rec
    record = rec.to_dict()
    text, warnings = render(fmt, record, as_json=out_path is not None and out_path.suffix.lower() == ".json")

    def say(line: str, style: str | None = None) -> None:
        say_prose(err_console, line, style)

    first, *rest = describe(record)
    say(f"Exporting {fmt} of {first}")
    for line in rest:  # the config and its figures; where they were measured, when recorded
        say(f"  {line}")
    others = [e for e in choice.search if e.id != rec.id]
    if fmt == "schedule" and rec_id is None and concurrency is None and others:
        say(f"  The highest concurrency of its search ({search_words(choice)}): its schedule covers every load "
            "searched.")
    elif others and rec_id is not None:
        listed = ", ".join(f"c={e.concurrency} (#{e.id})" for e in others)
        say(f"  The same search also stored {listed}: pass --concurrency C for another"
            + (", or --format schedule for one config whose K follows the batch size."
               if fmt != "schedule" and "schedule" in clean_formats(record) else "."))
    if choice.same_config:
        say(f"  The same config is also stored as {', '.join(f'#{e.id}' for e in choice.same_config)}.")
    seqs, level = choice.entry.max_num_seqs, choice.entry.concurrency
    if seqs is not None and level is not None and seqs < level:
        say(f"warning: max_num_seqs {seqs} is below the concurrency {level} it was tuned for: requests queue (how "
            f"the {choice.entry.objective} objective met its target).", "yellow")
    for w in warnings:
        say(f"warning: {w}", "yellow")
    if out_path is None:
        click.echo(text, nl=False)
        return
    from autotune.safe_io import write_file

    write_file(out_path, text, force=force)
    say(f"Wrote {fmt} for recommendation #{rec.id} to {out_path}")
