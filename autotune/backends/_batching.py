"""How many requests one predicted step holds, and the prompt work each decode step carries (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.backends._shape import WorkloadShape
from autotune.spec import Scenario, SpecConfig

__all__ = ["batch_size", "prompt_ms_per_step", "step_slots"]


def step_slots(config: SpecConfig, scenario: Scenario, k: int) -> int:
    """Requests one step can hold: min(concurrency, max_num_seqs) (closed loop; max_num_seqs for an open loop), and
    at most max_num_batched_tokens // (K + 1), since each request verifies K + 1 tokens. 0 when not even one request
    fits."""
    held = config.max_num_seqs if scenario.request_rate is not None else min(scenario.concurrency, config.max_num_seqs)
    if config.max_num_batched_tokens is not None:
        held = min(held, config.max_num_batched_tokens // (k + 1))
    return held


def batch_size(
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


def prompt_ms_per_step(cost_model: Any, batch: int, k: int, length: float, shape: WorkloadShape) -> float:
    """Prompt processing per decode step, ms, for a fitted (measured) cost model; 0 for the roofline (None).

    Closed loop at B requests: while a request generates its O output tokens (O / AL steps) the B running
    requests are replaced once on average, and each newcomer's P prompt tokens ride in a decode step at the
    fit's marginal cost per token. So every decode step carries B * AL / O of a prompt: on short outputs
    (the CPU fixtures: 48 tokens) prompts are a large share of the wall time. The roofline's constants were
    fitted to published end-to-end throughput, which already absorbs prompt processing.
    """
    predict_tokens = getattr(cost_model, "predict_tokens", None)
    if cost_model is None or predict_tokens is None or shape.output_tokens <= 0:
        return 0.0
    verified = batch * (k + 1)
    prompt = max(int(round(shape.prompt_tokens)), 1)
    marginal = float(predict_tokens(batch, verified + prompt, k > 0, k)) - float(
        predict_tokens(batch, verified, k > 0, k))
    return max(marginal, 0.0) * batch * length / shape.output_tokens
