"""The detail figures of a prediction beyond the headline metrics: what the roofline step is made of, and the
warnings on what the prediction assumes."""

from __future__ import annotations

from typing import Any

from autotune.backends._acceptance import WorkloadAcceptance
from autotune.backends._roofline import RooflineParams, expected_distinct_experts, routed_tokens
from autotune.backends._step import Calibration, step_time
from autotune.catalogs import DrafterSpec, GPUSpec, ModelSpec
from autotune.spec import SpecConfig

__all__ = ["prediction_warnings", "roofline_figures"]


def roofline_figures(
    model: ModelSpec,
    gpu: GPUSpec,
    params: RooflineParams,
    calibration: Calibration | None,
    config: SpecConfig,
    drafter: DrafterSpec | None,
    batch: int,
    context: float,
) -> dict[str, Any]:
    """One step of `config` at `batch` requests and `context` tokens of context, by part (ms, calibrated), with
    what bounds it and the bytes it reads."""
    st = step_time(model, gpu, batch, config.k, drafter, config.parallel_drafting, context, params)
    cal = calibration or Calibration()
    return {
        "verify_ms": cal.scale_verify * st.verify_ms,
        "draft_ms": cal.scale_draft * st.draft_ms,
        "overhead_ms": cal.scale_verify * (st.verify.overhead_ms + st.spec_overhead_ms)
        + cal.scale_draft * st.draft.cost.overhead_ms
        + cal.overhead_ms,
        "bound": st.bound,
        "step_breakdown_ms": st.breakdown(calibration),
        "draft_passes": st.draft.passes,
        "experts_per_layer": expected_distinct_experts(
            model.num_experts,
            model.experts_per_token,
            min(routed_tokens(batch, config.k, params.routing_locality), batch * (config.k + 1)),
        ),
        "kv_read_gb_per_step": st.verify.kv_bytes / 1e9,
        "weights_read_gb_per_step": st.verify.weight_bytes / 1e9,
    }


def prediction_warnings(
    config: SpecConfig, drafter: DrafterSpec | None, acceptance: WorkloadAcceptance | None
) -> list[str]:
    """What the prediction of `config` assumes that may not hold: acceptance borrowed from another workload, K
    beyond the drafter's training, a hypothetical drafter, a parallel-drafting head run sequentially."""
    warnings = list(acceptance.warnings) if acceptance is not None else []
    if drafter is None:
        return warnings
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
    return warnings
