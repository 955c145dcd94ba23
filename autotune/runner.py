"""`peagle-tune search` end to end: resolve the inputs, choose a backend, run the search, print and store."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autotune.backends.base import Backend
from autotune.config import Measurement, Scenario
from autotune.exceptions import BackendUnavailableError, UsageError
from autotune.search import ScenarioResult, Search
from autotune.space import DrafterChoice, SearchSpace
from store import Store


@dataclass
class SearchOptions:
    model: str
    gpu: str | None = None
    workload: str = "mt-bench"
    concurrencies: list[int] = field(default_factory=lambda: [1, 8, 64])
    objective: str = "throughput"
    trials: int = 60
    backend: str = "auto"
    drafters: list[str] = field(default_factory=list)
    max_k: int = 8
    max_num_seqs: list[int] | None = None
    parallel_drafting: str = "auto"
    study: str | None = None
    seed: int = 0


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


def _default_seqs(concurrency: int) -> list[int]:
    return sorted({max(concurrency // 2, 1), concurrency, concurrency * 2})


def build_space(options: SearchOptions, drafters: list[DrafterChoice], concurrency: int) -> SearchSpace:
    return SearchSpace(
        drafters=tuple(drafters),
        k_max=options.max_k,
        max_num_seqs=tuple(options.max_num_seqs or _default_seqs(concurrency)),
        parallel_drafting=options.parallel_drafting,
    )


def _drafter_specs(model_name: str, names: list[str]) -> list[Any]:
    from autotune.catalogs import drafters_for, get_drafter

    specs = [get_drafter(n, target=model_name) for n in names] if names else drafters_for(model_name)
    if not specs:
        raise UsageError(f"The catalog has no drafter for {model_name!r}; pass one with --drafter ID_OR_PATH.")
    return specs


def _choice(spec: Any) -> DrafterChoice:
    return DrafterChoice(
        name=str(spec.local_path or spec.name),
        method=spec.method,
        layers=spec.num_layers,
        parallel_capable=spec.parallel_drafting,
        recommended_k=spec.recommended_k,
    )


def run_search(store: Store, options: SearchOptions, console: Console, as_json: bool = False) -> list[ScenarioResult]:
    from autotune.catalogs import default_gpu, get_gpu, resolve_model
    from autotune.environment import detect_environment
    from autotune.workloads import load_workload

    if options.max_k < 1:
        raise UsageError(f"--max-k must be in [1, 16], but got {options.max_k}.")
    spec = resolve_model(options.model)
    workload = load_workload(options.workload)
    kind, why = choose_backend(options.backend, spec.local_path)
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
    specs = _drafter_specs(spec.name, options.drafters)
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
    notes.insert(0, f"Backend: {kind} ({why}).")
    for n in notes:
        console.print(f"[bold]{n}[/bold]")

    results: list[ScenarioResult] = []
    for concurrency in options.concurrencies:
        search = Search(
            store=store,
            backend=backend,
            model=spec.name,
            device=device,
            workload=workload,
            space=build_space(options, drafters, concurrency),
            objective=options.objective,
            n_trials=options.trials,
            seed=options.seed,
            study_prefix=options.study,
        )
        with Progress(
            TextColumn(f"concurrency {concurrency}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("", total=options.trials)
            failed = {"n": 0}

            def on_trial(
                done: int, total: int, m: Measurement | None, task: Any = task, failed: dict[str, int] = failed
            ) -> None:
                if m is not None and not m.ok:
                    failed["n"] += 1
                progress.update(task, completed=done, total=total, description=f"failed {failed['n']}")

            result = search.run_scenario(Scenario(concurrency=concurrency), on_trial)
        search.recommend(result, environment)
        results.append(result)

    if as_json:
        print(json.dumps([result_dict(r) for r in results], indent=2, default=str))
    else:
        console.print(results_table(results, spec.name, workload.name, options.objective))
        for r in results:
            console.print(f"  c={r.scenario.concurrency}: {r.best.provenance.describe()}")
        ids = ", ".join(f"#{r.recommendation_id}" for r in results)
        console.print(
            f"Stored recommendation {ids} in {store.url}. Export the newest with "
            "`peagle-tune export --format vllm-json` (or --recommendation ID)."
        )
    return results


def _fmt(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def results_table(results: list[ScenarioResult], model: str, workload: str, objective: str) -> Table:
    kinds = {r.best.provenance.kind for r in results}
    title = f"{model} on {workload}: best config per concurrency ({objective}; {'/'.join(sorted(kinds))})"
    table = Table(title=title, caption="drafters: " + ", ".join(sorted({str(r.best.config.drafter) for r in results
                                                                       if r.best.config.drafter})) or None)
    for col in ("conc.", "best config", "tokens/s", "TPOT ms", "vs no spec", "vs pub. K", "trials"):
        table.add_column(col, justify="left" if col == "best config" else "right")
    for r in results:
        pub = r.speedup_over(r.published)
        pub_label = "-" if r.published is None else f"{_fmt(pub, '.2f', 'x')} (K={r.published.config.k})"
        table.add_row(
            str(r.scenario.concurrency),
            r.best.config.label(),
            _fmt(r.best.output_tokens_per_s),
            _fmt(r.best.tpot_ms_p50, ".2f"),
            _fmt(r.speedup_over(r.baseline), ".2f", "x"),
            pub_label,
            f"{r.n_trials - r.n_failed}/{r.n_trials}",
        )
    return table


def result_dict(r: ScenarioResult) -> dict[str, Any]:
    return {
        "concurrency": r.scenario.concurrency,
        "study": r.study_name,
        "recommendation_id": r.recommendation_id,
        "best_config": r.best.config.to_dict(),
        "speculative_config": r.best.config.speculative_config(),
        "output_tokens_per_s": r.best.output_tokens_per_s,
        "tpot_ms_p50": r.best.tpot_ms_p50,
        "speedup_vs_no_spec": r.speedup_over(r.baseline),
        "speedup_vs_published_k": r.speedup_over(r.published),
        "schedule": [e.__dict__ for e in r.schedule],
        "class_policy": r.class_policy,
        "provenance": r.best.provenance.to_dict(),
        "trials": r.n_trials,
        "failed_trials": r.n_failed,
    }


