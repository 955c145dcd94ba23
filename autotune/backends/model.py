"""The model backend: PREDICTS how a speculative config serves a workload, with no GPU and no vLLM.

Step time T(B, K) comes from the calibrated roofline (`autotune.backends._step.step_time`: target pass in
`_roofline`, drafting in `_drafter_cost`; constants fitted to published throughput, docs/benchmarks/model.md) or
from a fitted `StepCostModel` when one is given ("predicts from a stored profile"); acceptance AL(K) comes from the
catalog's per-position curve through the drafter's published acceptance for each workload class
(`autotune.catalogs.reference_survival`; the nearest published workload when a class has none, with a warning) or
from measured `AcceptanceProfile`s when given. Then, for a batch of B requests verifying K drafts each:

- output tokens/s = ``B * AL(K) / T(B, K) * 1000``;
- TPOT = ``T(B, K) / AL(K)`` ms (every request in the batch gains AL tokens per step);
- speedup_vs_no_spec = tokens/s / tokens/s of the same batch at K = 0 (method "none").

Every `Measurement` it returns says ``Provenance(kind="predicted", backend="model", ...)`` with the acceptance
source and the step-cost source in ``profile``.

`ModelBackend` composes the parts: `_shape` (what a prediction needs of a workload), `_acceptance` (AL(K) per class
and mixed), `_memory` (does it fit), `_batching` (requests per step, prompt work per step) and `_figures` (the
step's parts and the warnings a prediction carries).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from autotune.backends._acceptance import WorkloadAcceptance, workload_acceptance
from autotune.backends._batching import batch_size, prompt_ms_per_step, step_slots
from autotune.backends._drafter_cost import request_kv_bytes
from autotune.backends._figures import prediction_warnings, roofline_figures
from autotune.backends._memory import predicted_fit
from autotune.backends._roofline import RooflineParams, scaled_gpu, speedup_log_sigma, target_pass
from autotune.backends._shape import WorkloadShape
from autotune.backends._step import Calibration, StepTime, fit_calibration, prefill_ms, step_time
from autotune.backends.base import Backend, Capabilities
from autotune.catalogs import DrafterSpec, GPUSpec, ModelSpec, default_gpu, get_drafter, get_gpu, resolve_model
from autotune.errors import ConfigError, PeagleError, UsageError
from autotune.fit import MemoryFit, max_model_len_of
from autotune.measurement import Measurement, Provenance
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload
from policies import AcceptanceProfile, StepCostModel

__all__ = [
    "Calibration",
    "ModelBackend",
    "RooflineParams",
    "StepCostPredictor",
    "StepTime",
    "WorkloadShape",
    "fit_calibration",
]


class StepCostPredictor(Protocol):
    """What the backend needs of a fitted step-cost model (`policies.StepCostModel` has it)."""

    def predict(self, batch_size: int, depth: int) -> float:
        """Step time in ms of B requests verifying `depth` drafts each."""
        ...


class ModelBackend(Backend):
    """Predicts (never measures) step time, acceptance, tokens/s, TPOT, TTFT and speedup for a model on a GPU.

    Args:
        model: catalog name, local path or `ModelSpec` of the target.
        gpu: catalog name or `GPUSpec`; None: the catalog's default GPU.
        drafters: drafter specs to resolve `SpecConfig.drafter` against before the catalog (e.g. local heads).
        params: roofline constants (`RooflineParams`).
        calibration: correction fitted from measured steps (`fit_calibration`); None: the raw roofline.
        acceptance: class name -> measured `AcceptanceProfile`, overriding the published reference for those
            classes (other classes keep the published one).
        cost_model: a fitted step-cost model (e.g. `policies.StepCostModel` from a stored profile); when given it
            replaces the roofline for T(B, K) and `calibration` is not applied.
        tp: tensor-parallel GPUs (memory, bandwidth and compute add up; communication is not modelled).
        acceptance_drafter: the drafter `acceptance` was measured with; None: it applies to every drafter.
        profile_label: how `acceptance` is named in provenance, e.g. "measured profile #3".
        context_tokens: mean decoding context (tokens) to assume instead of the workload's prompt + output / 2.
    """

    name = "model"
    capabilities = Capabilities(predicts=True)

    def __init__(
        self,
        model: ModelSpec | str,
        gpu: GPUSpec | str | None = None,
        drafters: Sequence[DrafterSpec] | None = None,
        params: RooflineParams | None = None,
        calibration: Calibration | None = None,
        acceptance: Mapping[str, AcceptanceProfile] | None = None,
        cost_model: StepCostPredictor | None = None,
        *,
        tp: int = 1,
        acceptance_drafter: str | None = None,
        profile_label: str | None = None,
        context_tokens: float | None = None,
    ) -> None:
        self.model = resolve_model(model)
        base_gpu = get_gpu(gpu) if isinstance(gpu, str) else (gpu or default_gpu())
        self.tp = tp
        self._base_gpu = base_gpu
        self.gpu = scaled_gpu(base_gpu, tp)
        self.drafters = list(drafters or [])
        self.params = params or RooflineParams()
        self.calibration = calibration
        self.acceptance = dict(acceptance or {})
        self.acceptance_drafter = acceptance_drafter
        self.profile_label = profile_label or "measured acceptance profile"
        self.cost_model = cost_model
        if context_tokens is not None and context_tokens < 0:
            raise UsageError(f"context_tokens must be >= 0, but got {context_tokens}.")
        self.context_tokens = context_tokens

    # ---- public helpers --------------------------------------------------------------------------------------
    @property
    def base_gpu(self) -> GPUSpec:
        """One of the GPUs predicted for (`tp` of them)."""
        return self._base_gpu

    @property
    def device(self) -> str:
        """The GPU the predictions assume (display name)."""
        return self.gpu.display_name

    @property
    def step_cost_source(self) -> str:
        if self.cost_model is not None:
            return "fitted cost model"
        if self.calibration is not None and not self.calibration.is_identity:
            return "calibrated roofline"
        return "roofline"

    def drafter_for(self, config: SpecConfig) -> DrafterSpec:
        """The drafter spec of a speculative config (its layer variant when `drafter_layers` differs).

        Raises ConfigError/UnknownModelError when the drafter is unknown, trained for another target, or
        incompatible with the config's method or parallel drafting.
        """
        if not config.speculative or not config.drafter:
            raise ConfigError(f"config {config.label()} does not speculate: it has no drafter.")
        drafter = self._find_drafter(config.drafter)
        if config.drafter_layers is not None and config.drafter_layers != drafter.num_layers:
            try:
                drafter = drafter.with_layers(config.drafter_layers)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if drafter.method != config.method:
            raise ConfigError(
                f"drafter {drafter.name} is a {drafter.method!r} head, but the config asks for method="
                f"{config.method!r}; vLLM loads it only with method={drafter.method!r}."
            )
        if config.parallel_drafting and not drafter.parallel_drafting:
            raise ConfigError(
                f"parallel_drafting=True needs a drafter with a mask token (pard_token, mask_token_id or "
                f"ptd_token_id in its config.json), but {drafter.name} has none. Use parallel_drafting=False "
                "or a P-EAGLE head."
            )
        return drafter

    def acceptance_length(self, config: SpecConfig, workload: Workload) -> float:
        """Predicted mean acceptance length AL(K) of `config` on `workload` (tokens per request per step, bonus
        token included; 1.0 without speculation). Raises ConfigError when no acceptance is known."""
        if not config.speculative:
            return 1.0
        drafter = self.drafter_for(config)
        shape = WorkloadShape.of(workload, self.params)
        return self._acceptance(drafter, shape).length(config.k)

    def step(self, config: SpecConfig, batch_size: int, context_tokens: float | None = None) -> StepTime:
        """Roofline breakdown (uncalibrated) of one step of `config` at `batch_size` requests."""
        drafter = self.drafter_for(config) if config.speculative else None
        context = self._context(context_tokens, None)
        return step_time(
            self.model, self.gpu, batch_size, config.k, drafter, config.parallel_drafting, context, self.params
        )

    def target_pass_ms(self, tokens: int, requests: int, context_tokens: float) -> float:
        """Predicted time of one target forward pass over `tokens` tokens of `requests` requests at a mean of
        `context_tokens` of context, ms (uncalibrated roofline; a prefill chunk is a pass with many tokens)."""
        return target_pass(self.model, self.gpu, tokens, requests, context_tokens, self.params).total_ms

    def predict_step_ms(self, config: SpecConfig, batch_size: int, context_tokens: float | None = None) -> float:
        """Predicted time of one engine step, ms: `batch_size` requests each verifying K drafts plus drafting.

        From the fitted cost model when one was given, else the (calibrated) roofline at `context_tokens` of
        context (default: the backend's, else RooflineParams.default_context_tokens).
        """
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, but got {batch_size}.")
        model = self.cost_model
        if isinstance(model, StepCostModel):  # a fresh launch at static K: its uniform steps replay FULL graphs
            return float(model.predict(batch_size, config.k, piecewise=False))
        if model is not None:
            return float(model.predict(batch_size, config.k))
        return self.step(config, batch_size, context_tokens).calibrated_ms(self.calibration)

    def piecewise_penalty_ms(self, config: SpecConfig, context_tokens: float | None = None) -> float:
        """Predicted extra ms of a step of `config`'s launch that runs PIECEWISE instead of replaying FULL CUDA
        graphs (a depth below the launch's K, an off-step, a batch-size schedule's every step): the sourced share
        of the single-stream FULL step (`policies._graphs.piecewise_penalty_ms`), or a fitted cost model's own
        ``piecewise`` coefficient when it measured one."""
        from policies._graphs import piecewise_penalty_ms

        if isinstance(self.cost_model, StepCostModel) and self.cost_model.coefficients.get("piecewise"):
            return float(self.cost_model.coefficients["piecewise"])
        return piecewise_penalty_ms(self.predict_step_ms(config, 1, context_tokens))

    def memory_fit(self, config: SpecConfig, sequences: int, tokens: int) -> MemoryFit:
        """Whether vLLM starts `config` with max_model_len `tokens` on this backend's GPU(s), and holds `sequences`
        such sequences at once: the one memory-fit check (`autotune.fit.check_gpu_fit`, as search's vllm path runs
        it on checkpoints) with the weights predicted from the catalog's parameter counts and the KV shape from its
        layers and heads (a drafter keeps full-context KV in each of its layers with the target's heads)."""
        drafter = self.drafter_for(config) if config.speculative and config.k > 0 else None
        return predicted_fit(self.model, drafter, self._base_gpu, self.tp, self.params, sequences, tokens)

    def workload_fit(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> MemoryFit:
        """`memory_fit` as `measure` checks it: at the workload's max_model_len (`autotune.fit.max_model_len_of`,
        what a launch passes), with the requests one step holds at `scenario` (`step_slots`) at once."""
        slots = max(step_slots(config, scenario, config.k), 1)
        return self.memory_fit(config, slots, max_model_len_of(workload))

    # ---- Backend ---------------------------------------------------------------------------------------------
    def figure_inputs(self) -> str:
        cost = self.cost_model
        return repr((
            self.model, self.gpu, self.params, self.calibration, self.drafters, self.acceptance_drafter,
            self.context_tokens, {c: p.to_dict() for c, p in sorted(self.acceptance.items())},
            getattr(cost, "to_dict", lambda: repr(cost))(),
        ))

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        """Predict `config` on `workload` at `scenario`; failures (unknown drafter, no acceptance figure, does
        not fit in memory) come back as ``Measurement.failed``."""
        shape = WorkloadShape.of(workload, self.params)
        drafter: DrafterSpec | None = None
        acceptance: WorkloadAcceptance | None = None
        try:
            if config.speculative:
                drafter = self.drafter_for(config)
                acceptance = self._acceptance(drafter, shape)
        except (PeagleError, ValueError) as exc:
            # Unknown or foreign drafter, unreadable local head, no acceptance figure: a config we cannot price.
            return Measurement.failed(config, scenario, self._provenance(None), "invalid_config", str(exc))
        provenance = self._provenance(acceptance)
        k = config.k
        context = self._context(None, shape)

        slots = step_slots(config, scenario, k)
        if slots < 1:
            return Measurement.failed(
                config,
                scenario,
                provenance,
                "invalid_config",
                f"max_num_batched_tokens={config.max_num_batched_tokens} cannot hold one request's K+1="
                f"{k + 1} verified tokens; raise it to >= {k + 1} or lower K.",
            )

        memory = self.memory_fit(config, slots, max_model_len_of(workload))
        if not memory.fits:
            return Measurement.failed(config, scenario, provenance, "out_of_memory", memory.message)
        if memory.max_num_seqs_that_fit is not None:
            # vLLM starts and queues what its KV cache cannot hold: at most this many sequences of max_model_len run.
            slots = min(slots, memory.max_num_seqs_that_fit)
        # Steady state: paged KV holds each running request's current context (mean: prompt + half its output).
        kv_gb_per_request = request_kv_bytes(self.model, int(round(context)) + k + 1, drafter if k else None) / 1e9

        def al(kk: int) -> float:
            return acceptance.length(kk) if (acceptance is not None and kk > 0) else 1.0

        def step_ms(b: int, kk: int) -> float:
            if self.cost_model is not None:
                return float(self.cost_model.predict(b, kk))
            st = step_time(self.model, self.gpu, b, kk, drafter, config.parallel_drafting, context, self.params)
            return st.calibrated_ms(self.calibration)

        batch, saturated = batch_size(scenario, slots, k, al, step_ms, shape)
        step = step_ms(batch, k)
        length = al(k)
        tokens_per_s = batch * length / (step + prompt_ms_per_step(self.cost_model, batch, k, length, shape)) * 1000.0
        tpot = step / length
        base_batch, _ = batch_size(scenario, step_slots(config, scenario, 0), 0, al, step_ms, shape)
        base_step = step_ms(base_batch, 0)
        base_prompt_ms = prompt_ms_per_step(self.cost_model, base_batch, 0, 1.0, shape)
        base_tokens_per_s = base_batch / (base_step + base_prompt_ms) * 1000.0
        if scenario.request_rate is not None and not saturated:
            # Open loop below capacity: both serve the offered load; the gain is per-request decode speed.
            offered = scenario.request_rate * shape.output_tokens
            speedup = base_step / tpot
            tokens_per_s = offered
        else:
            speedup = tokens_per_s / base_tokens_per_s

        prefill = prefill_ms(
            self.model, self.gpu, int(round(shape.prompt_tokens)), drafter if k > 0 else None, self.params
        )
        if self.calibration is not None and self.cost_model is None:
            prefill = self.calibration.apply(prefill, 0.0)
        duration_ms = prefill + shape.output_tokens * tpot
        queue_ms = 0.0
        if scenario.request_rate is None and scenario.concurrency > batch:
            # Closed loop with more clients than slots: by Little's law each request waits (C / S - 1) request
            # durations for a slot.
            queue_ms = (scenario.concurrency / batch - 1.0) * duration_ms
        ttft = queue_ms + prefill + step / 2.0  # joins the running step halfway on average

        extra = self._extra(config, drafter, shape, acceptance, batch, context, step, length, memory)
        if self.cost_model is None and config.speculative:
            # The spread of the calibration's residuals (autotune/backends/roofline.yaml), one sigma each side.
            sigma = speedup_log_sigma()
            extra["prediction_log_sigma"] = sigma
            extra["speedup_range"] = [speedup * math.exp(-sigma), speedup * math.exp(sigma)]
        extra["kv_cache_gb"] = batch * kv_gb_per_request
        if memory.warning:
            extra["memory_warning"] = memory.warning
        extra.update(
            {
                "baseline_batch_size": base_batch,
                "baseline_step_ms": base_step,
                "baseline_tokens_per_s": base_tokens_per_s,
                "prefill_ms": prefill,
                "queue_wait_ms": queue_ms,
                "saturated": saturated,
            }
        )
        return Measurement(
            config=config,
            scenario=scenario,
            provenance=provenance,
            output_tokens_per_s=tokens_per_s,
            tpot_ms_p50=tpot,
            ttft_ms_p50=ttft,
            speedup_vs_no_spec=speedup,
            extra=extra,
        )

    # ---- internals -------------------------------------------------------------------------------------------
    def _find_drafter(self, name: str) -> DrafterSpec:
        wanted = name.strip().lower()
        for d in self.drafters:
            names = {d.name.lower(), *(a.lower() for a in d.aliases)}
            if d.local_path:
                names.add(d.local_path.lower())
            if wanted in names:
                return d
        return get_drafter(name, target=self.model)

    def _context(self, context_tokens: float | None, shape: WorkloadShape | None) -> float:
        if context_tokens is not None:
            return context_tokens
        if self.context_tokens is not None:
            return self.context_tokens
        if shape is not None:
            return shape.context_tokens
        return float(self.params.default_context_tokens)

    def _acceptance(self, drafter: DrafterSpec, shape: WorkloadShape) -> WorkloadAcceptance:
        return workload_acceptance(drafter, shape, self.acceptance, self.acceptance_drafter, self.profile_label)

    def _provenance(self, acceptance: WorkloadAcceptance | None) -> Provenance:
        parts = [acceptance.label()] if acceptance is not None else []
        parts.append(self.step_cost_source)
        return Provenance(kind="predicted", backend="model", device=self.device, profile="; ".join(parts))

    def _extra(
        self,
        config: SpecConfig,
        drafter: DrafterSpec | None,
        shape: WorkloadShape,
        acceptance: WorkloadAcceptance | None,
        batch: int,
        context: float,
        step: float,
        length: float,
        memory: MemoryFit,
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {
            "step_ms": step,
            "acceptance_length": length,
            "batch_size": batch,
            "context_tokens": context,
            "prompt_tokens": shape.prompt_tokens,
            "output_tokens": shape.output_tokens,
            "step_cost_source": self.step_cost_source,
            "weights_gb": self.model.weight_bytes() / 1e9,
            "drafter_gb": memory.weight_bytes / 1e9 - self.model.weight_bytes() / 1e9,
            "usable_gb": memory.per_device_budget * memory.tensor_parallel_size / 1e9,
        }
        if acceptance is not None:
            extra["acceptance_by_class"] = acceptance.by_class(config.k)
            extra["acceptance_sources"] = dict(acceptance.sources)
        if self.cost_model is None:
            extra.update(roofline_figures(
                self.model, self.gpu, self.params, self.calibration, config, drafter, batch, context
            ))
        warnings = prediction_warnings(config, drafter, acceptance)
        if warnings:
            extra["warnings"] = warnings
        return extra
