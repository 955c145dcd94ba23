"""`peagle-tune search` as an application service: resolve the inputs (model, workload, backend, drafters, space,
objective, strategy), run a search per concurrency, store the recommendations. It prints nothing: the notes, the
progress and the results are the caller's to show (`autotune.cli.search`).

Two steps, so the caller can show the notes before anything is measured::

    plan = plan_search(store, SearchOptions(model="gpt-oss-120b", concurrencies=[1, 8]))
    print("\\n".join(plan.notes))
    run = plan.run()            # or plan.run(run_scenario) to wrap each scenario (e.g. in a progress bar)
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend
from autotune.engine import EngineOptions, vllm_available
from autotune.errors import ConfigError, UsageError
from autotune.search.confirm import MAX_CANDIDATES, extra_confirmation_launches
from autotune.search.machine import (
    Checkpoints,
    check_fit,
    choose_backend,
    drafter_spec,
    fetch,
    resolve_drafters,
    resolve_target,
    token_counter,
    workload_max_model_len,
)
from autotune.search.objective import Objective
from autotune.search.plan import RunPlan, catalog_rows, checkpoint_rows, launch_units, worker_groups
from autotune.search.registry import make_strategy
from autotune.search.result import ScenarioResult
from autotune.search.space import DrafterChoice, SearchSpace, SpaceSpec, load_space_file
from autotune.search.strategy import Strategy
from autotune.search.study import Search
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload
from policies._graphs import PIECEWISE_PENALTY_SHARE
from store import Store

DEFAULT_K_MAX = 8

#: How a plan runs one scenario's search (the default: ``search.run_scenario(scenario)``).
ScenarioRunner = Callable[[Search, Scenario], ScenarioResult]


@dataclass
class SearchOptions:
    """Everything `peagle-tune search` takes. `space` holds the CLI's space options (None: not given); they override
    `space_file`, which overrides the defaults (K in [1, 8], max_num_seqs around each concurrency, vLLM's default
    max_num_batched_tokens, parallel drafting auto; with the catalog's drafters on the model backend, which can
    predict them, their hypothetical layer variants too, so 2- vs 4-layer heads are compared; never with the vllm
    backend)."""

    model: str
    gpu: str | None = None
    workload: str | None = None
    """A workload spec (`autotune.workloads.load_workload`); None: the default (`resolve_workload`)."""
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
    fresh_launches: bool = False
    """vllm backend: one engine launch per config instead of one per drafter (`autotune.backends.InLaunchBackend`)."""
    tensor_parallel_size: int = 1
    """GPUs the target is split over: handed to vLLM, kept in every config (so in provenance and exports), and the
    model backend predicts for that many GPUs."""
    no_download: bool = False
    """Never download a checkpoint: a search that would needs one refuses (--backend vllm) or predicts (auto)."""
    gpus: list[str] | None = None
    """Device ids the search may use (--gpus; None: every GPU NVML finds), one worker per --tensor-parallel-size of
    them. Where NVML finds none (predicting, or vLLM's CPU build) they stand for the box the plan is for."""


@dataclass
class SearchRun:
    """What a search run did: the results, and the context needed to show them."""

    results: list[ScenarioResult]
    model: str
    workload: str
    device: str
    backend: str
    """The backend's name ("model" or "vllm")."""
    objective: Objective
    strategy: str
    notes: list[str]
    launches_engines: bool = False
    """Each measurement launched an engine (`Capabilities.launches_engines`): launch counts mean something."""
    planned_launches: dict[str, int] | None = None
    """In-launch measurement: the engine launches the plan counted, at most (`SearchPlan.planned_launches`)."""
    workload_detail: dict[str, Any] | None = None
    """`SearchPlan.workload_detail`."""
    run_plan: RunPlan | None = None
    wall_s: float | None = None
    """Seconds the run took, downloads included (to put beside `run_plan.wall_s`)."""

    @property
    def infeasible(self) -> list[ScenarioResult]:
        return [r for r in self.results if not r.feasible]


@dataclass
class SearchPlan:
    """What `plan_search` resolved: one `Search` per concurrency, and notes on what was assumed or skipped."""

    model: str
    workload: Workload
    device: str
    backend: Backend
    objective: Objective
    strategy: Strategy
    notes: list[str]
    environment: dict[str, Any]
    """Where the figures come from (device, vLLM version), stored with each recommendation."""
    searches: list[tuple[Search, Scenario]]
    checkpoints: Checkpoints | None = None
    """What the engines load (vllm backend); `run` downloads what is missing first."""
    no_download: bool = False
    planned_launches: dict[str, int] | None = None
    """In-launch measurement: the engine launches planned, at most: ``in_launch`` (one per drafter and drafting
    mode, and one without speculation), ``confirmation`` (one per concurrency), ``confirmation_graphs`` (what FULL
    CUDA graphs add: `autotune.search.confirm`), ``own`` (configs outside a drafter's launch), ``total``."""
    run_plan: RunPlan | None = None
    """The launches of a measured search, where they run and how long they take (`autotune.search.plan`); with the
    model backend, those of a measured search on the box of --gpu and --gpus."""
    options: SearchOptions | None = None
    """What the plan was made from (worker processes of a parallel search plan it again)."""
    workload_detail: dict[str, Any] | None = None
    """The workload as every output names it (`autotune.workloads.Workload.summary`): dataset, prompts, input and
    output lengths in tokens."""

    def run(self, run_scenario: ScenarioRunner | None = None) -> SearchRun:
        """Download what the engines need (unless --no-download), then search every scenario in order and store
        each feasible result as a recommendation."""
        start = time.monotonic()
        if self.checkpoints is not None:
            fetch(self.checkpoints, self.no_download)
        parallel = None
        if self.options is not None and self.run_plan is not None and len(self.run_plan.groups) > 1 \
                and self.backend.capabilities.launches_engines and self.planned_launches is not None:
            from autotune.search.workers import run_parallel

            parallel = run_parallel(self, self.options, run_scenario)
        results: list[ScenarioResult] = []
        for i, (search, scenario) in enumerate(self.searches):
            if parallel is not None:
                result = parallel[i]
            else:
                result = run_scenario(search, scenario) if run_scenario else search.run_scenario(scenario)
            if not _report_stored(search, result, self.environment):
                search.recommend(result, self.environment)
            results.append(result)
        return SearchRun(results, self.model, self.workload.name, self.device, self.backend.name, self.objective,
                         self.strategy.name, self.notes, self.backend.capabilities.launches_engines,
                         self.planned_launches, workload_detail=self.workload_detail, run_plan=self.run_plan,
                         wall_s=time.monotonic() - start)


def _comparable(value: Any) -> Any:
    """`value` as the store's JSON columns give it back (tuples as lists, non-JSON values as text)."""
    return json.loads(json.dumps(value, default=str))


def _report_stored(search: Search, result: ScenarioResult, environment: dict[str, Any]) -> bool:
    """Re-running a finished search (same inputs, same study, nothing new measured) finds the result it stored last
    time: point `result` at that recommendation instead of storing a duplicate. True when it did."""
    if not result.feasible:
        return False
    wanted = {
        "model": search.model,
        "gpu": search.device,
        "vllm_version": environment.get("vllm_version"),
        "workload_hash": search.workload.content_hash(),
        "objective": search.objective.name,
        "scenario": result.scenario.to_dict(),
        "best_config": result.best.config.to_dict(),
        "metrics": search.recommendation_metrics(result),
        "provenance": result.best.provenance.to_dict(),
        "pareto": [p.to_dict() for p in result.pareto],
        "schedule": [dataclasses.asdict(e) for e in result.schedule],
        "class_policy": result.class_policy,
    }
    stored = [r for r in search.store.list_recommendations(model=search.model) if r.study == result.study_name]
    if not stored:
        return False
    newest = stored[0]  # list_recommendations is newest first
    have = newest.to_dict()
    if any(_comparable(have.get(key)) != _comparable(value) for key, value in wanted.items()):
        return False
    result.recommendation_id = newest.id
    result.stored_before = True
    return True


def resolve_strategy(requested: str, backend: str, sampler: str | None = None, in_launch: bool = False) -> str:
    """``auto`` -> grid when every config is measured in its drafter's launch (each trial then costs no launch),
    model-guided with the vllm backend otherwise (a profile exists or one launch per drafter makes it), blackbox with
    the model backend or when --sampler is given; other names unchanged."""
    if requested != "auto":
        return requested
    if sampler is not None or backend != "vllm":
        return "blackbox"
    return "grid" if in_launch else "model-guided"


def _default_seqs(concurrency: int, in_launch: bool = False) -> list[int]:
    """max_num_seqs choices: the concurrency itself when measuring in-launch (a closed loop never fills a larger cap,
    and a smaller one queues requests at a launch per config), else half, equal and twice the concurrency."""
    if in_launch:
        return [concurrency]
    return sorted({max(concurrency // 2, 1), concurrency, concurrency * 2})


def resolve_space_spec(options: SearchOptions) -> SpaceSpec:
    """The space file (if any) with the CLI's space options laid over it."""
    base = load_space_file(options.space_file) if options.space_file else SpaceSpec()
    return base.overridden_by(options.space)


def build_space(
    spec: SpaceSpec, drafters: list[DrafterChoice], concurrency: int, in_launch: bool = False,
    tensor_parallel_size: int = 1,
) -> SearchSpace:
    k_max = spec.k_max if spec.k_max is not None else max(DEFAULT_K_MAX, spec.k_min or 1)
    return SearchSpace(
        drafters=tuple(drafters),
        k_min=spec.k_min if spec.k_min is not None else 1,
        k_max=k_max,
        max_num_seqs=tuple(spec.max_num_seqs or _default_seqs(concurrency, in_launch)),
        max_num_batched_tokens=tuple(spec.max_num_batched_tokens or (None,)),
        parallel_drafting=spec.parallel_drafting or "auto",
        tensor_parallel_size=tensor_parallel_size,
    )


def _drafter_specs(model: Any, names: tuple[str, ...] | None, include_hypothetical: bool) -> list[Any]:
    """The drafters searched for target `model` (a ModelSpec): those named (catalog names, local directories or
    Hugging Face repo ids), else the catalog's for the model."""
    from autotune.catalogs import drafters_for

    if names:
        specs = [drafter_spec(n, model) for n in names]
        if include_hypothetical:
            specs = [v for s in specs for v in s.variants()]
    else:
        specs = drafters_for(model, include_hypothetical=include_hypothetical)
    if not specs:
        raise UsageError(f"The catalog has no drafter for {model.name!r}; pass one with --drafter ID_OR_PATH.")
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


def _backend(
    kind: str, spec: Any, gpu_name: str | None, notes: list[str], found: Checkpoints | None, tp: int,
    max_model_len: int | None = None,
) -> tuple[Backend, dict[str, Any]]:
    """The backend of `kind` for target `spec` (launching from `found`'s checkpoints with `max_model_len`), and the
    environment its figures come from."""
    from autotune.catalogs import default_gpu, get_gpu

    if kind == "model":
        from autotune.backends.model import ModelBackend

        gpu = get_gpu(gpu_name) if gpu_name else default_gpu()
        if not gpu_name:
            notes.append(f"No --gpu given: assumed {gpu.display_name}.")
        elif gpu_name.strip().lower() != gpu.key:
            notes.append(f"--gpu {gpu_name.strip()!r} is the catalog's {gpu.key} ({gpu.display_name}).")
        device = gpu.display_name if tp == 1 else f"{tp} x {gpu.display_name}"
        return ModelBackend(spec, gpu, tp=tp), {"device": device, "vllm_version": None}
    from autotune.backends.vllm import VLLMBackend
    from autotune.environment import detect_environment

    assert found is not None and found.target is not None
    environment = detect_environment()
    target = found.target.launch_dir or found.target.repo_id
    dirs = {name: str(c.launch_dir) for name, c in found.drafters.items() if c.repo_id and c.launch_dir}
    return VLLMBackend(model=str(target), checkpoint_dirs=dirs, max_model_len=max_model_len), environment


def _check_gpu_flag(gpu: str | None, gpus: list[dict[str, Any]]) -> None:
    """A --gpu that contradicts the GPUs NVML finds (`gpus`) is an error when measuring (the figures would be this
    machine's, labelled as another GPU's)."""
    from autotune.environment import gpu_flag_conflict

    if gpu:
        conflict = gpu_flag_conflict(gpu, gpus)
        if conflict:
            raise UsageError(conflict + ".")


def _device_line(environment: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    """Where the search measures (`gpus`: what NVML found), in one line."""
    version = environment.get("vllm_version")
    if not gpus:
        return f"Device: CPU (NVML finds no NVIDIA GPU); vLLM {version}."
    memory = gpus[0].get("memory_bytes")
    each = f", {memory / 1e9:.0f} GB each" if memory else ""
    return f"Device: {len(gpus)} x {gpus[0]['name']}{each} (NVML, driver {gpus[0]['driver']}); vLLM {version}."


def _predictable(specs: list[Any], model: str, notes: list[str]) -> list[Any]:
    """The drafters the model backend can predict: those with published acceptance figures."""
    unranked = [d.name for d in specs if not d.reference_acceptance]
    if unranked:
        notes.append(
            f"Skipped {', '.join(unranked)}: no published acceptance to predict from "
            "(profile them on a GPU with `--backend vllm`)."
        )
    specs = [d for d in specs if d.reference_acceptance]
    if not specs:
        raise UsageError(
            f"No drafter of {model} has published acceptance figures, so nothing can be predicted. "
            "Run with `--backend vllm` on a machine that can load the model."
        )
    return specs


def _scenario(kind: str, concurrency: int, workload: Workload) -> Scenario:
    """The scenario searched at `concurrency`. Measured (vllm), a closed loop of at least 4 requests per slot, so
    a small workload still keeps `concurrency` requests in flight for most of the phase (its requests repeat)."""
    if kind != "vllm":
        return Scenario(concurrency=concurrency)
    return Scenario(concurrency=concurrency, num_prompts=max(len(workload.requests()), 4 * concurrency))


def _in_launch(
    fresh: Backend, spaces: list[SearchSpace], scenarios: list[Scenario], workload: Workload, notes: list[str]
) -> tuple[Backend, dict[str, int]]:
    """`fresh` (a `VLLMBackend`) wrapped so every static K of a drafter is measured in one launch, and the launches
    it plans (`SearchPlan.planned_launches`), which it also says in `notes`."""
    from autotune.backends.in_launch import InLaunchBackend
    from autotune.backends.vllm import VLLMBackend

    assert isinstance(fresh, VLLMBackend)
    ks = range(min(s.k_min for s in spaces), max(s.k_max for s in spaces) + 1)
    backend = InLaunchBackend(fresh, scenarios, ks, workload)
    grids = [(sc, sp.grid()) for sc, sp in zip(scenarios, spaces, strict=True)]
    shared, own = backend.planned_launches(grids)
    speculative = [c for _, grid in grids for c in grid if c.speculative]
    mode = _fresh_graph_mode(fresh, speculative[0]) if speculative else None
    below = [sum(1 for c in grid if c.speculative and c.k < backend.k_max) for _, grid in grids]
    extra = extra_confirmation_launches(mode, below)
    confirm = (
        f" + up to {extra} more: with {mode} CUDA graphs a figure below K_max ran PIECEWISE in its drafter's launch "
        f"(fresh at its K it runs FULL, up to {PIECEWISE_PENALTY_SHARE:.0%} faster), so up to {MAX_CANDIDATES} "
        "configs within that spread of each concurrency's best are launched fresh and the pick is made on those "
        "figures." if extra else "."
    )
    notes.append(
        f"Launches planned: {shared} (one per drafter and drafting mode at K_max={backend.k_max}, measuring every K "
        f"at every concurrency, and one without speculation) + up to {len(scenarios)} to confirm each "
        f"concurrency's best config in a fresh launch of exactly that config{confirm}"
    )
    if own:
        notes.append(f"{own} configs fall outside a drafter's launch (max_num_seqs below the concurrency, "
                     "max_num_batched_tokens): one launch each if the search measures them.")
    return backend, {"in_launch": shared, "confirmation": len(scenarios), "confirmation_graphs": extra,
                     "own": own, "total": shared + len(scenarios) + extra + own}


def _fresh_graph_mode(fresh: Backend, config: SpecConfig) -> str | None:
    """The CUDA-graph mode vLLM will run a fresh launch of `config` with (`autotune.engine.predict_variant`);
    None when the engine's environment makes it unpredictable (vLLM then fails with its own message)."""
    from autotune.backends.vllm import VLLMBackend
    from autotune.engine import predict_variant

    assert isinstance(fresh, VLLMBackend)
    try:
        return predict_variant(fresh.options.engine_args(config, engine_paths=False),
                               fresh.options.process_env()).cudagraph_mode
    except ConfigError:
        return None


def _predicted_memory(backend: Backend, specs: list[Any], workload: Workload, concurrency: int) -> list[str]:
    """What vLLM would do with the target and its largest published drafter at the workload's max_model_len on the
    backend's GPU(s), predicted from the catalog's sizes (`autotune.backends._memory.predicted_fit`): the line and
    its warning, if any."""
    from autotune.backends._memory import predicted_fit
    from autotune.backends.model import ModelBackend
    from autotune.fit import max_model_len_of

    assert isinstance(backend, ModelBackend)
    published = [d for d in specs if d.published]
    drafter = max(published, key=lambda d: d.num_layers, default=None)
    memory = predicted_fit(backend.model, drafter, backend.base_gpu, backend.tp, backend.params, concurrency,
                           max_model_len_of(workload))
    return [f"Memory (predicted from the catalog's sizes): {line}" for line in (memory.message, memory.warning)
            if line]


def _refuse_what_cannot_fit(backend: Backend, spaces: list[SearchSpace], scenarios: list[Scenario],
                            workload: Workload) -> None:
    """Check the memory fit once, before any trial: when even a scenario's smallest config (no speculation, its
    fewest sequences) does not fit, every trial there would fail, so refuse in one line with what fits instead
    (`autotune.fit`: the --tensor-parallel-size or --max-num-seqs; and catalog GPUs that hold it)."""
    from autotune.backends.model import ModelBackend
    from autotune.catalogs import list_gpus
    from autotune.spec import SpecConfig

    assert isinstance(backend, ModelBackend)
    for space, scenario in zip(spaces, scenarios, strict=True):
        smallest = SpecConfig(max_num_seqs=min(space.max_num_seqs), tensor_parallel_size=space.tensor_parallel_size)
        memory = backend.workload_fit(smallest, workload, scenario)
        if memory.fits:
            continue
        others = [g.key for g in list_gpus() if g.memory_gb > backend.base_gpu.memory_gb
                  and ModelBackend(backend.model, g, tp=backend.tp).workload_fit(smallest, workload, scenario).fits]
        instead = ""
        if others:
            instead = f", or --gpu {', '.join(others[:-1])} or {others[-1]}" if len(others) > 1 else \
                f", or --gpu {others[0]}"
        raise UsageError(f"Not searched, every trial at c={scenario.concurrency} would fail: "
                         f"{memory.message.rstrip('.')}{instead}.")


def plan_search(store: Store, options: SearchOptions) -> SearchPlan:
    """Resolve `options` into one search per concurrency. Raises UsageError (and BackendUnavailableError) before
    anything is measured."""
    from autotune.environment import detect_gpus
    from autotune.workloads import default_note, resolve_workload, summary_line

    objective = Objective(options.objective, options.slo_tpot_p99_ms, options.slo_ttft_p99_ms)
    if options.strategy != "auto":
        make_strategy(options.strategy, options.sampler)  # fail on a bad name before anything is resolved
    if options.trials is not None and options.trials < 1:
        raise UsageError(f"--trials must be >= 1, but got {options.trials}.")
    spec_space = resolve_space_spec(options)
    has_vllm = vllm_available()
    measuring = options.backend != "model" and has_vllm
    spec, target, problem = resolve_target(options.model, want_checkpoint=measuring)
    # The dataset is required where vLLM will measure by name; without vLLM the backend's own error comes first.
    workload, stood_in = resolve_workload(options.workload, required=options.backend == "vllm" and has_vllm,
                                          download=not options.no_download)
    notes: list[str] = []
    found, memory, max_model_len, counted = None, None, None, False
    gpus = detect_gpus() if measuring else []  # NVML, read once for the flag check, the fit and the device line
    if measuring:
        found = Checkpoints(target=target, problem=problem)
        _check_gpu_flag(options.gpu, gpus)
        if not found.problem:
            released = _drafter_specs(spec, spec_space.drafters, include_hypothetical=False)
            resolve_drafters([str(d.local_path or d.name) for d in released if d.published], found)
        if not found.problem:
            max_model_len, counted = workload_max_model_len(workload, found.target)
            memory = check_fit(
                found, gpus, seqs=max(options.concurrencies), tokens=max_model_len,
                tensor_parallel_size=options.tensor_parallel_size, gpu_memory_utilization=None,
                cpu_kv_cache_gib=EngineOptions().cpu_kv_cache_gib,
            )
    kind, why = choose_backend(options.backend, has_vllm=has_vllm, found=found, memory=memory,
                               no_download=options.no_download)
    backend, environment = _backend(kind, spec, options.gpu, notes, found, options.tensor_parallel_size,
                                    max_model_len)
    if kind == "vllm":
        assert found is not None
        notes.append(_device_line(environment, gpus))
        notes += [f"Checkpoint: {line}" for line in found.lines()]
        if memory is not None:
            notes.append(f"Memory: {memory.message}")
            if memory.warning:
                notes.append(f"Memory: {memory.warning}")
        if max_model_len is not None:
            how = "counted with the model's tokenizer" if counted else "estimated at 3 characters a token"
            notes.append(f"Every launch passes --max-model-len {max_model_len}: the workload's longest prompt "
                         f"({how}) plus its max_tokens, with headroom.")
    include = spec_space.include_hypothetical
    if include is None:
        # The catalog's drafters on a backend that predicts: their layer variants too, so 2 vs 4 layers is compared.
        # Drafters named with --drafter are searched as named.
        include = backend.capabilities.predicts and not spec_space.drafters
    specs = _drafter_specs(spec, spec_space.drafters, include)
    if backend.capabilities.predicts:
        specs = _predictable(specs, spec.name, notes)
    drafters = [_choice(d) for d in specs]
    in_launch = kind == "vllm" and not options.fresh_launches
    spaces = [build_space(spec_space, drafters, c, in_launch, options.tensor_parallel_size)
              for c in options.concurrencies]
    scenarios = [_scenario(kind, c, workload) for c in options.concurrencies]
    if kind == "model":
        _refuse_what_cannot_fit(backend, spaces, scenarios, workload)
        notes += _predicted_memory(backend, specs, workload, max(options.concurrencies))
    all_in_launch = False
    planned: dict[str, int] | None = None
    if in_launch:
        backend, planned = _in_launch(backend, spaces, scenarios, workload, notes)
        all_in_launch = planned["own"] == 0
    run_plan = _run_plan(options, kind, spec, backend, found, gpus, spec_space, specs, workload, planned)
    strategy = make_strategy(resolve_strategy(options.strategy, kind, options.sampler, all_in_launch),
                             options.sampler)
    hypothetical = [d.name for d in drafters if d.hypothetical]
    if hypothetical and not backend.capabilities.predicts:
        raise UsageError(
            f"Drafters {hypothetical} are hypothetical variants (--include-hypothetical or a `:N-layer` name): no "
            "checkpoint exists, so no engine can load them. Use --backend model, or drop them."
        )
    if hypothetical:
        notes.append(
            f"Also comparing HYPOTHETICAL drafters {', '.join(hypothetical)}: unreleased heads and layer variants "
            "whose acceptance is derived from the paper's layer ablation (P-EAGLE paper Tables 4 and 11). No "
            "checkpoint exists, so vLLM cannot serve them: they are recommended only when no released drafter "
            "qualifies."
        )
    notes.insert(0, f"Backend: {kind} ({why}).")
    # What the figures are of: the dataset, its prompts and lengths (counted with the target's tokenizer if measured).
    workload_detail = workload.summary(token_counter(found.target.local_dir) if kind == "vllm" and found else None)
    notes[1:1] = [summary_line(workload_detail)] + ([default_note(stood_in, kind == "vllm")] if stood_in else [])
    notes.append(f"Objective: {objective.describe()}; strategy: {strategy.name}.")
    storages: dict[str, Any] = {}  # opened once for every concurrency's search
    searches = [
        (
            Search(
                store=store, backend=backend, model=spec.name, device=environment["device"], workload=workload,
                space=space, objective=objective, strategy=strategy,
                n_trials=options.trials, seed=options.seed, study_prefix=options.study, storage_url=options.storage,
                heartbeat_interval=options.heartbeat, profile_concurrencies=tuple(options.concurrencies),
                storages=storages,
            ),
            scenario,
        )
        for scenario, space in zip(scenarios, spaces, strict=True)
    ]
    return SearchPlan(spec.name, workload, environment["device"], backend, objective, strategy, notes, environment,
                      searches, found if kind == "vllm" else None, options.no_download, planned, run_plan,
                      options=options, workload_detail=workload_detail)


def _run_plan(options: SearchOptions, kind: str, spec: Any, backend: Backend, found: Checkpoints | None,
              gpus: list[dict[str, Any]], spec_space: SpaceSpec, specs: list[Any], workload: Workload,
              planned: dict[str, int] | None) -> RunPlan | None:
    """The `RunPlan` of a measured search: this machine's (vllm), or the box of --gpu x --gpus (model backend:
    its published drafters, checkpoint sizes from the catalog, phases at the predicted throughput)."""
    from autotune.backends.model import ModelBackend
    from autotune.catalogs import get_gpu
    from autotune.errors import PeagleError
    from autotune.search.confirm import extra_confirmation_launches

    if kind == "vllm" and planned is None:
        return None  # --fresh-launches: one launch per config, as many as the strategy's trials
    tp = options.tensor_parallel_size
    found_ids = [str(g["index"]) for g in gpus]
    unknown = [i for i in options.gpus or [] if found_ids and i not in found_ids]
    if unknown:
        raise UsageError(f"--gpus {','.join(unknown)}: NVML finds GPUs {', '.join(found_ids)}; pick among those.")
    groups, idle = worker_groups(options.gpus or found_ids or [str(i) for i in range(tp)], tp)
    if kind == "model":  # a measured search measures the drafters the model backend cannot predict too
        specs = _drafter_specs(spec, spec_space.drafters, include_hypothetical=False)
    published = [d for d in specs if d.published]
    spaces = [build_space(spec_space, [_choice(d) for d in published], c, True, tp) for c in options.concurrencies]
    scenarios = [_scenario("vllm", c, workload) for c in options.concurrencies]
    predictor: Any = backend if isinstance(backend, ModelBackend) else None
    if kind == "vllm":
        assert found is not None and planned is not None
        rows = checkpoint_rows(found)
        sizes: dict[str | None, float] = {None: found.target.weight_bytes or 0}
        sizes.update({n: c.weight_bytes or 0 for n, c in found.drafters.items()})
        confirmations = planned["confirmation"] + planned["confirmation_graphs"]
        if gpus:
            try:
                predictor = ModelBackend(spec, get_gpu(str(gpus[0]["name"])), tp=tp)
            except PeagleError:
                predictor = None
        device = f"{len(gpus)} x {gpus[0]['name']}" if gpus else "CPU"
    else:
        assert isinstance(backend, ModelBackend)
        rows = catalog_rows(spec, published, backend.params)
        sizes = {None: rows[0]["weight_bytes"]}
        sizes.update({r["name"]: r["weight_bytes"] for r in rows[1:]})
        below = [sum(1 for c in sp.grid() if c.speculative and c.k < sp.k_max) for sp in spaces]
        confirmations = len(scenarios) + extra_confirmation_launches("FULL_AND_PIECEWISE", below)
        device = f"{sum(map(len, groups)) + len(idle)} x {backend.base_gpu.display_name}"

    def predict(config: SpecConfig, scenario: Scenario) -> float | None:
        """Predicted tokens/s; a drafter without published acceptance at no speculation's (an upper bound on time)."""
        for c in (config, SpecConfig(max_num_seqs=config.max_num_seqs, tensor_parallel_size=tp)):
            try:
                m = predictor.measure(c, workload, scenario) if predictor else None
            except PeagleError:
                continue
            if m is not None and m.ok and m.output_tokens_per_s:
                return m.output_tokens_per_s
        return None

    on_gpu = bool(gpus) or kind == "model"
    units = launch_units(spaces, scenarios, workload, sizes, on_gpu, confirmations, predict)
    source = (f"the model backend's predicted throughput ({predictor.device}; no speculation's for a drafter "
              "without published acceptance)") if predictor is not None else None
    return RunPlan(device, groups, idle, on_gpu, rows, units, source)


def run_search(store: Store, options: SearchOptions, run_scenario: ScenarioRunner | None = None) -> SearchRun:
    """`plan_search` and run it (for callers that show nothing before the search)."""
    return plan_search(store, options).run(run_scenario)
