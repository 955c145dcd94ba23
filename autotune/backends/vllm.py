"""The vllm backend: measures one speculative config on a real vLLM engine (GPU, or the CPU build).

Every measurement runs a fresh engine in its own process group through `autotune.engine` (the offline worker
``LLM.generate``, or ``vllm serve`` plus a streaming client in serve mode) with a timeout that kills the whole group,
so engine memory is released and a crash cannot take the tuner down. Failures come back as
``Measurement.failed(...)`` with a kind (invalid_config, out_of_memory, engine_died, timeout, stalled), a one-line
reason and the engine log's tail. This module only checks configs, builds the job and turns the engine's report into a
`Measurement`.

vLLM and torch are never imported here; only the engine processes import them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from autotune.backends.base import Backend, Capabilities
from autotune.engine import (
    MASK_TOKEN_KEYS,
    OFFLINE_JOB,
    EngineOptions,
    add_positions,
    looks_local,
    mask_token,
    measured_provenance,
    model_config_json,
    require_vllm,
    run_directory,
    run_serve,
    run_worker,
    vllm_available,
)
from autotune.environment import detect_environment
from autotune.errors import ConfigError
from autotune.measurement import FailureKind, Measurement, Provenance, SpecCounters
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest

__all__ = ["Mode", "VLLMBackend", "select_requests", "sum_counters", "vllm_available"]

Mode = Literal["offline", "serve"]


class VLLMBackend(Backend):
    """Measures configs on a real vLLM engine, one fresh engine (subprocess) per measurement.

    Args:
        model: target model id or local path.
        mode: "offline" (``LLM.generate`` in a worker process; engine-clock latencies) or "serve" (``vllm serve``
            plus a streaming HTTP client; client-clock latencies, supports open-loop ``Scenario.request_rate``).
        options: how the engine is launched (`autotune.engine.EngineOptions`: dtype, max_model_len, load_format,
            engine_extra, env, cpu_kv_cache_gib, timeout_s, ignore_eos); `engine_options` change single fields of it
            (``VLLMBackend(m, dtype="float32", timeout_s=600)``).
        warmup_requests: requests (the workload's first ones, cut to 16 tokens) run before the measured phase.
        speculative_extra: extra keys merged into the speculative config (e.g. a batch-size -> K schedule).
        return_outputs: put generated token ids and texts per request in ``extra["outputs"]`` (class -> list).
        log_dir: keep each run's engine log there (path in ``extra["log_path"]``); default: a deleted temp dir.
    """

    name = "vllm"
    capabilities = Capabilities(launches_engines=True)

    def __init__(
        self,
        model: str,
        *,
        mode: Mode = "offline",
        options: EngineOptions | None = None,
        warmup_requests: int = 2,
        speculative_extra: Mapping[str, Any] | None = None,
        return_outputs: bool = False,
        log_dir: str | Path | None = None,
        **engine_options: Any,
    ) -> None:
        if mode not in ("offline", "serve"):
            raise ConfigError(f"mode must be 'offline' or 'serve', but got {mode!r}.")
        if warmup_requests < 0:
            raise ConfigError(f"warmup_requests must be >= 0, but got {warmup_requests}.")
        self.model = model
        self.mode: Mode = mode
        self.options: EngineOptions = EngineOptions.build(options, **engine_options)
        self.warmup_requests = warmup_requests
        self.speculative_extra = dict(speculative_extra or {})
        self.return_outputs = return_outputs
        self.log_dir = Path(log_dir) if log_dir is not None else None

    @property
    def target_model(self) -> str:
        return self.model

    # -- validation --

    def validate(self, config: SpecConfig) -> None:
        """Reject, before any engine starts, configs vLLM is known to refuse. Raises ConfigError.

        Checked: a local drafter path exists; parallel drafting has a mask token in the drafter's config.json.
        """
        if not config.speculative or config.drafter is None:
            return
        drafter = config.drafter
        if looks_local(drafter) and not Path(drafter).expanduser().is_dir():
            raise ConfigError(
                f"Drafter {drafter!r} looks like a local path but is not a directory; pass an existing model "
                "directory or a Hugging Face model id."
            )
        if not config.parallel_drafting:
            return
        cfg = model_config_json(drafter)
        if cfg is not None and mask_token(cfg) is None:
            raise ConfigError(
                f"parallel_drafting needs a mask token in the drafter's config.json, but {drafter!r} sets none of "
                f'{", ".join(MASK_TOKEN_KEYS)}. Add one (e.g. "pard_token": <id of a token the drafter was '
                'trained to fill> for PARD, "mask_token_id" for P-EAGLE) or set parallel_drafting=False.'
            )

    # -- measuring --

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        """Run `workload` at `scenario` on a fresh engine with `config`; never raises for engine failures.

        Measured (not predicted): output tokens/s over the measured phase (wall clock, all classes), TTFT and
        TPOT p50/p99 in ms, and speculative counters (deltas of vLLM's metrics) overall and per class. Each
        workload class is a separate measured sub-phase. Raises BackendUnavailableError when vLLM is not
        installed (every trial would fail the same way).
        """
        require_vllm("The vllm backend", ", or use the model backend (--backend model)")
        provenance = measured_provenance(
            self.options.llm_kwargs(config, speculative_extra=self.speculative_extra, engine_paths=False),
            self.options.process_env(),
        )

        def fail(kind: FailureKind, reason: str, log: str | None = None) -> Measurement:
            return Measurement.failed(config, scenario, provenance, kind, reason, log)

        try:
            self.validate(config)
        except ConfigError as exc:
            return fail("invalid_config", str(exc))
        if scenario.request_rate is not None and self.mode != "serve":
            return fail(
                "invalid_config",
                f"Scenario.request_rate={scenario.request_rate} (open loop) needs mode='serve'; offline mode "
                "queues every prompt at once. Use VLLMBackend(mode='serve') or request_rate=None.",
            )
        classes = select_requests(workload, scenario.num_prompts)
        if not classes:
            return fail("invalid_config", f"Workload {workload.name!r} has no requests to measure.")

        # Offline, LLM.generate queues every prompt; capping the engine's batch at the scenario's concurrency
        # gives the same in-flight count as a closed-loop client. Serve mode keeps the config's cap and lets
        # the client bound concurrency, as in production.
        engine_seqs = min(config.max_num_seqs, scenario.concurrency) if self.mode == "offline" else config.max_num_seqs
        job: dict[str, Any] = {
            "model": self.model,
            "engine_kwargs": self.options.llm_kwargs(
                config, max_num_seqs=engine_seqs, speculative_extra=self.speculative_extra
            ),
            "classes": {c: [r.to_dict() for r in reqs] for c, reqs in classes.items()},
            "warmup_requests": self.warmup_requests,
            "ignore_eos": self.options.ignore_eos,
            "return_outputs": self.return_outputs,
            "concurrency": scenario.concurrency,
            "request_rate": scenario.request_rate,
        }
        with run_directory(self.log_dir, "peagle-vllm-") as run_dir:
            if self.mode == "offline":
                launch = run_worker(OFFLINE_JOB, job, run_dir, self.options)
            else:
                launch = run_serve(job, run_dir, self.options)

        environment = detect_environment()
        extra: dict[str, Any] = {
            "mode": self.mode,
            "engine_max_num_seqs": engine_seqs,
            "environment": {k: environment[k] for k in ("gpu_count", "gpu_names", "driver")},
            "worker_pid": launch.pid,
            "total_s": launch.total_s,
        }
        if self.log_dir is not None:
            extra["log_path"] = str(launch.log_path)
        failure = launch.failure()
        if failure is not None:
            m = fail(*failure, launch.log_tail)
            m.extra.update(extra)
            return m
        return self.measurement(config, scenario, provenance, launch.raw, extra)

    def measurement(
        self,
        config: SpecConfig,
        scenario: Scenario,
        provenance: Provenance,
        raw: Mapping[str, Any],
        extra: dict[str, Any],
    ) -> Measurement:
        """The `Measurement` of an engine's report ``raw`` (``{"classes": {class: {"wall_s", "num_requests",
        "output_tokens", "ttft_ms", "tpot_ms", "spec", "outputs"?}}, "timings"?}``, as the offline job writes it):
        output tokens/s over the classes' summed wall time, latency percentiles, spec counters per class."""
        per_class: Mapping[str, Any] = raw["classes"]
        tokens = sum(int(c["output_tokens"]) for c in per_class.values())
        wall = sum(float(c["wall_s"]) for c in per_class.values())
        ttft = [x for c in per_class.values() for x in c["ttft_ms"]]
        tpot = [x for c in per_class.values() for x in c["tpot_ms"]]
        extra.update(
            {
                "timings": raw.get("timings", {}),
                "num_requests": sum(int(c["num_requests"]) for c in per_class.values()),
                "output_tokens": tokens,
                "per_class": {name: _latency_summary(c) for name, c in per_class.items()},
            }
        )
        itl = [x for c in per_class.values() for x in c.get("itl_ms", [])]
        if itl:
            extra["itl_ms_p50"] = _percentile(itl, 50)
            extra["itl_ms_p99"] = _percentile(itl, 99)
        if self.return_outputs:
            extra["outputs"] = {name: c.get("outputs", []) for name, c in per_class.items()}
        spec_per_class = (
            {name: SpecCounters.from_dict(c["spec"]) for name, c in per_class.items()} if config.speculative else {}
        )
        return Measurement(
            config=config,
            scenario=scenario,
            provenance=provenance,
            output_tokens_per_s=tokens / wall if wall > 0 else None,
            ttft_ms_p50=_percentile(ttft, 50),
            ttft_ms_p99=_percentile(ttft, 99),
            tpot_ms_p50=_percentile(tpot, 50),
            tpot_ms_p99=_percentile(tpot, 99),
            spec=sum_counters(list(spec_per_class.values())) if config.speculative else None,
            spec_per_class=spec_per_class,
            extra=extra,
        )


# --- aggregation ----------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def sum_counters(parts: list[SpecCounters]) -> SpecCounters:
    """Element-wise sum (per-position lists padded with zeros)."""
    per_pos: list[int] = []
    for p in parts:
        add_positions(per_pos, p.accepted_per_position)
    return SpecCounters(
        num_drafts=sum(p.num_drafts for p in parts),
        num_draft_tokens=sum(p.num_draft_tokens for p in parts),
        num_accepted_tokens=sum(p.num_accepted_tokens for p in parts),
        accepted_per_position=per_pos,
    )


def _latency_summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    wall = float(entry["wall_s"])
    return {
        "num_requests": int(entry["num_requests"]),
        "output_tokens": int(entry["output_tokens"]),
        "wall_s": wall,
        "output_tokens_per_s": entry["output_tokens"] / wall if wall > 0 else None,
        "ttft_ms_p50": _percentile(entry["ttft_ms"], 50),
        "tpot_ms_p50": _percentile(entry["tpot_ms"], 50),
    }


def select_requests(workload: Workload, num_prompts: int | None) -> dict[str, list[WorkloadRequest]]:
    """The measured requests grouped by class (classes in name order, empty ones dropped).

    ``num_prompts=None`` takes every request; otherwise the first `num_prompts` of ``workload.requests()``
    (classes interleaved), cycling through the workload again when it has fewer.
    Example: classes a=[a1, a2], b=[b1] and num_prompts=4 -> {"a": [a1, a2, a1], "b": [b1]}.
    """
    if num_prompts is None:
        return {c: list(workload.classes[c]) for c in workload.class_names if workload.classes[c]}
    out: dict[str, list[WorkloadRequest]] = {}
    pool = workload.requests()
    if not pool or num_prompts < 1:
        return {}
    for cls, req in itertools.islice(itertools.cycle(pool), num_prompts):
        out.setdefault(cls, []).append(req)
    return {c: out[c] for c in sorted(out)}
