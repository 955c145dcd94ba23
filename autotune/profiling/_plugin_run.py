"""`run_plugin_job`: one engine launch with the scheduler plugin, its statistics read back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.engine import EngineOptions, measured_provenance, plugin_async_scheduling, run_directory, run_worker
from autotune.measurement import FailureKind, Provenance
from autotune.workloads import WorkloadRequest
from policies.plugin import CONFIG_ENV, DepthPlan, PluginConfig, PluginStats
from policies.plugin import engine_kwargs as plugin_engine_kwargs
from policies.plugin.config import engine_env as plugin_engine_env

#: The job module profiling launches run on the engine's worker harness.
PROFILE_JOB = "autotune.profiling._worker"
#: Decode steps a warm-up runs at each shape: the first use compiles (a Triton kernel per power-of-two width on a
#: GPU, `_eagle_prepare_next_token_padded` is warmed at start-up for width K_max + 1 only:
#: ``vllm/v1/spec_decode/llm_base_proposer.py`` 149-153, ``vllm/v1/spec_decode/utils.py`` 318-340), the second runs
#: as measured steps do.
WARMUP_DECODE_STEPS = 2

Progress = Callable[[str], None]


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


def _warm_requests(pool: Sequence[tuple[str, WorkloadRequest]], count: int, tokens: int) -> list[dict[str, Any]]:
    return [{"class": c, **r.to_dict(), "max_tokens": tokens} for c, r in (pool[i % len(pool)] for i in range(count))]


def shape_warmup(
    pool: Sequence[tuple[str, WorkloadRequest]], concurrencies: Iterable[int], depths: Iterable[int]
) -> list[dict[str, Any]]:
    """Warm-up phases (the worker's ``warmup``) that run every (depth K, batch size B) a static-depth launch measures
    (in-launch search: every K of the space at every scenario's concurrency; 0: no speculation) before its first
    measured phase, so no first use lands in a figure.

    Per (K, B): B requests of `pool` (its first ones, repeated if short) in flight at once, capped at depth K
    (``peagle_max_k``) and cut to K + 1 + WARMUP_DECODE_STEPS tokens, run with ``ignore_eos``: the prefill emits one
    token and a decode step at most K + 1, so each request runs at least 2 decode steps at width K (at most K + 2
    when nothing is accepted). Cost: sum over shapes of B x (K + 3) tokens, e.g. K in 1..8 at B in (1, 4, 16):
    21 x 60 = 1,260 tokens in 2 to 10 steps per shape.

    Example: ``shape_warmup(pool, [1, 4], [0, 2])`` gives 4 phases: (K 0, B 1) 1 request x 3 tokens, (K 2, B 1)
    1 x 5, (K 0, B 4) 4 x 3 and (K 2, B 4) 4 x 5.
    """
    phases = []
    for b in sorted(set(concurrencies)):
        for k in sorted(set(depths)):
            tokens = k + 1 + WARMUP_DECODE_STEPS
            phases.append({"concurrency": b, "max_k": k or None, "requests": _warm_requests(pool, b, tokens)})
    return phases


def plan_warmup(
    pool: Sequence[tuple[str, WorkloadRequest]], concurrencies: Iterable[int], plan: DepthPlan
) -> list[dict[str, Any]]:
    """Warm-up phases for a launch whose plugin follows `plan` (profiling): the plan, not a cap, sets each step's
    depth, cycling through its depths separately for every batch size (`policies.PlanClock`), so every depth runs at
    batch size B once the plan has run one cycle there. Caps only lower a depth, so the warm-up cannot pin one.

    Per B: B requests of `pool` in flight, uncapped, with ignore_eos, each with the most tokens one cycle can emit
    plus two (1 + block_steps x sum of (depth + 1) over the plan's depths + 1), so they run at least one whole cycle
    of decode steps at B. Cost: B x that many tokens per concurrency, e.g. ``DepthPlan.sweep(8)`` (64 steps a cycle):
    434 tokens per request, 21 x 434 = 9,114 tokens for B in (1, 4, 16), in 65 to 433 steps per B.
    """
    tokens = 2 + plan.block_steps * sum(d + 1 for d in plan.depths)
    return [{"concurrency": b, "requests": _warm_requests(pool, b, tokens)} for b in sorted(set(concurrencies))]


def warmup_cost(warmup: Sequence[Mapping[str, Any]]) -> str:
    """The warm-up's size in words, e.g. "6 shapes, 18 requests x 3 to 11 tokens (96 tokens)"."""
    sizes = [int(r["max_tokens"]) for phase in warmup for r in phase["requests"]]
    if not sizes:
        return "no warm-up"
    span = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)} to {max(sizes)}"
    return (f"{len(warmup)} shape{'s' if len(warmup) != 1 else ''}, {len(sizes)} requests x {span} tokens "
            f"({sum(sizes):,} tokens)")


def plugin_provenance(engine_kwargs: Mapping[str, Any], options: EngineOptions | None = None) -> Provenance:
    """The provenance of what `run_plugin_job` measures with these ``LLM(...)`` arguments and engine options: this
    machine's vLLM, and the model runner, CUDA-graph mode, async scheduling and deployment of such a launch."""
    options = options or EngineOptions()
    env = options.process_env(plugin_engine_env())
    return measured_provenance(plugin_launch_kwargs(engine_kwargs, env), env)


def plugin_launch_kwargs(engine_kwargs: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``engine_kwargs`` with the plugin installed, scheduling as vLLM would for the launch
    (`autotune.engine.plugin_async_scheduling`: async on a GPU; ``async_scheduling=False`` among ``engine_kwargs``
    forces synchronous scheduling)."""
    async_scheduling = plugin_async_scheduling(engine_kwargs, env)
    return {**dict(engine_kwargs), **plugin_engine_kwargs(async_scheduling=async_scheduling)}


def run_plugin_job(
    model: str,
    engine_kwargs: Mapping[str, Any],
    phases: Sequence[Mapping[str, Any]],
    plugin: PluginConfig,
    *,
    warmup: Sequence[Mapping[str, Any]] = (),
    return_outputs: bool = False,
    options: EngineOptions | None = None,
    log_dir: str | Path | None = None,
    progress: Progress | None = None,
    turns: Mapping[str, str] | None = None,
    **engine_options: Any,
) -> EngineRun:
    """Launch vLLM once in a subprocess with the scheduler plugin configured by ``plugin`` and run ``phases``.

    ``engine_kwargs``: ``LLM(...)`` arguments (the plugin's ``scheduler_cls``/``async_scheduling`` are added,
    `plugin_launch_kwargs`, and its engine environment: V1 model runner, `policies.plugin.config.engine_env`).
    ``phases``: [{"name", "concurrency", "requests": [{"class", "prompt" or "messages", "max_tokens", ...}]}], each
    run closed-loop at its concurrency; requests carry their class and the phase name to the plugin.
    ``options`` / ``engine_options``: the launch's `autotune.engine.EngineOptions` (env, timeout_s, ignore_eos, ...;
    their engine arguments are already in ``engine_kwargs``).
    ``warmup``: phases of the same form run first and in no figure (`shape_warmup`, `plan_warmup`).
    ``plugin.stats_path`` is set to a file in the run directory (written in the step that leaves the engine idle).
    Failures come back classified (invalid_config, out_of_memory, engine_died, timeout, stalled) as for the vllm
    backend; a plugin that fell back is a failure too. ``turns``: the launch takes turns with another one, phase by
    phase (`autotune.profiling._turns.Turns.to_job`).
    """
    options = EngineOptions.build(options, **engine_options)
    with run_directory(log_dir, "ptune-run-") as run_dir:
        stats_path = run_dir / "plugin-stats.json"
        # The job's process ends right after its last request (the harness stops the engine core at once), so the
        # file is written in the step that ends each burst, complete when the outputs arrive.
        config = PluginConfig.from_dict({**plugin.to_dict(), "stats_path": str(stats_path), "idle_write_delay_s": 0})
        config_path = config.save(run_dir / "plugin.json")
        job = {
            "model": model,
            "engine_kwargs": plugin_launch_kwargs(engine_kwargs, options.process_env(plugin_engine_env())),
            "phases": [dict(p) for p in phases],
            "warmup": [dict(r) for r in warmup],
            "ignore_eos": options.ignore_eos,
            "return_outputs": return_outputs,
        }
        if turns is not None:
            job["turns"] = dict(turns)
        launch = run_worker(
            PROFILE_JOB, job, run_dir, options, extra_env={CONFIG_ENV: str(config_path), **plugin_engine_env()},
            progress=progress,
        )
        failure = launch.failure()
        if failure is not None:
            return EngineRun(False, launch.raw, None, *failure, launch.log_tail, launch.total_s)
        try:
            stats = PluginStats.load(stats_path)
        except ValueError as exc:
            reason = f"the scheduler plugin wrote no statistics ({exc}); the engine itself ran, see log_tail."
            return EngineRun(False, launch.raw, None, "engine_died", reason, launch.log_tail, launch.total_s)
    if stats.fallback:
        reason = (
            "the scheduler plugin fell back to static depth (" + "; ".join(stats.errors) + "); the engine itself "
            "ran, see log_tail."
        )
        return EngineRun(False, launch.raw, stats, "engine_died", reason, launch.log_tail, launch.total_s)
    return EngineRun(True, launch.raw, stats, log_tail=launch.log_tail, total_s=launch.total_s)
