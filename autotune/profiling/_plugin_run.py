"""`run_plugin_job`: one engine launch with the scheduler plugin, its statistics read back."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.engine import EngineOptions, measured_provenance, run_directory, run_worker
from autotune.measurement import FailureKind, Provenance
from policies.plugin import CONFIG_ENV, PluginConfig, PluginStats
from policies.plugin import engine_kwargs as plugin_engine_kwargs
from policies.plugin.config import engine_env as plugin_engine_env

#: The job module profiling launches run on the engine's worker harness.
PROFILE_JOB = "autotune.profiling._worker"

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


def plugin_provenance(engine_kwargs: Mapping[str, Any], options: EngineOptions | None = None) -> Provenance:
    """The provenance of what `run_plugin_job` measures with these ``LLM(...)`` arguments and engine options: this
    machine's vLLM, and the model runner, CUDA-graph mode and async scheduling of such a launch."""
    options = options or EngineOptions()
    return measured_provenance({**dict(engine_kwargs), **plugin_engine_kwargs()},
                               options.process_env(plugin_engine_env()))


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

    ``engine_kwargs``: ``LLM(...)`` arguments (the plugin's ``scheduler_cls``/``async_scheduling`` are added, and
    its engine environment: V1 model runner, `policies.plugin.config.engine_env`).
    ``phases``: [{"name", "concurrency", "requests": [{"class", "prompt" or "messages", "max_tokens", ...}]}], each
    run closed-loop at its concurrency; requests carry their class and the phase name to the plugin.
    ``options`` / ``engine_options``: the launch's `autotune.engine.EngineOptions` (env, timeout_s, ignore_eos, ...;
    their engine arguments are already in ``engine_kwargs``).
    ``plugin.stats_path`` is set to a file in the run directory (written in the step that leaves the engine idle).
    Failures come back classified (invalid_config, out_of_memory, engine_died, timeout) as for the vllm backend; a
    plugin that fell back is a failure too. ``turns``: the launch takes turns with another one, phase by phase
    (`autotune.profiling._turns.Turns.to_job`).
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
            "engine_kwargs": {**dict(engine_kwargs), **plugin_engine_kwargs()},
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
