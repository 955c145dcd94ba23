"""`peagle-tune search`."""

from __future__ import annotations

import click

from autotune.cli._common import (
    console,
    db_option,
    err_console,
    errors,
    int_list,
    open_store,
)


@click.command()
@click.option("--model", required=True, help="Target model: catalog name (gpt-oss-120b), HF id or local path.")
@click.option("--gpu", default=None, help="GPU to predict for (h100, h200, b200, a100, l40s). Default: h200.")
@click.option(
    "--workload", default="mt-bench", show_default=True, help="Built-in workload name or a .jsonl/.json file."
)
@click.option("--concurrency", default="1,8,64", show_default=True, help="Comma-separated concurrencies to tune for.")
@click.option(
    "--objective", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True
)
@click.option("--trials", type=int, default=60, show_default=True, help="Trials per concurrency.")
@click.option("--backend", type=click.Choice(["auto", "model", "vllm"]), default="auto", show_default=True)
@click.option("--drafter", "drafters", multiple=True, help="Drafter id or path (repeatable). Default: the catalog's.")
@click.option("--max-k", type=int, default=8, show_default=True, help="Largest draft depth K to consider.")
@click.option(
    "--max-num-seqs", default=None, help="Comma-separated max_num_seqs choices (default: around each concurrency)."
)
@click.option("--parallel-drafting", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True)
@click.option("--study", default=None, help="Study name prefix; re-running with the same name resumes it.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@db_option
@errors
def search(
    model: str,
    gpu: str | None,
    workload: str,
    concurrency: str,
    objective: str,
    trials: int,
    backend: str,
    drafters: tuple[str, ...],
    max_k: int,
    max_num_seqs: str | None,
    parallel_drafting: str,
    study: str | None,
    seed: int,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Search drafter, K, parallel drafting and max_num_seqs for a model and store the best config.

    With no GPU and no loadable model it predicts with the model backend (roofline + published acceptance)
    and says so; with vLLM and a local model it measures real trials.

    Example:

        peagle-tune search --model gpt-oss-120b --gpu h200 --concurrency 1,8,64
    """
    from autotune.runner import SearchOptions, run_search

    options = SearchOptions(
        model=model,
        gpu=gpu,
        workload=workload,
        concurrencies=int_list(concurrency, "--concurrency"),
        objective=objective,
        trials=trials,
        backend=backend,
        drafters=list(drafters),
        max_k=max_k,
        max_num_seqs=int_list(max_num_seqs, "--max-num-seqs") if max_num_seqs else None,
        parallel_drafting=parallel_drafting,
        study=study,
        seed=seed,
    )
    store = open_store(db_url)
    run_search(store, options, console=err_console if as_json else console, as_json=as_json)
