"""`peagle-tune search`: options in, notes and a progress bar per concurrency on the console, then the results as
tables (or JSON on stdout with --json; everything else goes to stderr)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from autotune.cli._common import (
    console,
    db_option,
    err_console,
    errors,
    int_list,
    open_store,
)

if TYPE_CHECKING:
    from rich.console import Console

    from autotune.search import ScenarioResult, Search, SearchEvent, SearchRun
    from autotune.spec import Scenario


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
    "stop when the best is confirmed), blackbox (TPE/GP), random, or grid (every config in order). "
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
    from autotune.search import SearchOptions, plan_search, space_from_options

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
    out = err_console if as_json else console
    plan = plan_search(store, options)
    for note in plan.notes:
        out.print(f"[bold]{note}[/bold]", highlight=False)
    run = plan.run(lambda search, scenario: _with_progress(search, scenario, out))
    if as_json:
        sys.stdout.write(json.dumps(run_dict(run), indent=2, default=str) + "\n")
        sys.stdout.flush()
    else:
        print_results(run, console, store)
    if run.infeasible:
        which = ", ".join(f"c={r.scenario.concurrency} (closest: {r.best.config.label()})" for r in run.infeasible)
        raise click.ClickException(
            f"No config met the SLOs at {which}; nothing was recommended there. Relax --slo-tpot-p99/--slo-ttft-p99, "
            "widen the space, or lower the concurrency."
        )


def _with_progress(search: Search, scenario: Scenario, console: Console) -> ScenarioResult:
    """Run one scenario's search under a progress bar (complete/failed/pruned counts of every worker)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"c={scenario.concurrency}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("", total=search.target)

        def on_event(e: SearchEvent) -> None:
            if e.kind == "start" and e.done:
                console.print(
                    f"Resuming study {e.study}: {e.done} of {e.target} trials already finished"
                    + (f", {e.running} running on other workers." if e.running else "."),
                    highlight=False,
                )
            progress.update(task, completed=min(e.done, e.target), total=e.target, description=_states(e))

        return search.run_scenario(scenario, on_event)


def _states(e: SearchEvent) -> str:
    parts = [f"complete {e.complete}", f"failed {e.failed}", f"pruned {e.pruned}"]
    if e.running:
        parts.append(f"running elsewhere {e.running}")
    return ", ".join(parts)


def print_results(run: SearchRun, console: Console, store: Any) -> None:
    """The results table, each scenario's rule and provenance, Pareto fronts, and where the recommendations went."""
    from autotune.cli._tables import pareto_table, results_table

    console.print(results_table(run))
    for r in run.results:
        console.print(f"  c={r.scenario.concurrency}: rule: {r.rule}.", highlight=False)
        console.print(f"  c={r.scenario.concurrency}: {r.best.provenance.describe()}; study {r.study_name}"
                      + (f" ({r.n_running} trials still running on other workers)" if r.n_running else ""),
                      highlight=False)
        if r.hypothetical:
            console.print(f"  [yellow]c={r.scenario.concurrency}: {r.hypothetical}[/yellow]", highlight=False)
        report = r.strategy_report
        if report.get("profiles"):
            error = report.get("prediction_error")
            console.print(
                f"  c={r.scenario.concurrency}: model-guided: predicted from {', '.join(report['profiles'].values())}; "
                f"predicted best {report.get('predicted_best')}; {report.get('stop_reason')}"
                + (f"; calibrated prediction error {error:.1%}" if error is not None else ""),
                highlight=False,
            )
    for r in run.results:
        if r.pareto:
            console.print(pareto_table(r))
    ids = ", ".join(f"#{r.recommendation_id}" for r in run.results if r.recommendation_id is not None)
    if ids:
        console.print(
            f"Stored recommendation {ids} in {store!r}. Export the newest with "
            "`peagle-tune export --format vllm-json` (or --recommendation ID).",
            highlight=False,
        )


def result_dict(r: ScenarioResult, launches_engines: bool) -> dict[str, Any]:
    """A scenario's result as JSON; ``engine_launches`` counts profiling and trial launches (0 with a backend that
    predicts)."""
    from autotune.search import measurement_metrics

    return {
        "concurrency": r.scenario.concurrency,
        "study": r.study_name,
        "recommendation_id": r.recommendation_id,
        "feasible": r.feasible,
        "rule": r.rule,
        "best_config": r.best.config.to_dict(),
        "speculative_config": r.best.config.speculative_config() if r.feasible else None,
        "hypothetical": r.hypothetical,
        "metrics": measurement_metrics(r.best),
        "constraints": r.constraints,
        "output_tokens_per_s": r.best.output_tokens_per_s,
        "tpot_ms_p50": r.best.tpot_ms_p50,
        "speedup_vs_no_spec": r.speedup_over(r.baseline),
        "speedup_vs_published_k": r.speedup_over(r.published),
        "published_k": r.published.config.k if r.published else None,
        "pareto": [p.to_dict() for p in r.pareto],
        "schedule": [dataclasses.asdict(e) for e in r.schedule],
        "class_policy": r.class_policy,
        "provenance": r.best.provenance.to_dict(),
        "trials": {
            "finished": r.n_trials,
            "complete": r.n_complete,
            "failed": r.n_failed,
            "pruned": r.n_pruned,
            "running_elsewhere": r.n_running,
            "measurements_by_this_worker": r.n_measurements,
        },
        "engine_launches": {
            "profiling": r.profile_launches if launches_engines else 0,
            "trials": r.n_measurements if launches_engines else 0,
            "total": r.engine_launches if launches_engines else 0,
        },
        "strategy_report": r.strategy_report,
    }


def run_dict(run: SearchRun) -> dict[str, Any]:
    """The whole run as JSON (what ``--json`` prints)."""
    return {
        "model": run.model,
        "workload": run.workload,
        "device": run.device,
        "backend": run.backend,
        "objective": run.objective.to_dict(),
        "strategy": run.strategy,
        "notes": run.notes,
        "engine_launches": sum(r.engine_launches for r in run.results) if run.launches_engines else 0,
        "scenarios": [result_dict(r, run.launches_engines) for r in run.results],
    }
