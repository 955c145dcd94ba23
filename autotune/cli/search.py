"""`peagle-tune search`: options in, notes and a progress bar per concurrency on the console, then the results as
tables (or JSON on stdout with --json; everything else goes to stderr)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from autotune.cli._bounds import name_callback, number, numbers
from autotune.cli._common import (
    catalog_option,
    console,
    db_option,
    echo,
    err_console,
    errors,
    open_store,
    say,
    wide_console,
)
from autotune.safe_text import shell_word

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from autotune.search import ScenarioResult, Search, SearchEvent, SearchRun
    from autotune.spec import Scenario


@click.command()
@click.option("--model", required=True, callback=name_callback("--model"),
              help="Target model: catalog name (gpt-oss-120b), HF id or local path.")
@click.option("--gpu", default=None, callback=name_callback("--gpu"),
              help="GPU to predict for: h100, h100-pcie, h200, b200, a100, a100-40gb, l40s, or the name nvidia-smi "
              "prints (\"NVIDIA H100 PCIe\"). Default: h200.")
@click.option(
    "--workload", default=None, callback=name_callback("--workload"),
    help="hf:mt-bench, hf:humaneval or hf:gsm8k (the dataset vllm bench serve reads, from the Hugging Face cache; "
    "add ,prompts=N,output-len=M), spec-bench:FILE or speed-bench:DIR (categories as classes), a sample "
    "(sample-chat, sample-code, sample-math, sample-mixed: 12 prompts a class) or a .jsonl/.json file. Default: "
    "hf:mt-bench where vLLM measures; the model backend predicts for sample-chat's lengths unless hf:mt-bench is "
    "cached. See docs/workloads.md.",
)
@click.option("--concurrency", type=numbers("--concurrency"), default="1,8,64", show_default=True,
              help="Comma-separated concurrencies to tune for.")
@click.option(
    "--objective",
    type=click.Choice(["throughput", "latency", "goodput", "pareto"]),
    default="throughput",
    show_default=True,
    help="throughput: max output tokens/s; latency: min TPOT p50; goodput: max tokens/s meeting the SLOs; "
    "pareto: tokens/s vs TPOT p99 front, recommending its highest-throughput point that meets the SLOs.",
)
@click.option("--slo-tpot-p99", type=number("--slo-tpot-p99"), default=None, metavar="MS",
              help="SLO: TPOT p99 at most MS ms.")
@click.option("--slo-ttft-p99", type=number("--slo-ttft-p99"), default=None, metavar="MS",
              help="SLO: TTFT p99 at most MS ms.")
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
    type=number("--trials"),
    default=None,
    help="Trials per concurrency, shared by all workers of the study (default: 60; grid: the whole grid).",
)
@click.option("--backend", type=click.Choice(["auto", "model", "vllm"]), default="auto", show_default=True)
@click.option("--drafter", "drafters", multiple=True, callback=name_callback("--drafter"),
              help="Drafter id or path (repeatable). Default: the catalog's.")
@click.option("--k-min", type=number("--k-min"), default=None, help="Smallest draft depth K to consider (default 1).")
@click.option("--max-k", type=number("--max-k"), default=None, help="Largest draft depth K to consider (default 8).")
@click.option(
    "--max-num-seqs", type=numbers("--max-num-seqs"), default=None,
    help="Comma-separated max_num_seqs choices (default: c/2, c, 2c per concurrency)."
)
@click.option(
    "--max-num-batched-tokens", type=numbers("--max-num-batched-tokens"), default=None,
    help="Comma-separated max_num_batched_tokens choices (default: vLLM's)."
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
    help="Optuna storage URL (or SQLite file path) shared by workers on several hosts, e.g. "
    "postgresql://user@host/db (default: --db).",
)
@click.option("--heartbeat", type=number("--heartbeat"), default=60, show_default=True, metavar="SECONDS",
              help="Heartbeat of running trials; a worker silent for twice this has its trial failed and re-queued.")
@click.option("--seed", type=number("--seed"), default=0, show_default=True)
@click.option("--tensor-parallel-size", "tensor_parallel_size", type=number("--tensor-parallel-size"), default=1,
              show_default=True, help="GPUs to split the target over (vLLM's --tensor-parallel-size); kept in every "
              "config, so exports carry it.")
@click.option("--gpus", default=None, metavar="IDS",
              help="GPU ids to search on (0,1,2 or 0-7; default: every GPU NVML finds): one worker per "
              "--tensor-parallel-size of them, running launches in parallel. With no GPU here, the box --plan shows.")
@click.option("--plan", "plan_only", is_flag=True,
              help="Print what the run will do (checkpoints and downloads, launches and the GPUs that run them, "
              "estimated time and GPU-hours) and exit without launching anything.")
@click.option("--no-download", is_flag=True,
              help="Never download a checkpoint from the Hugging Face hub: refuse (--backend vllm) or predict instead.")
@catalog_option
@click.option("--fresh-launches", is_flag=True,
              help="vllm backend: launch an engine per config instead of one per drafter that measures every K.")
@click.option("--wide", is_flag=True, help="Wider tables: full drafter ids, p99s, trial counts, engine launches.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result as JSON on stdout (notes on stderr; no progress display).")
@db_option
@errors
def search(
    model: str,
    gpu: str | None,
    workload: str | None,
    concurrency: list[int],
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
    max_num_seqs: list[int] | None,
    max_num_batched_tokens: list[int] | None,
    parallel_drafting: str | None,
    space_file: Path | None,
    include_hypothetical: bool | None,
    study: str | None,
    storage: str | None,
    heartbeat: int,
    seed: int,
    tensor_parallel_size: int,
    gpus: str | None,
    plan_only: bool,
    no_download: bool,
    fresh_launches: bool,
    wide: bool,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Search drafter, K, parallel drafting, max_num_seqs and max_num_batched_tokens for a model and store the best
    config per concurrency.

    With no GPU and no loadable model it predicts with the model backend (roofline + published acceptance)
    and says so; with vLLM and a local model it measures real trials. It prints the best config per concurrency
    and each drafter's best (P-EAGLE vs EAGLE-3, 2 vs 4 layers). Several workers (even on several hosts) can run
    the same command with the same --study and --storage to share one study; re-running a finished search
    reports what it stored before.

    \b
    Example:
      peagle-tune search --model gpt-oss-120b --gpu h200 --concurrency 1,8,64
      peagle-tune search --model gpt-oss-120b --gpu "NVIDIA H100 PCIe" --concurrency 8
      peagle-tune search --model gpt-oss-120b --objective goodput --slo-tpot-p99 12 --json
      peagle-tune search --model gpt-oss-120b --objective pareto --strategy grid --concurrency 64
      peagle-tune search --model gpt-oss-120b --study fleet --storage postgresql://user@host/peagle
      peagle-tune search --model gpt-oss-120b --gpu h100 --gpus 0-7 --tensor-parallel-size 2 --plan
      peagle-tune search --model ./target --drafter ./drafter --strategy model-guided --concurrency 1,8
    """
    from autotune.search import SearchOptions, plan_search, space_from_options
    from autotune.search.plan import parse_gpus

    space = space_from_options(
        drafters=list(drafters) or None,
        k_min=k_min,
        k_max=max_k,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        parallel_drafting=parallel_drafting,
        include_hypothetical=include_hypothetical,
    )
    options = SearchOptions(
        model=model,
        gpu=gpu,
        workload=workload,
        concurrencies=concurrency,
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
        fresh_launches=fresh_launches,
        tensor_parallel_size=tensor_parallel_size,
        no_download=no_download,
        gpus=parse_gpus(gpus) if gpus is not None else None,
    )
    store = open_store(db_url, writes=not plan_only)
    out = err_console if as_json else console
    plan = plan_search(store, options)
    if plan_only:
        _print_plan(plan, as_json)
        return
    for note in plan.notes:
        say(out, note, style="bold")
    if plan.run_plan is not None and plan.backend.capabilities.launches_engines:
        for line in plan.run_plan.lines():
            say(out, line)
    run = plan.run(lambda search, scenario: _with_progress(search, scenario, out, live=not as_json))
    if as_json:
        sys.stdout.write(json.dumps(run_dict(run), indent=2, default=str) + "\n")
        sys.stdout.flush()
    else:
        print_results(run, wide_console() if wide else console, store, wide=wide)
    if run.run_plan is not None and run.launches_engines and run.wall_s is not None:
        say(out, f"Time: took {_minutes(run.wall_s)}, planned ~{_minutes(run.run_plan.wall_s)} (estimate).")
    warning = infeasible_warning(run)
    if warning is None:
        return
    if len(run.infeasible) == len(run.results):  # nothing stored: the search failed
        raise click.ClickException(warning)
    echo(f"Warning: {warning}", err=True)  # the other concurrencies' recommendations were stored: exit 0


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _print_plan(plan: Any, as_json: bool) -> None:
    """`search --plan`: the notes and the plan of a measured run (`autotune.search.plan.RunPlan`); nothing runs."""
    run_plan = plan.run_plan
    if as_json:
        doc = {"model": plan.model, "workload": plan.workload.name, "backend": plan.backend.name,
               "notes": plan.notes, "plan": run_plan.to_dict() if run_plan is not None else None}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    for note in plan.notes:
        say(console, note, style="bold")
    if run_plan is None:
        say(console, "Plan: no engine launches (configs outside a drafter's launch, or --fresh-launches: one each).")
        return
    if not plan.backend.capabilities.launches_engines:
        say(console, f"Plan of a measured search (--backend vllm) on {run_plan.device}; this run would predict.")
    for line in run_plan.lines():
        say(console, line)


def infeasible_warning(run: SearchRun) -> str | None:
    """What to say about the concurrencies where no config met the SLOs (None: every one found a config). A search
    that stored recommendations at the others exits 0 with this as a warning (``--json``: ``warnings``); one that
    stored none fails with it (exit 1)."""
    if not run.infeasible:
        return None
    from autotune.cli._tables import config_text

    which = ", ".join(f"c={r.scenario.concurrency} (closest: {config_text(r.best.config)})" for r in run.infeasible)
    return (f"No config met the SLOs at {which}; nothing was recommended there. Relax --slo-tpot-p99/--slo-ttft-p99, "
            "widen the space, or lower the concurrency.")


def _with_progress(search: Search, scenario: Scenario, console: Console, *, live: bool = True) -> ScenarioResult:
    """Run one scenario's search under a progress bar (complete/failed counts of every worker, and the engine
    launch under way with its phase, elapsed time and ETA). Only in a terminal and when `live`: piped output and
    --json get no progress display."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from autotune.cli._progress import ProgressWithLaunch, launch_progress

    def resumed(e: SearchEvent) -> None:
        if e.kind == "start" and e.done:
            say(console, f"Resuming study {e.study}: {e.done} of {e.target} trials already finished"
                + (f", {e.running} running on other workers." if e.running else "."))

    if not (live and console.is_terminal):
        return search.run_scenario(scenario, resumed)
    with ProgressWithLaunch(
        TextColumn(f"c={scenario.concurrency}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("", total=search.target)

        def on_event(e: SearchEvent) -> None:
            resumed(e)
            progress.update(task, completed=min(e.done, e.target), total=e.target, description=_states(e))

        def show_launch(line: str | None) -> None:
            progress.launch_line = line or ""

        with launch_progress(console, enabled=True, show=show_launch):
            return search.run_scenario(scenario, on_event)


def _states(e: SearchEvent) -> str:
    parts = [f"ok {e.complete}", f"failed {e.failed}"]
    if e.pruned:
        parts.append(f"pruned {e.pruned}")
    if e.running:
        parts.append(f"running elsewhere {e.running}")
    return ", ".join(parts)


def _say(console: Console, text: str, style: str | None = None) -> None:
    """A note line, word-wrapped at 100 columns or the terminal's width (`say`)."""
    say(console, text, style)


def print_results(run: SearchRun, console: Console, store: Any, *, wide: bool = False) -> None:
    """The results table, each drafter's best, the rules and provenance once (per concurrency only where they
    differ), Pareto fronts, what was stored and what to run next."""
    from autotune.cli._tables import comparison_table, pareto_table, results_table, step_table

    console.print()
    console.print(results_table(run, wide=wide))
    steps = step_table(run) if wide else None
    if steps is not None:
        console.print()
        console.print(steps)
    comparison = comparison_table(run, wide=wide)
    if comparison is not None:
        console.print()
        console.print(comparison)
    console.print()
    for label, text in _per_scenario(run, lambda r: r.rule):
        _say(console, f"Rule{label}: {text}.")
    for label, text in _per_scenario(run, lambda r: r.best.provenance.describe()):
        _say(console, f"Figures{label}: {text}.")
    for r in run.results:
        c = f"c={r.scenario.concurrency}"
        if r.hypothetical:
            _say(console, f"{c}: {r.hypothetical}.", "yellow")
        faster = r.faster_hypothetical
        if faster is not None and r.best.output_tokens_per_s:
            gain = faster.output_tokens_per_s / r.best.output_tokens_per_s - 1
            _say(console, f"{c}: the HYPOTHETICAL {faster.drafter} ({faster.layers}L) is predicted {gain:.0%} faster "
                 f"(K={faster.k}); not recommended: no checkpoint exists to serve it.", "yellow")
        if r.confirmation is not None:
            _say(console, f"{c}: {_confirmation_text(r.confirmation)}")
        if r.n_running:
            _say(console, f"{c}: {r.n_running} trials still running on other workers.")
        report = r.strategy_report
        if report.get("profiles"):
            error = report.get("prediction_error")
            _say(console, f"{c}: model-guided: predicted from {', '.join(report['profiles'].values())}; predicted "
                 f"best {report.get('predicted_best')}; {report.get('stop_reason')}"
                 + (f"; calibrated prediction error {error:.1%}" if error is not None else ""))
        if wide:
            _say(console, f"{c}: study {r.study_name}; trials {r.n_complete} ok, {r.n_failed} failed.")
    if not wide:
        counts = ", ".join(f"c={r.scenario.concurrency} {r.n_complete}/{r.n_failed}" for r in run.results)
        engine = f"; engine launches: {sum(r.engine_launches for r in run.results)}" if run.launches_engines else \
            "; no engine launched (predicted)"
        _say(console, f"Trials ok/failed: {counts}{engine}. More: --wide, `peagle-tune show --studies`.")
    for r in run.results:
        if r.pareto:
            console.print()
            console.print(pareto_table(r, wide=wide, model=run.model))
    _stored_lines(run, console, store)


def _per_scenario(run: SearchRun, text_of: Callable[[ScenarioResult], str]) -> list[tuple[str, str]]:
    """(label, text) once when every scenario says the same, else one per concurrency (label `` (c=8)``)."""
    texts = [text_of(r) for r in run.results]
    if len(set(texts)) <= 1:
        return [("", texts[0])] if texts else []
    return [(f" (c={r.scenario.concurrency})", t) for r, t in zip(run.results, texts, strict=True)]


def _stored_lines(run: SearchRun, console: Console, store: Any) -> None:
    """Where the recommendations went (or that an earlier run had stored them), and the export to run next."""
    from autotune.cli._common import store_label

    new = [r for r in run.results if r.recommendation_id is not None and not r.stored_before]
    old = [r for r in run.results if r.recommendation_id is not None and r.stored_before]

    def ids(rs: list[ScenarioResult]) -> str:
        return ", ".join(f"#{r.recommendation_id} (c={r.scenario.concurrency})" for r in rs)

    console.print()
    if new:
        _say(console, f"Stored recommendation{'s' if len(new) > 1 else ''} {ids(new)} in {store_label(store)}.")
    if old:
        _say(console, f"Already stored by an earlier run of the same study, same inputs and result: {ids(old)}; "
             "nothing new stored.")
    done = new + old
    if done:
        _say(console, next_line(run, done))


def _exported(r: ScenarioResult) -> dict[str, Any]:
    """What an export of `r`'s recommendation reads (its config, metrics and schedule)."""
    return {"best_config": r.best.config.to_dict(), "metrics": r.recommendation_metrics(),
            "schedule": [dataclasses.asdict(e) for e in r.schedule]}


def next_line(run: SearchRun, done: list[ScenarioResult]) -> str:
    """What to run next, suggesting only exports that work without a warning for the stored config
    (`autotune.export.clean_formats`, the rule the export itself warns by): the recommendation by id (a later
    search cannot make it ambiguous), the batch-size schedule when vLLM takes it with this config, else `serve`,
    which applies K per batch size itself."""
    from autotune.cli._tables import short_gpu
    from autotune.export import clean_formats

    top = max(done, key=lambda r: r.scenario.concurrency)
    formats = clean_formats(_exported(top))
    one = next((f for f in ("vllm-json", "vllm-args") if f in formats), None)
    if one is None:
        return ("Next: nothing to export as is: the recommended drafter has no checkpoint (HYPOTHETICAL); re-run with "
                "--no-include-hypothetical for a config vLLM can serve.")
    what = "the --speculative-config JSON" if one == "vllm-json" else "a `vllm serve` line"
    export = f"`peagle-tune export --recommendation {top.recommendation_id} --format {one}` ({what}"
    if len(done) == 1:
        return f"Next: {export}), or --format yaml for `vllm serve --config`."
    covers = f"batch sizes 1-{top.best.config.max_num_seqs}"
    if "schedule" in formats:
        later = (f"`peagle-tune export --recommendation {top.recommendation_id} --format schedule` for one config "
                 f"whose K follows the batch size (covers {covers})")
    else:
        later = (f"`peagle-tune serve --model {shell_word(short_model_arg(run.model))} "
                 f"--gpu {shell_word(short_gpu(run.device))} --dry-run` "
                 f"for one config whose K follows the batch size ({covers}; vLLM's own schedule does not take this "
                 "config)")
    return f"Next: {export} at c={top.scenario.concurrency}; `peagle-tune show` lists the others), or {later}."


def short_model_arg(model: str) -> str:
    """`model` as --model takes it, shortest: a catalog alias, else as stored."""
    from autotune.cli._tables import model_alias

    alias = model_alias(model)
    return alias if ".." not in alias else model


def _confirmation_text(note: dict[str, Any]) -> str:
    """One line on the fresh launches that confirmed an in-launch pick (`autotune.search.study.Search`)."""
    fresh, in_launch = note.get("fresh_tokens_per_s"), note.get("in_launch_tokens_per_s")
    figures = (f"{fresh:.1f} tok/s in a fresh launch against {in_launch:.1f} in its drafter's launch "
               f"({fresh / in_launch:.2f}x)" if fresh and in_launch else "the fresh launch failed")
    candidates = note.get("candidates") or []
    among = ""
    if len(candidates) > 1:
        among = (f" Picked on fresh launches of {note.get('launches')} of {len(candidates)} candidates (in-launch "
                 f"best {note.get('in_launch_best')}; with {note.get('graph_mode')} graphs the in-launch figures "
                 "below K_max ran PIECEWISE).")
    if note.get("recommended") == "kept":
        return f"{note.get('config')} kept: its figure needs no fresh launch and no candidate beat it.{among}"
    if note.get("recommended") == "confirmed":
        return f"{note.get('config')} confirmed: {figures}; the fresh figure is the one stored and exported.{among}"
    return f"{note.get('config')} not confirmed ({note.get('why')}): no speculation is recommended instead.{among}"


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
        "tie_note": r.tie,
        "best_config": r.best.config.to_dict(),
        "speculative_config": r.best.config.speculative_config() if r.feasible else None,
        "hypothetical": r.hypothetical,
        "metrics": measurement_metrics(r.best),
        "constraints": r.constraints,
        "output_tokens_per_s": r.best.output_tokens_per_s,
        "tpot_ms_p50": r.best.tpot_ms_p50,
        "speedup_vs_no_spec": r.speedup_over(r.baseline),
        "speedup_range": r.recommendation_metrics().get("speedup_range"),
        "speedup_vs_published_k": r.speedup_over(r.published),
        "published_k": r.published.config.k if r.published else None,
        "pareto": [p.to_dict() for p in r.pareto],
        "per_drafter": [row.to_dict() for row in r.per_drafter],
        "stored_before": r.stored_before,
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
            "trials": r.engine_launches - r.profile_launches if launches_engines else 0,
            "total": r.engine_launches if launches_engines else 0,
        },
        "confirmation": r.confirmation,
        "strategy_report": r.strategy_report,
    }


def run_dict(run: SearchRun) -> dict[str, Any]:
    """The whole run as JSON (what ``--json`` prints)."""
    return {
        "model": run.model,
        "workload": run.workload,
        "workload_detail": run.workload_detail,
        "device": run.device,
        "backend": run.backend,
        "objective": run.objective.to_dict(),
        "strategy": run.strategy,
        "notes": run.notes,
        "engine_launches": sum(r.engine_launches for r in run.results) if run.launches_engines else 0,
        "planned_launches": run.planned_launches,
        "plan": run.run_plan.to_dict() if run.run_plan is not None else None,
        "wall_s": round(run.wall_s, 1) if run.wall_s is not None else None,
        "scenarios": [result_dict(r, run.launches_engines) for r in run.results],
        "warnings": [{"concurrency": r.scenario.concurrency, "message": "no config met the SLOs; nothing was "
                      "recommended at this concurrency"} for r in run.infeasible],
    }
