"""`peagle-tune search`."""

from __future__ import annotations

from pathlib import Path

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
    "--objective",
    type=click.Choice(["throughput", "latency", "goodput", "pareto"]),
    default="throughput",
    show_default=True,
    help="throughput: max output tokens/s; latency: min TPOT p50; goodput: max tokens/s meeting the SLOs; "
    "pareto: tokens/s vs TPOT p99 front, recommending its highest-throughput point that meets the SLOs.",
)
@click.option("--slo-tpot-p99", type=float, default=None, metavar="MS", help="SLO: TPOT p99 at most MS ms.")
@click.option("--slo-ttft-p99", type=float, default=None, metavar="MS", help="SLO: TTFT p99 at most MS ms.")
@click.option(
    "--strategy",
    default="auto",
    show_default=True,
    help="model-guided (profile once per drafter or reuse a stored profile, verify the best predicted configs, "
    "stop when the best is confirmed), blackbox (TPE/GP with pruning), random, or grid (every config in order). "
    "auto: model-guided with the vllm backend, blackbox with the model backend.",
)
@click.option("--sampler", type=click.Choice(["tpe", "gp"]), default=None, help="Blackbox sampler (default: tpe).")
@click.option(
    "--trials",
    type=int,
    default=None,
    help="Trials per concurrency, shared by all workers of the study (default: 60; grid: the whole grid).",
)
@click.option("--backend", type=click.Choice(["auto", "model", "vllm"]), default="auto", show_default=True)
@click.option("--drafter", "drafters", multiple=True, help="Drafter id or path (repeatable). Default: the catalog's.")
@click.option("--k-min", type=int, default=None, help="Smallest draft depth K to consider (default 1).")
@click.option("--max-k", type=int, default=None, help="Largest draft depth K to consider (default 8).")
@click.option(
    "--max-num-seqs", default=None, help="Comma-separated max_num_seqs choices (default: c/2, c, 2c per concurrency)."
)
@click.option(
    "--max-num-batched-tokens", default=None, help="Comma-separated max_num_batched_tokens choices (default: vLLM's)."
)
@click.option("--parallel-drafting", type=click.Choice(["auto", "on", "off"]), default=None, help="Default: auto.")
@click.option(
    "--space",
    "space_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="YAML/JSON space file (drafters, k_min, k_max, max_num_seqs, max_num_batched_tokens, parallel_drafting, "
    "include_hypothetical); options given on the command line override it.",
)
@click.option(
    "--include-hypothetical/--no-include-hypothetical",
    default=None,
    help="Model backend: also consider unreleased 2-layer variants of published heads (labelled HYPOTHETICAL).",
)
@click.option("--study", default=None, help="Study name prefix; re-running with the same name resumes it.")
@click.option(
    "--storage",
    default=None,
    help="Optuna storage URL shared by workers on several hosts, e.g. postgresql://user@host/db (default: --db).",
)
@click.option("--heartbeat", type=int, default=60, show_default=True, metavar="SECONDS",
              help="Heartbeat of running trials; a worker silent for twice this has its trial failed and re-queued.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (progress goes to stderr).")
@db_option
@errors
def search(
    model: str,
    gpu: str | None,
    workload: str,
    concurrency: str,
    objective: str,
    slo_tpot_p99: float | None,
    slo_ttft_p99: float | None,
    strategy: str,
    sampler: str | None,
    trials: int | None,
    backend: str,
    drafters: tuple[str, ...],
    k_min: int | None,
    max_k: int | None,
    max_num_seqs: str | None,
    max_num_batched_tokens: str | None,
    parallel_drafting: str | None,
    space_file: Path | None,
    include_hypothetical: bool | None,
    study: str | None,
    storage: str | None,
    heartbeat: int,
    seed: int,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Search drafter, K, parallel drafting, max_num_seqs and max_num_batched_tokens for a model and store the best
    config per concurrency.

    With no GPU and no loadable model it predicts with the model backend (roofline + published acceptance)
    and says so; with vLLM and a local model it measures real trials. Several workers (even on several hosts)
    can run the same command with the same --study and --storage to share one study.

    Example:

    \b
        peagle-tune search --model gpt-oss-120b --gpu h200 --concurrency 1,8,64
        peagle-tune search --model gpt-oss-120b --objective goodput --slo-tpot-p99 12 --json
        peagle-tune search --model gpt-oss-120b --objective pareto --strategy grid --concurrency 64
        peagle-tune search --model gpt-oss-120b --study fleet --storage postgresql://user@host/peagle
        peagle-tune search --model ./target --drafter ./drafter --strategy model-guided --concurrency 1,8
    """
    from autotune.runner import SearchOptions, run_search
    from autotune.space import space_from_options

    space = space_from_options(
        drafters=list(drafters) or None,
        k_min=k_min,
        k_max=max_k,
        max_num_seqs=int_list(max_num_seqs, "--max-num-seqs") if max_num_seqs else None,
        max_num_batched_tokens=(
            int_list(max_num_batched_tokens, "--max-num-batched-tokens") if max_num_batched_tokens else None
        ),
        parallel_drafting=parallel_drafting,
        include_hypothetical=include_hypothetical,
    )
    options = SearchOptions(
        model=model,
        gpu=gpu,
        workload=workload,
        concurrencies=int_list(concurrency, "--concurrency"),
        objective=objective,
        slo_tpot_p99_ms=slo_tpot_p99,
        slo_ttft_p99_ms=slo_ttft_p99,
        strategy=strategy,
        sampler=sampler,
        trials=trials,
        backend=backend,
        space=space,
        space_file=space_file,
        study=study,
        storage=storage,
        heartbeat=heartbeat,
        seed=seed,
    )
    store = open_store(db_url)
    run = run_search(store, options, console=err_console if as_json else console, as_json=as_json)
    if run.infeasible:
        which = ", ".join(f"c={r.scenario.concurrency} (closest: {r.best.config.label()})" for r in run.infeasible)
        raise click.ClickException(
            f"No config met the SLOs at {which}; nothing was recommended there. Relax --slo-tpot-p99/--slo-ttft-p99, "
            "widen the space, or lower the concurrency."
        )
