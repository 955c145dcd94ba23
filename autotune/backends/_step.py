"""One engine step from the roofline parts: target verification + drafting + fixed costs; memory; calibration.

Pure functions over catalog specs (predictions, no GPU): `step_time` composes `target_pass` (autotune.backends.
_roofline) and `draft_cost` (autotune.backends._drafter_cost); `memory_budget` says whether a deployment fits;
`Calibration` / `fit_calibration` correct predicted step times from measured ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.backends._drafter_cost import DraftCost, draft_cost, drafter_pass, drafter_weight_params, request_kv_bytes
from autotune.backends._roofline import ZERO_PASS, Bound, PassCost, RooflineParams, routed_tokens, target_pass
from autotune.catalogs import DrafterSpec, GPUSpec, ModelSpec
from autotune.errors import UsageError

__all__ = [
    "Calibration",
    "MemoryBudget",
    "StepTime",
    "fit_calibration",
    "memory_budget",
    "prefill_ms",
    "step_time",
]


@dataclass(frozen=True)
class Calibration:
    """Correction of roofline step times from measurements (`fit_calibration`):

    ``step_ms = scale_verify * verify_side_ms + scale_draft * draft_side_ms + overhead_ms``, where the verify side
    is the target pass with its overheads (and the speculation overhead) and the draft side is the drafter passes
    with theirs (`StepTime.verify_side_ms`, `StepTime.draft_side_ms`). The identity is ``Calibration()``.
    """

    scale_verify: float = 1.0
    """Measured / predicted time of the target (verification) pass."""
    scale_draft: float = 1.0
    """Measured / predicted time of the drafter pass(es)."""
    overhead_ms: float = 0.0
    """Constant added to every step, ms (may be negative when the roofline's overheads are too high)."""

    def __post_init__(self) -> None:
        for name in ("scale_verify", "scale_draft"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise UsageError(f"Calibration.{name} must be a finite number > 0, but got {name}={value}.")
        if not math.isfinite(self.overhead_ms):
            raise UsageError(f"Calibration.overhead_ms must be finite, but got {self.overhead_ms}.")

    @property
    def is_identity(self) -> bool:
        return self.scale_verify == 1.0 and self.scale_draft == 1.0 and self.overhead_ms == 0.0

    def apply(self, verify_side_ms: float, draft_side_ms: float) -> float:
        """Calibrated step time, ms (never below 1% of the uncalibrated one, so a bad fit cannot reach 0)."""
        raw = verify_side_ms + draft_side_ms
        value = self.scale_verify * verify_side_ms + self.scale_draft * draft_side_ms + self.overhead_ms
        return max(value, 0.01 * raw)


def fit_calibration(measured: Sequence[tuple[float, float]] | Sequence[tuple[float, float, float]]) -> Calibration:
    """Least-squares `Calibration` from measured step times.

    Pairs ``(predicted_ms, measured_ms)`` (uncalibrated roofline totals) fit ``measured = a * predicted + b``:
    one scale for both sides, ``Calibration(a, a, b)``; needs >= 2 distinct predictions. Triples
    ``(verify_side_ms, draft_side_ms, measured_ms)`` fit the two scales separately, ``Calibration(a_v, a_d, b)``;
    needs >= 3 points whose (verify, draft) are not collinear, e.g. K=0 steps and steps at two K.

    Example: predictions [2, 4, 6] ms measured as [5, 9, 13] ms -> Calibration(2.0, 2.0, 1.0).
    """
    rows = [tuple(float(v) for v in row) for row in measured]
    if not rows:
        raise UsageError("fit_calibration needs measured points, but got none.")
    width = len(rows[0])
    if width not in (2, 3) or any(len(r) != width for r in rows):
        raise UsageError(
            "fit_calibration takes (predicted_ms, measured_ms) pairs or (verify_ms, draft_ms, measured_ms) "
            f"triples, all of one kind, but got rows of lengths {sorted({len(r) for r in rows})}."
        )
    data = np.asarray(rows, dtype=float)
    if not np.all(np.isfinite(data)) or np.any(data[:, -1] <= 0):
        raise UsageError("fit_calibration needs finite times with measured_ms > 0.")
    x, y = data[:, :-1], data[:, -1]
    design = np.column_stack([x, np.ones(len(rows))])
    needed = width  # unknowns: one scale per column plus the offset
    if len(rows) < needed or np.linalg.matrix_rank(design) < needed:
        what = "distinct predicted_ms values" if width == 2 else "points with non-collinear (verify_ms, draft_ms)"
        raise UsageError(
            f"fit_calibration needs at least {needed} {what} to fit {needed} unknowns, but got {len(rows)} "
            "points that do not determine them. Measure steps at more batch sizes or depths (K=0 and two K>0)."
        )
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    scales = [float(c) for c in coef[:-1]]
    if any(s <= 0 for s in scales):
        raise UsageError(
            f"fit_calibration found a non-positive scale {scales}: the measurements do not grow with the "
            "prediction. Check that the points pair each measurement with its own prediction."
        )
    offset = float(coef[-1])
    if width == 2:
        return Calibration(scales[0], scales[0], offset)
    return Calibration(scales[0], scales[1], offset)

@dataclass(frozen=True)
class StepTime:
    """Predicted time of one decode/verify engine step (uncalibrated roofline), with its breakdown."""

    batch_size: int
    k: int
    verify: PassCost
    draft: DraftCost
    spec_overhead_ms: float

    @property
    def verify_ms(self) -> float:
        """Target pass GPU time (sum of its components' rooflines), ms."""
        return self.verify.busy_ms

    @property
    def draft_ms(self) -> float:
        """Drafter passes GPU time, ms."""
        return self.draft.cost.busy_ms

    @property
    def overhead_ms(self) -> float:
        """Fixed launch/scheduling overheads of the step (target, drafter passes, speculation), ms."""
        return self.verify.overhead_ms + self.draft.cost.overhead_ms + self.spec_overhead_ms

    @property
    def verify_side_ms(self) -> float:
        """Target pass with its overheads and the speculation overhead, ms (what `Calibration.scale_verify`
        scales)."""
        return self.verify.total_ms + self.spec_overhead_ms

    @property
    def draft_side_ms(self) -> float:
        """Drafter passes with their overheads, ms (what `Calibration.scale_draft` scales)."""
        return self.draft.cost.total_ms

    @property
    def total_ms(self) -> float:
        """Uncalibrated step time, ms."""
        return self.verify_side_ms + self.draft_side_ms

    @property
    def bound(self) -> Bound:
        """What limits most of the target pass: "memory" (bytes) or "compute" (FLOPs)."""
        return self.verify.bound

    def breakdown(self, calibration: Calibration | None = None) -> dict[str, float]:
        """What the step time is made of, ms; the values sum to `calibrated_ms` (`total_ms` without a
        `calibration`): the target's non-expert weights with its logits and sampler (weights), its MoE experts
        (experts), attention over the KV cache (attention_kv), the drafter's passes (drafter) and every fixed
        per-step, per-request, per-layer and per-pass host and launch cost (fixed_overhead). A calibration scales
        each part by the scale of its side (verify or draft) and adds its offset to the fixed overhead."""
        parts = dict(self.verify.components)
        cal = calibration or Calibration()
        sv, sd = cal.scale_verify, cal.scale_draft
        out = {
            "weights": sv * (parts.get("weights", 0.0) + parts.get("sampler", 0.0)),
            "experts": sv * parts.get("experts", 0.0),
            "attention_kv": sv * parts.get("attention_kv", 0.0),
            "drafter": sd * self.draft_ms,
            "fixed_overhead": sv * (self.verify.overhead_ms + self.spec_overhead_ms)
            + sd * self.draft.cost.overhead_ms + cal.overhead_ms,
        }
        total, step = sum(out.values()), self.calibrated_ms(calibration)
        if calibration is not None and total > 0 and not math.isclose(total, step):  # the calibration's floor
            out = {key: value * step / total for key, value in out.items()}
        return out

    def calibrated_ms(self, calibration: Calibration | None) -> float:
        if calibration is None:
            return self.total_ms
        return calibration.apply(self.verify_side_ms, self.draft_side_ms)


def step_time(
    model: ModelSpec,
    gpu: GPUSpec,
    batch_size: int,
    k: int = 0,
    drafter: DrafterSpec | None = None,
    parallel: bool = False,
    context_tokens: float | None = None,
    params: RooflineParams | None = None,
) -> StepTime:
    """Predicted time of one engine step: B requests each verifying K drafts (B * (K + 1) tokens) plus drafting
    the next K. K = 0 is plain decoding: no drafter, no speculation overhead, whatever `drafter` is passed, so it
    is exactly the no-speculation baseline.

    Expert coverage uses `routed_tokens` (a request's K + 1 consecutive tokens route alike); at K = 0 it is B.
    """
    params = params or RooflineParams()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, but got {batch_size}.")
    if k < 0:
        raise ValueError(f"K must be >= 0, but got K={k}.")
    if k > 0 and drafter is None:
        raise ValueError(f"K={k} > 0 needs a drafter to price the drafting; pass drafter=... or K=0.")
    context = params.default_context_tokens if context_tokens is None else context_tokens
    routed = routed_tokens(batch_size, k, params.routing_locality)
    verify = target_pass(model, gpu, batch_size * (k + 1), batch_size, context, params, routed)
    if k == 0 or drafter is None:
        return StepTime(batch_size, 0, verify, DraftCost(ZERO_PASS, parallel), 0.0)
    draft = draft_cost(drafter, model, gpu, batch_size, k, parallel, context, params)
    spec_overhead = (params.spec_step_overhead_ms + batch_size * params.spec_request_overhead_ms
                     + batch_size * k * params.draft_token_overhead_ms)
    return StepTime(batch_size, k, verify, draft, spec_overhead)


def prefill_ms(
    model: ModelSpec,
    gpu: GPUSpec,
    prompt_tokens: int,
    drafter: DrafterSpec | None = None,
    params: RooflineParams | None = None,
) -> float:
    """Rough time to prefill one prompt of `prompt_tokens` tokens, ms (a TTFT estimate for an idle engine).

    One target pass over the prompt (each token attends to ``prompt / 2`` tokens on average under the causal
    mask), plus one drafter pass over it when speculating (EAGLE heads build their KV cache from the prompt).
    """
    params = params or RooflineParams()
    tokens = max(int(prompt_tokens), 1)
    cost = target_pass(model, gpu, tokens, 1, tokens / 2.0, params).total_ms
    if drafter is not None:
        cost += drafter_pass(drafter, model, gpu, tokens, tokens, 1, 1, tokens / 2.0, params).total_ms
    return cost


# ---- memory -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBudget:
    """Predicted device-memory use of a deployment, GB (10^9 bytes)."""

    usable_gb: float
    """gpu_memory_utilization * memory minus the runtime reserve."""
    weights_gb: float
    """Target weights as stored."""
    drafter_gb: float
    """Drafter weights (its embedding included)."""
    kv_gb_per_request: float
    """KV cache of one request at its longest context (target plus drafter layers)."""

    @property
    def kv_capacity_gb(self) -> float:
        return self.usable_gb - self.weights_gb - self.drafter_gb

    @property
    def max_requests(self) -> int:
        """Requests whose KV cache fits at once (0 when not even one does)."""
        if self.kv_capacity_gb <= 0:
            return 0
        return int(self.kv_capacity_gb / self.kv_gb_per_request) if self.kv_gb_per_request > 0 else 10**9

    def kv_gb(self, requests: int) -> float:
        return requests * self.kv_gb_per_request


def memory_budget(
    model: ModelSpec,
    gpu: GPUSpec,
    max_context_tokens: int,
    drafter: DrafterSpec | None = None,
    k: int = 0,
    params: RooflineParams | None = None,
) -> MemoryBudget:
    """Device memory a deployment needs (predicted from parameter counts, not measured).

    Example: gpt-oss-120b on one H100 (80 GB): usable 0.9 * 80 - 2 = 70 GB; weights 114.70 B * 0.53125 +
    2.13 B * 2 = 65.2 GB; its P-EAGLE head 1.714 B * 2 = 3.4 GB; leaving 1.4 GB of KV cache: 18 requests of
    1536 tokens at K=5 (2048 B * (18 * 1542 + 18 * 128) = 61.6 MB each in the target, 74.2 MB with the head's 4
    layers).
    """
    params = params or RooflineParams()
    usable = params.gpu_memory_utilization * gpu.memory_gb - params.runtime_reserve_gb
    drafter_gb = 0.0
    speculating = drafter if k > 0 else None
    if speculating is not None:
        _, stored = drafter_weight_params(speculating, model, params)
        drafter_gb = stored * params.drafter_bytes_per_param / 1e9
    kv = request_kv_bytes(model, max_context_tokens + k + 1, speculating)
    return MemoryBudget(usable, model.weight_bytes() / 1e9, drafter_gb, kv / 1e9)
