"""`peagle-tune search` end to end: resolve the inputs, choose a backend, run the search, print and store.

Human output (notes, progress bar, tables) goes to the console it is given; with ``as_json`` the machine-readable
result is the only thing written to stdout.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from autotune.backends.base import Backend
from autotune.errors import BackendUnavailableError, UsageError
from autotune.search import (
    ModelGuidedStrategy,
    Objective,
    ScenarioResult,
    Search,
    SearchEvent,
    make_strategy,
    measurement_metrics,
)
from autotune.space import DrafterChoice, SearchSpace, SpaceSpec, load_space_file
from autotune.spec import Scenario
from store import Store

DEFAULT_K_MAX = 8


@dataclass
class SearchOptions:
    """Everything `peagle-tune search` takes. `space` holds the CLI's space options (None: not given); they override
    `space_file`, which overrides the defaults (K in [1, 8], max_num_seqs around each concurrency, vLLM's default
    max_num_batched_tokens, parallel drafting auto, no hypothetical drafters)."""

    model: str
    gpu: str | None = None
    workload: str = "mt-bench"
    concurrencies: list[int] = field(default_factory=lambda: [1, 8, 64])
    objective: str = "throughput"
    slo_tpot_p99_ms: float | None = None
    slo_ttft_p99_ms: float | None = None
    strategy: str = "auto"
    """auto: model-guided with the vllm backend (it profiles each drafter once, or reuses a stored profile),
    blackbox with the model backend (its trials are predictions already); or model-guided, blackbox, random, grid."""
    sampler: str | None = None
    """tpe (default) or gp; blackbox only."""
    trials: int | None = None
    """Trials per concurrency, shared by every worker of the study (None: 60; grid: the whole grid)."""
    backend: str = "auto"
    space: SpaceSpec = field(default_factory=SpaceSpec)
    space_file: str | Path | None = None
    study: str | None = None
    storage: str | None = None
    """Optuna storage URL for the studies (None: the --db database)."""
    heartbeat: int = 60
    """Seconds between a running trial's heartbeats; a trial silent for twice that is failed and re-queued."""
    seed: int = 0


@dataclass
class SearchRun:
    """What `run_search` did: the results, and the context needed to print them."""

    results: list[ScenarioResult]
    model: str
    workload: str
    device: str
    backend: str
    objective: Objective
    strategy: str
    notes: list[str]

    @property
    def infeasible(self) -> list[ScenarioResult]:
        return [r for r in self.results if not r.feasible]


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def choose_backend(requested: str, model_path: str | None) -> tuple[str, str]:
    """Pick the backend and say why. vLLM needs an importable vllm and a model it can load (a local directory)."""
    if requested == "model":
        return "model", "--backend model"
    has_vllm = vllm_importable()
    if requested == "vllm":
        if not has_vllm:
            raise BackendUnavailableError(
                "--backend vllm needs vLLM: install it with `pip install 'peagle-tune[vllm]'` on a GPU machine "
                "or `pip install 'peagle-tune[cpu]'` for the CPU build."
            )
        if model_path is None:
            raise UsageError(
                "--backend vllm needs a model vLLM can load here: pass a local model directory to --model "
                "(this machine cannot download from a model hub)."
            )
        return "vllm", "--backend vllm"
    if has_vllm and model_path is not None:
        return "vllm", "vLLM is installed and the model is a local directory"
    why = "vLLM is not installed" if not has_vllm else "the model is not a local directory vLLM can load here"
    return "model", f"{why}, so figures are predicted"


def resolve_strategy(requested: str, backend: str, sampler: str | None = None) -> str:
    """``auto`` -> model-guided with the vllm backend (a profile exists or one launch per drafter makes it),
    blackbox with the model backend or when --sampler is given; other names unchanged."""
    if requested != "auto":
        return requested
    return "model-guided" if backend == "vllm" and sampler is None else "blackbox"


def _default_seqs(concurrency: int) -> list[int]:
    return sorted({max(concurrency // 2, 1), concurrency, concurrency * 2})


def resolve_space_spec(options: SearchOptions) -> SpaceSpec:
    """The space file (if any) with the CLI's space options laid over it."""
    base = load_space_file(options.space_file) if options.space_file else SpaceSpec()
    return base.overridden_by(options.space)


def build_space(spec: SpaceSpec, drafters: list[DrafterChoice], concurrency: int) -> SearchSpace:
    k_max = spec.k_max if spec.k_max is not None else max(DEFAULT_K_MAX, spec.k_min or 1)
    return SearchSpace(
        drafters=tuple(drafters),
        k_min=spec.k_min if spec.k_min is not None else 1,
        k_max=k_max,
        max_num_seqs=tuple(spec.max_num_seqs or _default_seqs(concurrency)),
        max_num_batched_tokens=tuple(spec.max_num_batched_tokens or (None,)),
        parallel_drafting=spec.parallel_drafting or "auto",
    )


def _drafter_specs(model_name: str, names: tuple[str, ...] | None, include_hypothetical: bool) -> list[Any]:
    from autotune.catalogs import drafters_for, get_drafter

    if names:
        specs = [get_drafter(n, target=model_name) for n in names]
        if include_hypothetical:
            specs = [v for s in specs for v in s.variants()]
    else:
        specs = drafters_for(model_name, include_hypothetical=include_hypothetical)
    if not specs:
        raise UsageError(f"The catalog has no drafter for {model_name!r}; pass one with --drafter ID_OR_PATH.")
    return specs


def _choice(spec: Any) -> DrafterChoice:
    hypothetical = not spec.published
    return DrafterChoice(
        name=str(spec.local_path or spec.name),
        method=spec.method,
        layers=spec.num_layers,
        parallel_capable=spec.parallel_drafting,
        recommended_k=spec.recommended_k,
        hypothetical=hypothetical,
        # The catalog's source text starts with what the variant is; its citations follow in parentheses.
        note=spec.source.split(" (")[0] if hypothetical else "",
    )


def run_search(store: Store, options: SearchOptions, console: Console, as_json: bool = False) -> SearchRun:
    """Run the search for every concurrency, store the recommendations, print tables (or JSON on stdout)."""
    from autotune.catalogs import default_gpu, get_gpu, resolve_model
    from autotune.environment import detect_environment
    from autotune.workloads import load_workload

    objective = Objective(options.objective, options.slo_tpot_p99_ms, options.slo_ttft_p99_ms)
    if options.strategy != "auto":
        make_strategy(options.strategy, options.sampler)  # fail on a bad name before anything is resolved
    if options.trials is not None and options.trials < 1:
        raise UsageError(f"--trials must be >= 1, but got {options.trials}.")
    spec_space = resolve_space_spec(options)
    spec = resolve_model(options.model)
    workload = load_workload(options.workload)
    kind, why = choose_backend(options.backend, spec.local_path)
    include_hypothetical = bool(spec_space.include_hypothetical)
    backend: Backend
    notes: list[str] = []
    if kind == "model":
        from autotune.backends.model import ModelBackend

        gpu = get_gpu(options.gpu) if options.gpu else default_gpu()
        if not options.gpu:
            notes.append(f"No --gpu given: assumed {gpu.display_name}.")
        backend = ModelBackend(spec, gpu)
        device = gpu.display_name
        environment: dict[str, Any] = {"device": device, "vllm_version": None}
    else:
        from autotune.backends.vllm import VLLMBackend

        environment = detect_environment()
        device = environment["device"]
        if options.gpu:
            notes.append(f"--gpu {options.gpu} ignored: the vLLM backend measures on this machine ({device}).")
        backend = VLLMBackend(model=str(spec.local_path))
    specs = _drafter_specs(spec.name, spec_space.drafters, include_hypothetical)
    if kind == "model":
        # The model backend predicts acceptance from published figures; a drafter without any cannot be ranked.
        unranked = [d.name for d in specs if not d.reference_acceptance]
        specs = [d for d in specs if d.reference_acceptance]
        if unranked:
            notes.append(
                f"Skipped {', '.join(unranked)}: no published acceptance to predict from "
                "(profile them on a GPU with `--backend vllm`)."
            )
        if not specs:
            raise UsageError(
                f"No drafter of {spec.name} has published acceptance figures, so nothing can be predicted. "
                "Run with `--backend vllm` on a machine that can load the model."
            )
    drafters = [_choice(d) for d in specs]
    strategy = make_strategy(resolve_strategy(options.strategy, kind, options.sampler), options.sampler)
    if isinstance(strategy, ModelGuidedStrategy):
        strategy.profile_concurrencies = tuple(options.concurrencies)
    hypothetical = [d.name for d in drafters if d.hypothetical]
    if hypothetical and kind != "model":
        raise UsageError(
            f"Drafters {hypothetical} are hypothetical variants (--include-hypothetical or a `:N-layer` name): no "
            "checkpoint exists, so no engine can load them. Use --backend model, or drop them."
        )
    if hypothetical:
        notes.append(
            f"Including HYPOTHETICAL drafters {', '.join(hypothetical)}: unreleased layer variants whose acceptance "
            "is scaled from the published head; no checkpoint exists, so vLLM cannot serve them."
        )
    notes.insert(0, f"Backend: {kind} ({why}).")
    notes.append(f"Objective: {objective.describe()}; strategy: {strategy.name}.")
    for n in notes:
        console.print(f"[bold]{n}[/bold]", highlight=False)

    results: list[ScenarioResult] = []
    for concurrency in options.concurrencies:
        search = Search(
            store=store,
            backend=backend,
            model=spec.name,
            device=device,
            workload=workload,
            space=build_space(spec_space, drafters, concurrency),
            objective=objective,
            strategy=strategy,
            n_trials=options.trials,
            seed=options.seed,
            study_prefix=options.study,
            storage_url=options.storage,
            heartbeat_interval=options.heartbeat,
        )
        result = _run_with_progress(search, Scenario(concurrency=concurrency), console)
        search.recommend(result, environment)
        results.append(result)

    run = SearchRun(results, spec.name, workload.name, device, kind, objective, strategy.name, notes)
    if as_json:
        sys.stdout.write(json.dumps(run_dict(run), indent=2, default=str) + "\n")
        sys.stdout.flush()
    else:
        print_results(run, console, store)
    return run


def _run_with_progress(search: Search, scenario: Scenario, console: Console) -> ScenarioResult:
    with Progress(
        TextColumn(f"c={scenario.concurrency}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task: TaskID = progress.add_task("", total=search.target)

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


# ---------------------------------------------------------------------------------------------------- rendering


def _fmt(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _label(r: ScenarioResult) -> str:
    label = r.best.config.label()
    if r.hypothetical:
        label += " [HYPOTHETICAL]"
    if not r.feasible:
        label = f"NONE meets the SLOs (closest: {label})"
    return label


def results_table(run: SearchRun) -> Table:
    kinds = {r.best.provenance.kind for r in run.results}
    title = f"{run.model} on {run.workload}: best config per concurrency ({run.objective.describe()}; " \
        f"{'/'.join(sorted(kinds))})"
    drafters = sorted({str(r.best.config.drafter) for r in run.results if r.best.config.drafter})
    caption = "trials: ok/failed/pruned" + (f"; drafters: {', '.join(drafters)}" if drafters else "")
    table = Table(title=title, caption=caption)
    show_ttft = "ttft_ms_p99" in run.objective.slos
    cols = ["conc.", "best config", "tok/s", "TPOT ms p50/p99"]
    cols += ["TTFT p99 ms"] if show_ttft else []
    cols += ["vs no spec", "vs pub. K", "trials", "launches"]
    for col in cols:
        table.add_column(col, justify="left" if col == "best config" else "right")
    for r in run.results:
        metrics = measurement_metrics(r.best)
        pub = r.speedup_over(r.published)
        pub_label = "-" if r.published is None else f"{_fmt(pub, '.2f', 'x')} (K={r.published.config.k})"
        row = [
            str(r.scenario.concurrency),
            _label(r),
            _fmt(r.best.output_tokens_per_s),
            f"{_fmt(metrics['tpot_ms_p50'], '.2f')}/{_fmt(metrics['tpot_ms_p99'], '.2f')}",
        ]
        row += [_fmt(metrics["ttft_ms_p99"], ".0f")] if show_ttft else []
        row += [
            _fmt(r.speedup_over(r.baseline), ".2f", "x"),
            pub_label,
            f"{r.n_complete}/{r.n_failed}/{r.n_pruned}",
            _launches(r, run.backend),
        ]
        table.add_row(*row)
    return table


def _launches(r: ScenarioResult, backend: str) -> str:
    """Engine launches of a scenario: profiling + trials (the model backend launches nothing)."""
    if backend != "vllm":
        return "0"
    if r.profile_launches:
        return f"{r.engine_launches} ({r.profile_launches} profiling)"
    return str(r.engine_launches)


def pareto_table(r: ScenarioResult) -> Table:
    table = Table(title=f"c={r.scenario.concurrency}: Pareto front ({len(r.pareto)} configs; * = recommended)")
    for col in ("", "config", "tokens/s", "TPOT p99 ms", "TTFT p99 ms", "trial"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for p in r.pareto:
        mark = "*" if r.feasible and p.config == r.best.config else ""
        label = p.config.label() + (" [HYPOTHETICAL]" if p.hypothetical else "")
        table.add_row(
            mark,
            label,
            _fmt(p.metrics.get("output_tokens_per_s")),
            _fmt(p.metrics.get("tpot_ms_p99"), ".2f"),
            _fmt(p.metrics.get("ttft_ms_p99"), ".0f"),
            str(p.trial),
        )
    return table


def print_results(run: SearchRun, console: Console, store: Store) -> None:
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


def result_dict(r: ScenarioResult, run_backend: str = "vllm") -> dict[str, Any]:
    """A scenario's result as JSON; ``engine_launches`` counts profiling and trial launches (0 with the model
    backend, which predicts)."""
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
            "profiling": r.profile_launches if run_backend == "vllm" else 0,
            "trials": r.n_measurements if run_backend == "vllm" else 0,
            "total": r.engine_launches if run_backend == "vllm" else 0,
        },
        "strategy_report": r.strategy_report,
    }


def run_dict(run: SearchRun) -> dict[str, Any]:
    return {
        "model": run.model,
        "workload": run.workload,
        "device": run.device,
        "backend": run.backend,
        "objective": run.objective.to_dict(),
        "strategy": run.strategy,
        "notes": run.notes,
        "engine_launches": sum(r.engine_launches for r in run.results) if run.backend == "vllm" else 0,
        "scenarios": [result_dict(r, run.backend) for r in run.results],
    }
