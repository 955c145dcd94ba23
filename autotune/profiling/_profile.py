"""`profile`: one engine launch per drafter measures acceptance per class and position and the step cost T(B, K).

Each launch runs vLLM at K_max in a subprocess (``python -m autotune.profiling._worker``) with the scheduler plugin
in "plan" mode (`policies.plugin.DepthPlan.sweep`): the verified depth cycles through 0..K_max (every other
block at K_max) separately for every batch size, while the workload runs closed-loop at each concurrency. From the
plugin's statistics:

- acceptance per workload class and draft position, from the requests that verified K_max drafts (measured counts;
  AL(K) for K <= K_max by prefix consistency), cross-checked against vLLM's own spec-decode counters;
- step-cost samples T(B, K): the median decode-step time per (batch size, verified depth) (measured);
- a fitted `policies.StepCostModel` and its fit error (predicted vs measured on the same samples);
- the mean decode-step time per shape too (measured; what a run pays per step, kept for the simulator, which prices
  steps with the same model refitted on them: `autotune.simulate.mean_cost_model`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from autotune.catalogs import DrafterSpec, get_drafter
from autotune.engine import EngineOptions, measured_provenance, require_vllm, spec_delta
from autotune.environment import detect_environment
from autotune.errors import BackendUnavailableError, ConfigError
from autotune.profiling._analysis import (
    acceptance_per_class,
    first_phase_outliers,
    fit_cost_model,
    metrics_check,
    outlier_warning,
    phase_totals,
)
from autotune.profiling._memory import launch_memory
from autotune.profiling._plugin_run import (
    EngineRun,
    plan_warmup,
    plugin_provenance,
    run_plugin_job,
    shape_warmup,
    warmup_cost,
)
from autotune.profiling._result import ProfileResult, store_profile
from autotune.profiling._turns import Turns, take_turns
from autotune.spec import MAX_K, Method, SpecConfig
from autotune.workloads import Workload, WorkloadRequest
from policies import StepSample
from policies._graphs import full_graph_depth
from policies.plugin import DepthPlan, PluginConfig, PluginStats

DEFAULT_CONCURRENCIES: tuple[int, ...] = (1, 4, 16)
DEFAULT_MAX_K = 8
#: A prompt fully in the prefix cache is scheduled as a padded decode with placeholder drafts, which would blur the
#: acceptance counts; profiling prompts repeat across phases, so the cache stays off (unless engine_extra says so).
_ENGINE_DEFAULTS = {"enable_prefix_caching": False}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class _Drafter:
    name: str
    method: Method
    parallel_drafting: bool
    layers: int | None


@dataclass(frozen=True)
class _Launches:
    """What every launch of one `profile` call shares."""

    model: str
    phases: list[dict[str, Any]]
    pool: list[tuple[str, WorkloadRequest]]
    """The workload's requests, classes interleaved: what the warm-up runs."""
    concurrencies: tuple[int, ...]
    max_num_seqs: int
    options: EngineOptions
    log_dir: Path | None
    say: Progress

    def engine_kwargs(self, config: SpecConfig) -> dict[str, Any]:
        """``LLM(...)`` arguments of a launch serving `config` (the plugin's are added by `run_plugin_job`)."""
        return self.options.llm_kwargs(config, max_num_seqs=self.max_num_seqs, defaults=_ENGINE_DEFAULTS)

    def run(
        self, config: SpecConfig, plugin: PluginConfig, return_outputs: bool = False, turns: Turns | None = None
    ) -> EngineRun:
        """One launch serving `config` (at the largest concurrency's batch size) with the plugin in `plugin`'s mode;
        ``turns``: taking turns with another launch, phase by phase (`side_by_side`)."""
        kwargs = self.engine_kwargs(config)
        say = self.say if turns is None else (lambda line: self.say(f"[{turns.name}] {line}"))
        # A plan sets each step's depth (every depth at every batch size once it has cycled there); a static launch
        # runs its one depth.
        if plugin.mode == "plan" and plugin.plan is not None:
            warmup = plan_warmup(self.pool, self.concurrencies, plugin.plan)
        else:
            warmup = shape_warmup(self.pool, self.concurrencies, (config.k if config.speculative else 0,))
        say(f"      warm-up before the measured phases: {warmup_cost(warmup)}")
        return run_plugin_job(
            self.model, kwargs, self.phases, plugin, warmup=warmup, return_outputs=return_outputs,
            options=self.options, log_dir=self.log_dir, progress=say,
            turns=None if turns is None else turns.to_job(),
        )

    def side_by_side(
        self, config: SpecConfig, plugin: PluginConfig, return_outputs: bool
    ) -> tuple[EngineRun, EngineRun]:
        """(no speculation, `config`): both launches resident at once, taking turns phase by phase
        (`autotune.profiling._turns`), so the two never compare steps measured minutes apart."""
        names = ("baseline", "speculative")
        with tempfile.TemporaryDirectory(prefix="ptune-turns-") as tmp, \
                ThreadPoolExecutor(len(names), thread_name_prefix="ptune-launch") as pool:
            turns = {name: Turns(Path(tmp), name) for name in names}
            futures = {
                "baseline": pool.submit(self.run, SpecConfig(), PluginConfig(mode="static"), False, turns["baseline"]),
                "speculative": pool.submit(self.run, config, plugin, return_outputs, turns["speculative"]),
            }
            first_out = take_turns(Path(tmp), names, len(self.phases), lambda name: not futures[name].done())
            base, spec = futures["baseline"].result(), futures["speculative"].result()
        if first_out == "baseline" or (spec.ok and not (base.ok and base.stats is not None)):
            # The speculative launch's steps mean nothing without the baseline's beside them: fail with its cause.
            spec = dataclasses.replace(
                spec, ok=False, failure_kind=base.failure_kind or "engine_died", log_tail=base.log_tail,
                failure_reason=f"the no-speculation launch beside it failed: {base.failure_reason}",
            )
        return base, spec


def _resolve_drafter(drafter: DrafterSpec | str, method: str | None, parallel: bool | None) -> _Drafter:
    spec = drafter if isinstance(drafter, DrafterSpec) else get_drafter(drafter)
    name = spec.local_path or spec.name
    chosen = method or spec.method
    if chosen not in ("eagle3", "eagle", "draft_model"):
        raise ConfigError(f"method must be eagle3, eagle or draft_model for profiling, but got {chosen!r}.")
    pd = spec.parallel_drafting if parallel is None else parallel
    if pd and not spec.parallel_drafting and spec.local_path:
        raise ConfigError(
            f"parallel drafting needs a mask token (pard_token, mask_token_id or ptd_token_id) in the drafter's "
            f"config.json, but {name} has none. Add one or pass parallel_drafting=False."
        )
    return _Drafter(name, cast(Method, chosen), bool(pd), spec.num_layers)


def _phase_requests(
    workload: Workload, concurrencies: Sequence[int], num_prompts: int | None, rounds: int
) -> list[dict[str, Any]]:
    """Closed-loop phases: per concurrency c, ``num_prompts`` requests (default: every request of the workload, at
    least 8 per in-flight slot), split into ``rounds`` phases that alternate between concurrencies (c1, c4, c16, c1,
    c4, c16, ...), so slow drifts of the machine (other load, clocks) spread over every batch size."""
    pool = workload.requests()
    per_c = {c: num_prompts if num_prompts is not None else max(len(pool), 8 * c) for c in concurrencies}
    phases = []
    for r in range(rounds):
        for c in concurrencies:
            lo, hi = per_c[c] * r // rounds, per_c[c] * (r + 1) // rounds
            if hi <= lo:
                continue
            reqs = [{"class": cls, **req.to_dict()} for cls, req in (pool[i % len(pool)] for i in range(lo, hi))]
            phases.append({"name": f"c{c}", "concurrency": c, "requests": reqs})
    return phases


def profile(
    model: str,
    drafters: Sequence[DrafterSpec | str],
    workload: Workload,
    *,
    concurrencies: Sequence[int] = DEFAULT_CONCURRENCIES,
    max_k: int = DEFAULT_MAX_K,
    store: Any = None,
    model_name: str | None = None,
    method: str | None = None,
    parallel_drafting: bool | None = None,
    num_prompts: int | None = None,
    block_steps: int = 4,
    rounds: int = 2,
    baseline: bool = False,
    side_by_side: bool = False,
    return_outputs: bool = False,
    options: EngineOptions | None = None,
    log_dir: str | Path | None = None,
    progress: Progress | None = None,
    **engine_options: Any,
) -> list[ProfileResult]:
    """Profile each drafter with ONE engine launch at K = ``max_k``; store each successful profile in ``store``.

    Args:
        model: target model id or local path (what vLLM loads). ``model_name``: the name to store it under
            (default: ``model``).
        drafters: catalog drafters or local drafter directories; ``method`` / ``parallel_drafting`` override what
            the drafter's spec says (e.g. "draft_model" for a PARD drafter).
        workload: the prompts, by class. Each concurrency runs ``num_prompts`` requests closed-loop (default: every
            request of the workload, at least 8 per in-flight slot), in ``rounds`` parts alternating between
            concurrencies.
        baseline: also launch the target once without speculation (shared by all drafters) and fit each cost
            model on those steps too; without it, every measured step ran the drafter, so the cost of a step
            without any drafter (the no-speculation baseline) is not identified. One more launch.
        concurrencies: requests in flight per phase; the engine's max_num_seqs is the largest.
            Before its measured phases each launch warms every shape it measures, in no figure: one plan cycle at
            every concurrency (`plan_warmup`; the baseline: `shape_warmup` at depth 0). A first phase slower than
            the later ones at its concurrency is reported (``ProfileResult.first_phase_outliers``, a warning line).
        block_steps: steps per depth block of the plan (see `DepthPlan.sweep`).
        options: how vLLM is launched (`autotune.engine.EngineOptions`, the same object `VLLMBackend.options`
            holds); `engine_options` change single fields (``dtype="float32"``, ``timeout_s=600``, ``env=...``).
        progress: called with one line per event (launch, phase marks, result).

    Returns one `ProfileResult` per drafter, in order; a failed launch gives ``ok=False`` with a failure kind
    (invalid_config, out_of_memory, engine_died, timeout, stalled) and reason, never an exception.
    Raises BackendUnavailableError without vLLM and ConfigError for invalid arguments.
    """
    require_vllm("Profiling runs a real engine and")
    if isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= MAX_K:
        raise ConfigError(f"max_k must be an integer in [1, {MAX_K}], but got {max_k!r}.")
    concurrencies = tuple(sorted(set(int(c) for c in concurrencies)))
    if not concurrencies or concurrencies[0] < 1:
        raise ConfigError(f"concurrencies must be integers >= 1, e.g. 1,4,16, but got {list(concurrencies)}.")
    if not drafters:
        raise ConfigError("profile needs at least one drafter (catalog name or local directory).")
    if len(workload) == 0:
        raise ConfigError(f"Workload {workload.name!r} has no requests to profile.")
    if num_prompts is not None and num_prompts < 1:
        raise ConfigError(f"num_prompts must be >= 1, but got {num_prompts}.")
    if rounds < 1:
        raise ConfigError(f"rounds must be >= 1, but got {rounds}.")
    if side_by_side and not baseline:
        raise ConfigError("side_by_side (--side-by-side) runs the no-speculation baseline beside each drafter: "
                          "pass baseline=True (--baseline) too.")
    say = progress or (lambda _line: None)
    resolved = [_resolve_drafter(d, method, parallel_drafting) for d in drafters]
    phases = _phase_requests(workload, concurrencies, num_prompts, rounds)
    launch_options = launch_memory(EngineOptions.build(options, **engine_options), model, [d.name for d in resolved],
                                   workload, max(concurrencies), side_by_side, say)
    launches = _Launches(
        model, phases, workload.requests(), concurrencies, max(concurrencies), launch_options,
        Path(log_dir) if log_dir is not None else None, say,
    )
    baseline_samples: list[StepSample] = []
    baseline_means: list[StepSample] = []
    prompt_steps: dict[str, list[dict[str, Any]]] = {}
    if baseline and not side_by_side:
        say(f"[0/{len(resolved)}] launching vLLM without speculation (baseline step times)")
        baseline_samples, baseline_means, prompt_steps["baseline"] = _baseline(launches)
    template = ProfileResult(
        model=model_name or model, drafter="", method="", parallel_drafting=False, max_k=max_k,
        concurrencies=concurrencies, provenance=measured_provenance(), plan=DepthPlan.sweep(max_k, block_steps),
        workload_name=workload.name, workload_hash=workload.content_hash(), baseline_samples=baseline_samples,
        baseline_means=baseline_means, prompt_steps=prompt_steps,
    )
    results = []
    for i, drafter in enumerate(resolved, start=1):
        say(f"[{i}/{len(resolved)}] launching vLLM for drafter {drafter.name} ({drafter.method}"
            f"{', parallel drafting' if drafter.parallel_drafting else ''}, K_max={max_k})"
            + (" beside one without speculation, taking turns" if side_by_side else ""))
        result = _profile_one(launches, drafter, template, return_outputs, side_by_side)
        if result.ok and store is not None:
            result.profile_id = store_profile(store, result, workload, detect_environment())
            say(f"      stored profile #{result.profile_id}")
        results.append(result)
    return results


def _baseline(launches: _Launches) -> tuple[list[StepSample], list[StepSample], list[dict[str, Any]]]:
    """Step times of the target without speculation (the plugin in static mode only records them): decode steps'
    median and mean per shape, and the steps with prompt tokens per phase."""
    run = launches.run(SpecConfig(), PluginConfig(mode="static"))
    if not run.ok or run.stats is None:
        raise BackendUnavailableError(
            f"The no-speculation baseline launch failed ({run.failure_kind}): {run.failure_reason}\n{run.log_tail}"
        )
    return _baseline_samples(launches, run)


def _baseline_samples(
    launches: _Launches, run: EngineRun
) -> tuple[list[StepSample], list[StepSample], list[dict[str, Any]]]:
    assert run.stats is not None
    measured = sorted({p["name"] for p in launches.phases})
    samples: list[StepSample] = run.stats.step_samples(measured)
    launches.say(f"      baseline: {len(samples)} step-time samples in {run.total_s:.0f} s")
    return samples, run.stats.step_samples(measured, statistic="mean"), run.stats.prompt_steps(measured)


def _profile_one(
    launches: _Launches, drafter: _Drafter, template: ProfileResult, return_outputs: bool, side_by_side: bool
) -> ProfileResult:
    result = dataclasses.replace(
        template,
        drafter=drafter.name,
        method=drafter.method,
        parallel_drafting=drafter.parallel_drafting,
        drafter_layers=drafter.layers,
        baseline_samples=list(template.baseline_samples),
        baseline_means=list(template.baseline_means),
        prompt_steps=dict(template.prompt_steps),
    )
    max_k = result.max_k
    config = SpecConfig(drafter.method, drafter.name, max_k, drafter.parallel_drafting)
    result.provenance = plugin_provenance(launches.engine_kwargs(config), launches.options)
    assert result.plan is not None
    plugin = PluginConfig(mode="plan", plan=result.plan)
    if side_by_side:
        base, run = launches.side_by_side(config, plugin, return_outputs)
        if run.ok:
            result.baseline_samples, result.baseline_means, result.prompt_steps["baseline"] = _baseline_samples(
                launches, base
            )
    else:
        run = launches.run(config, plugin, return_outputs)
    result.timings = {"total_s": run.total_s, **(run.result.get("timings") or {})}
    if not run.ok or run.stats is None:
        result.ok, result.failure_kind, result.failure_reason = False, run.failure_kind, run.failure_reason
        result.log_tail = run.log_tail
        launches.say(f"      failed ({run.failure_kind}): {run.failure_reason}")
        return result
    _analyse(result, run.stats, run.result, sequential=not drafter.parallel_drafting)
    for outlier in result.first_phase_outliers:
        launches.say(f"      {outlier_warning(outlier)}")
    mismatch = counts_mismatch(result.metrics_check)
    if mismatch is not None:
        result.ok, result.failure_kind, result.failure_reason = False, "counts_mismatch", mismatch
        result.log_tail = run.log_tail
        launches.say(f"      failed (counts_mismatch): {mismatch}")
    if return_outputs:
        result.outputs = run.result.get("outputs")
    launches.say(f"      done in {run.total_s:.0f} s (engine load {result.timings.get('load_s', 0):.0f} s)")
    return result


def counts_mismatch(check: Mapping[str, Any] | None) -> str | None:
    """Why a launch's profile must not be used, or None: the scheduler plugin's counters must equal vLLM's
    ``vllm:spec_decode_*`` over the measured phases (`metrics_check`); fewer means the plugin's statistics lost steps,
    and acceptance and step costs fitted on them would misstate the drafter.

    Example: ``counts_mismatch({"match": True, ...}) is None``; with plugin 570 drafts against vLLM's 1125 it says so.
    """
    if check is None or check.get("match"):
        return None
    plugin, vllm = check.get("plugin") or {}, check.get("vllm") or {}
    return (
        f"the scheduler plugin counted {plugin.get('num_drafts')} drafts and {plugin.get('num_accepted_tokens')} "
        f"accepted tokens where vLLM's spec-decode counters counted {vllm.get('num_drafts')} and "
        f"{vllm.get('num_accepted_tokens')}, so the acceptance and step costs of this launch are incomplete and the "
        "profile is not stored; run the profile again, and if it happens again report it with the engine log"
    )


def _analyse(result: ProfileResult, stats: PluginStats, raw: Mapping[str, Any], sequential: bool) -> None:
    measured = sorted({p["name"] for p in raw["phases"]})
    result.acceptance = acceptance_per_class(stats, result.max_k, measured)
    result.step_samples = stats.step_samples(measured, sequential=sequential)
    result.step_means = stats.step_samples(measured, sequential=sequential, statistic="mean")
    result.prompt_steps["speculative"] = stats.prompt_steps(measured)
    # On a GPU with FULL graphs the launch's steps below its K ran PIECEWISE; the baseline launch's are FULL.
    full = full_graph_depth(stats.info.get("cudagraph_mode"), int(stats.info.get("num_speculative_tokens") or 0))
    baseline = [dataclasses.replace(s, piecewise=False) for s in result.baseline_samples]
    model = fit_cost_model(result.step_samples + baseline, sequential=sequential, full_graph_depth=full)
    result.cost_model = model
    result.fit_error = None if model is None else model.fit_error()
    result.metrics_check = metrics_check(
        phase_totals(stats, measured), spec_delta(raw["spec_before"], raw["spec_after"])
    )
    result.warmup = list(raw.get("warmup") or [])
    result.first_phase_outliers = first_phase_outliers(raw["phases"])
    per_c: dict[int, dict[str, Any]] = {}
    for p in raw["phases"]:
        entry = per_c.setdefault(
            int(p["concurrency"]),
            {"name": p["name"], "concurrency": int(p["concurrency"]), "num_requests": 0, "output_tokens": 0,
             "wall_s": 0.0},
        )
        entry["num_requests"] += int(p["num_requests"])
        entry["output_tokens"] += int(p["output_tokens"])
        entry["wall_s"] += float(p["wall_s"])
    result.phases = [
        {**p, "output_tokens_per_s": p["output_tokens"] / p["wall_s"] if p["wall_s"] > 0 else None}
        for _, p in sorted(per_c.items())
    ]
    result.plugin = {
        **stats.info,
        "overhead_ms": stats.overhead_ms,
        "steps": stats.steps,
        "decode_steps": stats.decode_steps,
    }
