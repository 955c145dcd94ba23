"""CUDA-graph modes of decode steps: which steps replay FULL graphs, and what running PIECEWISE costs. Pure.

vLLM 0.32 on a GPU captures FULL CUDA graphs only for a *uniform decode* batch: every request schedules exactly
``1 + K`` tokens, K the launch's ``num_speculative_tokens`` (``uniform_decode_query_len``,
``vllm/v1/worker/gpu_model_runner.py`` ~870 and 3663-3668; dispatch in ``vllm/v1/cudagraph_dispatcher.py``
300-316). Any other decode step (a lower depth for some or all requests, trimmed drafts, an off-step with one token
per request, a step with prompt tokens) runs PIECEWISE: the graph pieces between attention layers replay, attention
runs eagerly. A batch-size schedule (``num_speculative_tokens_per_batch_size``) makes vLLM capture PIECEWISE only
(``vllm/config/vllm.py`` 1049-1056). On the CPU build there are no graphs (NONE): every step is alike.

The penalty of PIECEWISE against FULL is priced as a fixed time per step, the eager attention launches of every
layer: `PIECEWISE_PENALTY_SHARE` of the launch's single-stream FULL step. Source: vLLM issue #49548, Qwen3.5-122B
MTP K=2 single stream, 59.6 tok/s with FULL_AND_PIECEWISE against 50.0 tok/s forced to PIECEWISE: a PIECEWISE step
takes 59.6 / 50.0 = 1.192 times the FULL one. A fixed cost is a larger share of a small batch's step than of a large
one's, as launch overheads are. A profile on a GPU measures it (its phases below K_max ran PIECEWISE) and the
plugin refines it online (`policies.StepCostModel`, feature ``piecewise``).
"""

from __future__ import annotations

__all__ = [
    "FULL_GRAPH_MODES",
    "GRAPH_MODES",
    "PIECEWISE_PENALTY_SHARE",
    "full_graph_depth",
    "piecewise_penalty_ms",
    "step_graph_mode",
]

GRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""vLLM's ``CUDAGraphMode`` names (``vllm/config/compilation.py``)."""
FULL_GRAPH_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""Launch modes under which uniform decode steps replay FULL graphs."""
PIECEWISE_PENALTY_SHARE = 59.6 / 50.0 - 1.0
"""Extra time of a PIECEWISE step over the FULL single-stream step, as a share of the latter (vLLM #49548: 0.192)."""


def full_graph_depth(launch_mode: str | None, num_speculative_tokens: int, *, schedule: bool = False) -> int | None:
    """The verified depth whose uniform decode steps replay FULL graphs in a launch, or None when no step does.

    ``launch_mode``: the launch's CUDA-graph mode (`autotune.engine.EngineVariant.cudagraph_mode`; None: unknown,
    taken as no graphs). ``num_speculative_tokens``: the launch's K (0 without speculation: plain decode steps of one
    token per request are the uniform ones). ``schedule``: a batch-size schedule is configured (vLLM then runs
    PIECEWISE only).

    Example: ``full_graph_depth("FULL_AND_PIECEWISE", 5) == 5``; ``full_graph_depth("NONE", 5) is None``.
    """
    if launch_mode not in FULL_GRAPH_MODES or schedule:
        return None
    return max(int(num_speculative_tokens), 0)


def step_graph_mode(launch_mode: str | None, full_depth: int | None, batch_size: int, verified_tokens: int,
                    prompt_tokens: int = 0) -> str:
    """The graph mode one step runs under: FULL, PIECEWISE or NONE.

    ``full_depth``: `full_graph_depth` of the launch. A decode step of B requests verifying V tokens in all is uniform
    at K iff ``V == B * (K + 1)`` (no request verifies more than the launch's K), and has no prompt tokens.

    Example: a FULL_AND_PIECEWISE launch at K=4, 8 requests verifying 4 drafts each (V = 40): FULL; one of them at 2
    (V = 38): PIECEWISE.
    """
    if launch_mode is None or launch_mode == "NONE":
        return "NONE"
    if full_depth is not None and prompt_tokens == 0 and verified_tokens == batch_size * (full_depth + 1):
        return "FULL"
    return "PIECEWISE"


def piecewise_penalty_ms(single_stream_full_step_ms: float) -> float:
    """Prior extra ms of a PIECEWISE step over a FULL one: `PIECEWISE_PENALTY_SHARE` of the single-stream FULL
    step at the launch's depth. Example: a 6.65 ms single-stream step -> 1.28 ms per PIECEWISE step."""
    if not single_stream_full_step_ms > 0:
        raise ValueError(f"the single-stream step time must be > 0 ms, but got {single_stream_full_step_ms}.")
    return PIECEWISE_PENALTY_SHARE * float(single_stream_full_step_ms)
