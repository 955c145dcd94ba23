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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.backends._drafter_cost import drafter_weight_params, request_kv_bytes
from autotune.backends._roofline import (
    RooflineParams,
    expected_distinct_experts,
    routed_tokens,
    scaled_gpu,
    speedup_log_sigma,
    target_pass,
)
from autotune.backends._step import (
    Calibration,
    StepTime,
    fit_calibration,
    prefill_ms,
    step_time,
)
from autotune.backends.base import Backend, Capabilities
from autotune.catalogs import (
    DrafterSpec,
    GPUSpec,
    ModelSpec,
    default_gpu,
    get_drafter,
    get_gpu,
    reference_survival,
    resolve_model,
)
from autotune.errors import ConfigError, PeagleError, UsageError
from autotune.fit import MemoryFit, check_gpu_fit
from autotune.measurement import Measurement, Provenance
from autotune.spec import MAX_K, Scenario, SpecConfig
from autotune.workloads import REFERENCE_FOR_CLASS, Workload
from policies import AcceptanceProfile

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


@dataclass(frozen=True)
class WorkloadShape:
    """What the prediction needs of a workload: request counts, mean output per class and token lengths.

    Prompt lengths are estimated from text (``chars / RooflineParams.chars_per_token``); output lengths are the
    requests' ``max_tokens`` (a request is assumed to generate all of them).
    """

    requests_by_class: dict[str, int]
    output_tokens_by_class: dict[str, float]
    prompt_tokens: float
    """Mean prompt length, tokens."""
    output_tokens: float
    """Mean output length, tokens."""
    max_prompt_tokens: int
    max_output_tokens: int

    @property
    def context_tokens(self) -> float:
        """Mean context of a decoding request: prompt plus half the output (tokens)."""
        return self.prompt_tokens + self.output_tokens / 2.0

    @property
    def max_context_tokens(self) -> int:
        return self.max_prompt_tokens + self.max_output_tokens

    @classmethod
    def of(cls, workload: Workload, params: RooflineParams) -> WorkloadShape:
        counts: dict[str, int] = {}
        outputs: dict[str, float] = {}
        prompts: list[float] = []
        outs: list[int] = []
        for name, requests in workload.classes.items():
            if not requests:
                continue
            counts[name] = len(requests)
            outputs[name] = sum(r.max_tokens for r in requests) / len(requests)
            prompts.extend(max(len(r.text()) / params.chars_per_token, 1.0) for r in requests)
            outs.extend(r.max_tokens for r in requests)
        if not prompts:
            # An empty workload still has a class mix (names only): assume the default lengths.
            names = list(workload.classes) or ["chat"]
            default_out = float(params.default_output_tokens)
            return cls(
                {c: 1 for c in names},
                {c: default_out for c in names},
                float(params.default_prompt_tokens),
                default_out,
                params.default_prompt_tokens,
                params.default_output_tokens,
            )
        return cls(
            counts,
            outputs,
            sum(prompts) / len(prompts),
            sum(outs) / len(outs),
            int(math.ceil(max(prompts))),
            max(outs),
        )


@dataclass
class _Acceptance:
    """AL(K) of a workload: per-class profiles, their sources, and the token weights used to mix them."""

    profiles: dict[str, AcceptanceProfile]
    sources: dict[str, str]
    token_weights: dict[str, float]
    warnings: list[str] = field(default_factory=list)

    def by_class(self, k: int) -> dict[str, float]:
        return {c: p.acceptance_length(k) for c, p in self.profiles.items()}

    def length(self, k: int) -> float:
        """Mixed AL(K): total output tokens / total request-steps.

        A class c with token share w_c needs w_c / AL_c(K) request-steps per output token, so
        ``AL = sum_c w_c / sum_c (w_c / AL_c)`` -- the token-weighted harmonic mean. It equals averaging the
        survival curves with weights = each class's share of drafts (`policies.mix`): a class that accepts more
        finishes its requests in fewer steps and so holds fewer batch slots.
        Example: chat AL 2 and code AL 4 with equal tokens -> 2 / (1/2 + 1/4) = 2.67, not 3.
        """
        if k == 0:
            return 1.0
        als = self.by_class(k)
        total = sum(self.token_weights.values())
        return total / sum(w / als[c] for c, w in self.token_weights.items())

    def label(self) -> str:
        return ", ".join(sorted(set(self.sources.values())))


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
        if self.cost_model is not None:
            return float(self.cost_model.predict(batch_size, config.k))
        return self.step(config, batch_size, context_tokens).calibrated_ms(self.calibration)

    def memory_fit(self, config: SpecConfig, sequences: int, tokens: int) -> MemoryFit:
        """Whether `config` holds `sequences` sequences of `tokens` tokens on this backend's GPU(s): the one
        memory-fit check (`autotune.fit.check_gpu_fit`, as search's vllm path runs it on checkpoints) with the
        weights predicted from the catalog's parameter counts and the KV shape from its layers and heads (a drafter
        keeps full-context KV in each of its layers with the target's heads). The message names the
        --tensor-parallel-size or --max-num-seqs that would fit."""
        drafter = self.drafter_for(config) if config.speculative and config.k > 0 else None
        model = self.model
        heads = {"num_attention_heads": model.num_attention_heads, "num_key_value_heads": model.num_kv_heads,
                 "head_dim": model.head_dim}
        sliding = round(model.num_layers * model.sliding_window_layer_fraction) if model.sliding_window else 0
        layer_types = ["sliding_attention"] * sliding + ["full_attention"] * (model.num_layers - sliding)
        target_config = {"num_hidden_layers": model.num_layers, **heads, "sliding_window": model.sliding_window,
                         "layer_types": layer_types}
        drafter_bytes = 0
        if drafter is not None:
            stored = drafter_weight_params(drafter, model, self.params)[1]
            drafter_bytes = int(stored * self.params.drafter_bytes_per_param)
        return check_gpu_fit(
            model=model.name, target_weight_bytes=int(model.weight_bytes()), target_config=target_config,
            drafter_weight_bytes=drafter_bytes,
            drafter_config={"num_hidden_layers": drafter.num_layers, **heads} if drafter is not None else None,
            max_model_len=max(int(tokens), 1), max_num_seqs=max(sequences, 1),
            device_memory_bytes=int(self._base_gpu.memory_gb * 1e9), device_name=self._base_gpu.display_name,
            tensor_parallel_size=self.tp, kv_dtype_bytes=max(int(model.kv_bytes_per_element), 1),
        )

    def workload_fit(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> MemoryFit:
        """`memory_fit` as `measure` checks it: the requests one step holds at `scenario` (`_slots`), each at the
        workload's longest sequence (prompt + output + K + 1 tokens)."""
        shape = WorkloadShape.of(workload, self.params)
        slots = max(self._slots(config, scenario, config.k), 1)
        return self.memory_fit(config, slots, self._sequence_tokens(shape, config.k))

    @staticmethod
    def _sequence_tokens(shape: WorkloadShape, k: int) -> int:
        return int(shape.max_context_tokens) + k + 1

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
        acceptance: _Acceptance | None = None
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

        slots = self._slots(config, scenario, k)
        if slots < 1:
            return Measurement.failed(
                config,
                scenario,
                provenance,
                "invalid_config",
                f"max_num_batched_tokens={config.max_num_batched_tokens} cannot hold one request's K+1="
                f"{k + 1} verified tokens; raise it to >= {k + 1} or lower K.",
            )

        memory = self.memory_fit(config, slots, self._sequence_tokens(shape, k))
        if not memory.fits:
            return Measurement.failed(config, scenario, provenance, "out_of_memory", memory.message)
        # Steady state: paged KV holds each running request's current context (mean: prompt + half its output).
        kv_gb_per_request = request_kv_bytes(self.model, int(round(context)) + k + 1, drafter if k else None) / 1e9

        def al(kk: int) -> float:
            return acceptance.length(kk) if (acceptance is not None and kk > 0) else 1.0

        def step_ms(b: int, kk: int) -> float:
            if self.cost_model is not None:
                return float(self.cost_model.predict(b, kk))
            st = step_time(self.model, self.gpu, b, kk, drafter, config.parallel_drafting, context, self.params)
            return st.calibrated_ms(self.calibration)

        batch, saturated = self._batch(scenario, slots, k, al, step_ms, shape)
        step = step_ms(batch, k)
        length = al(k)
        tokens_per_s = batch * length / (step + self._prompt_ms_per_step(batch, k, length, shape)) * 1000.0
        tpot = step / length
        base_batch, _ = self._batch(scenario, self._slots(config, scenario, 0), 0, al, step_ms, shape)
        base_step = step_ms(base_batch, 0)
        base_tokens_per_s = base_batch / (base_step + self._prompt_ms_per_step(base_batch, 0, 1.0, shape)) * 1000.0
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

        extra = self._extra(config, shape, acceptance, batch, context, step, length, memory)
        if self.cost_model is None and config.speculative:
            # The spread of the calibration's residuals (autotune/backends/roofline.yaml), one sigma each side.
            sigma = speedup_log_sigma()
            extra["prediction_log_sigma"] = sigma
            extra["speedup_range"] = [speedup * math.exp(-sigma), speedup * math.exp(sigma)]
        extra["kv_cache_gb"] = batch * kv_gb_per_request
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
    def _prompt_ms_per_step(self, batch: int, k: int, length: float, shape: WorkloadShape) -> float:
        """Prompt processing per decode step, ms, for a fitted (measured) cost model; 0 for the roofline.

        Closed loop at B requests: while a request generates its O output tokens (O / AL steps) the B running
        requests are replaced once on average, and each newcomer's P prompt tokens ride in a decode step at the
        fit's marginal cost per token. So every decode step carries B * AL / O of a prompt: on short outputs
        (the CPU fixtures: 48 tokens) prompts are a large share of the wall time. The roofline's constants were
        fitted to published end-to-end throughput, which already absorbs prompt processing.
        """
        model = self.cost_model
        predict_tokens = getattr(model, "predict_tokens", None)
        if model is None or predict_tokens is None or shape.output_tokens <= 0:
            return 0.0
        verified = batch * (k + 1)
        prompt = max(int(round(shape.prompt_tokens)), 1)
        marginal = float(predict_tokens(batch, verified + prompt, k > 0, k)) - float(
            predict_tokens(batch, verified, k > 0, k))
        return max(marginal, 0.0) * batch * length / shape.output_tokens

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

    def _acceptance(self, drafter: DrafterSpec, shape: WorkloadShape) -> _Acceptance:
        use_override = bool(self.acceptance) and (
            self.acceptance_drafter is None or self.acceptance_drafter in (drafter.name, drafter.local_path)
        )
        refs = drafter.reference_acceptance
        profiles: dict[str, AcceptanceProfile] = {}
        sources: dict[str, str] = {}
        warnings: list[str] = []
        for cls in shape.requests_by_class:
            if use_override and cls in self.acceptance:
                profiles[cls] = self.acceptance[cls]
                sources[cls] = self.profile_label
                continue
            dataset = cls if cls in refs else REFERENCE_FOR_CLASS.get(cls)
            if dataset not in refs:
                if not refs:
                    raise ConfigError(
                        f"drafter {drafter.name} has no published acceptance (catalog reference_acceptance is "
                        f"empty) and no measured profile covers class {cls!r}, so its speedup cannot be "
                        "predicted. Profile it with the vllm backend, or pass a measured profile "
                        "(ModelBackend(acceptance={...}))."
                    )
                # Unknown class: the lowest published acceptance (open chat, usually) is the cautious guess.
                dataset = min(refs, key=lambda d: refs[d]["acceptance_length"] / (refs[d]["k"] + 1))
                warnings.append(
                    f"class {cls!r} maps to no reference benchmark ({dict(REFERENCE_FOR_CLASS)}); assumed "
                    f"{dataset}, the drafter's lowest published acceptance."
                )
            ref = refs[str(dataset)]
            profiles[cls] = AcceptanceProfile.from_survival(reference_survival(ref, MAX_K), num_drafts=100_000)
            sources[cls] = f"published:{dataset}@K={ref['k']}"
            if "nearest" in ref:
                sources[cls] = f"published:{ref['nearest']}@K={ref['k']} in place of {dataset}"
                warnings.append(
                    f"{drafter.name} has no published acceptance on {dataset}; the nearest published workload, "
                    f"{ref['nearest']}, is used."
                )
        total = sum(shape.requests_by_class.values())
        weights = {c: n / total * shape.output_tokens_by_class[c] for c, n in shape.requests_by_class.items()}
        return _Acceptance(profiles, sources, weights, warnings)

    def _provenance(self, acceptance: _Acceptance | None) -> Provenance:
        parts = [acceptance.label()] if acceptance is not None else []
        parts.append(self.step_cost_source)
        return Provenance(kind="predicted", backend="model", device=self.device, profile="; ".join(parts))

    @staticmethod
    def _slots(config: SpecConfig, scenario: Scenario, k: int) -> int:
        """Requests one step can hold: min(concurrency, max_num_seqs) (closed loop; max_num_seqs for an open
        loop), and at most max_num_batched_tokens // (K + 1), since each request verifies K + 1 tokens. 0 when
        not even one request fits."""
        slots = (
            config.max_num_seqs if scenario.request_rate is not None else min(scenario.concurrency, config.max_num_seqs)
        )
        if config.max_num_batched_tokens is not None:
            slots = min(slots, config.max_num_batched_tokens // (k + 1))
        return slots

    def _batch(
        self,
        scenario: Scenario,
        slots: int,
        k: int,
        al: Callable[[int], float],
        step_ms: Callable[[int, int], float],
        shape: WorkloadShape,
    ) -> tuple[int, bool]:
        """Requests per step: closed loop min(concurrency, slots); open loop the smallest batch whose request
        throughput meets the offered rate (Little's law), or all slots when even that cannot (saturated)."""
        if scenario.request_rate is None:
            return slots, False
        for b in range(1, slots + 1):
            requests_per_s = b * al(k) / step_ms(b, k) * 1000.0 / max(shape.output_tokens, 1.0)
            if requests_per_s >= scenario.request_rate:
                return b, False
        return slots, True

    def _extra(
        self,
        config: SpecConfig,
        shape: WorkloadShape,
        acceptance: _Acceptance | None,
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
            drafter = self.drafter_for(config) if config.speculative else None
            st = step_time(
                self.model, self.gpu, batch, config.k, drafter, config.parallel_drafting, context, self.params
            )
            cal = self.calibration or Calibration()
            extra.update(
                {
                    "verify_ms": cal.scale_verify * st.verify_ms,
                    "draft_ms": cal.scale_draft * st.draft_ms,
                    "overhead_ms": cal.scale_verify * (st.verify.overhead_ms + st.spec_overhead_ms)
                    + cal.scale_draft * st.draft.cost.overhead_ms
                    + cal.overhead_ms,
                    "bound": st.bound,
                    "step_breakdown_ms": st.breakdown(self.calibration),
                    "draft_passes": st.draft.passes,
                    "experts_per_layer": expected_distinct_experts(
                        self.model.num_experts,
                        self.model.experts_per_token,
                        min(routed_tokens(batch, config.k, self.params.routing_locality), batch * (config.k + 1)),
                    ),
                    "kv_read_gb_per_step": st.verify.kv_bytes / 1e9,
                    "weights_read_gb_per_step": st.verify.weight_bytes / 1e9,
                }
            )
        warnings = list(acceptance.warnings) if acceptance is not None else []
        if config.speculative:
            drafter = self.drafter_for(config)
            if drafter.trained_k is not None and config.k > drafter.trained_k:
                warnings.append(
                    f"K={config.k} exceeds the {drafter.trained_k} positions {drafter.name} was trained for: "
                    "acceptance beyond them is extrapolated and likely lower."
                )
            if not drafter.published:
                warnings.append(f"{drafter.name} is hypothetical: {drafter.source[:160]}")
            published = acceptance is not None and any(v.startswith("published") for v in acceptance.sources.values())
            if drafter.parallel_drafting and not config.parallel_drafting and published:
                warnings.append(
                    f"{drafter.name} is a parallel-drafting head run sequentially: its acceptance in that mode is "
                    "not published; its parallel-drafting acceptance is assumed."
                )
        if warnings:
            extra["warnings"] = warnings
        return extra
