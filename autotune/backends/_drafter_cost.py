"""What drafting costs: the drafter head's passes per step, by layer and by slot (pure functions, predictions).

How vLLM 0.16+ drafts with an EAGLE-3 head (v1/spec_decode): the first drafter pass runs over every verified
position of the step (``B * (K + 1)`` tokens: it needs the target's hidden states there to extend its own KV
cache), the fusion layer maps those three target hidden states (3h) to h, and the LM head runs at one position per
request.

- Sequential (EAGLE-3): K - 1 more passes over B tokens each (one new draft token per request per pass).
- Parallel (P-EAGLE): the same single pass also carries K - 1 mask slots per request (``2 B K`` tokens in all) and
  evaluates the LM head at all ``B * K`` draft positions.

Each pass costs its weights (layers + fusion + LM head over the draft vocabulary) read once, its KV cache, its
FLOPs per token and per logit, the sampler over its logits, and a fixed `draft_pass_overhead_ms` (host-side input
preparation and launch) plus a kernel floor per layer. So sequential drafting pays K x the fixed cost and weight
reads; parallel drafting pays once but computes ``2 B K`` token rows and ``B K`` logit rows, which grows with
concurrency (the "per slot" cost that narrows P-EAGLE's lead at high concurrency).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.backends._roofline import ZERO_PASS, PassCost, RooflineParams, combine, compute_ms, memory_ms
from autotune.catalogs import DrafterSpec, GPUSpec, ModelSpec

__all__ = [
    "DraftCost",
    "draft_cost",
    "drafter_pass",
    "drafter_weight_params",
    "request_kv_bytes",
]


def _draft_vocab(drafter: DrafterSpec, target: ModelSpec) -> int:
    return drafter.draft_vocab_size or target.vocab_size


def drafter_weight_params(drafter: DrafterSpec, target: ModelSpec, params: RooflineParams) -> tuple[float, float]:
    """(streamed, stored) parameters of a drafter: streamed = what one pass reads (its layers, EAGLE-3's 3h -> h
    fusion layer, its LM head over the draft vocabulary); stored adds its input embedding (target vocabulary).

    Example: the 4-layer P-EAGLE head of gpt-oss-120b (h = 2880, full vocab 201088): 4 * 16 * 2880^2 = 531 M,
    3 * 2880^2 = 25 M, LM head 579 M -> 1.135 B streamed, 1.714 B stored (published: 1.7 B). A 1-layer EAGLE-3 head
    with a 32k draft vocabulary streams 133 M + 25 M + 92 M = 0.250 B.
    """
    h = drafter.hidden_size
    layers = drafter.num_layers * params.drafter_layer_params_per_h2 * h * h
    fusion = 3.0 * h * h if drafter.method in ("eagle3", "eagle") else 0.0
    lm_head = float(_draft_vocab(drafter, target) * h)
    streamed = layers + fusion + lm_head
    return streamed, streamed + target.vocab_size * h


def _drafter_kv_bytes_per_request(drafter: DrafterSpec, target: ModelSpec, context_tokens: float) -> float:
    # Drafter heads attend with the target's head geometry (EAGLE heads copy the target's attention config) and
    # keep full-context KV in every layer.
    return drafter.num_layers * target.kv_bytes_per_token_per_layer() * max(context_tokens, 0.0)


def request_kv_bytes(model: ModelSpec, context_tokens: int, drafter: DrafterSpec | None = None) -> float:
    """KV-cache bytes one request holds at `context_tokens` of context: the target's layers (sliding layers keep
    only the window) plus, when speculating, the drafter's layers (full context, the target's head geometry).

    Example: gpt-oss-120b, 1542 tokens: 2048 B * (18 * 1542 + 18 * 128) = 61.6 MB; with its 4-layer P-EAGLE
    head + 4 * 2048 * 1542 = 74.2 MB.
    """
    kv = model.kv_bytes(max(int(context_tokens), 0))
    if drafter is not None:
        kv += _drafter_kv_bytes_per_request(drafter, model, context_tokens)
    return kv


def drafter_pass(
    drafter: DrafterSpec,
    target: ModelSpec,
    gpu: GPUSpec,
    tokens: int,
    fused_tokens: int,
    logit_positions: int,
    requests: int,
    context_tokens: float,
    params: RooflineParams,
) -> PassCost:
    """One drafter forward pass: `tokens` rows through its layers (`fused_tokens` of them through the fusion layer
    first), its LM head at `logit_positions` rows, attention over `requests` contexts. Components: weights + KV
    against the layer/fusion/LM-head FLOPs, and the sampler over its logits."""
    h = drafter.hidden_size
    layers = drafter.num_layers * params.drafter_layer_params_per_h2 * h * h
    fusion = 3.0 * h * h if drafter.method in ("eagle3", "eagle") else 0.0
    vocab = _draft_vocab(drafter, target)
    lm_head = float(vocab * h)
    weight_bytes = (layers + fusion + lm_head) * params.drafter_bytes_per_param
    kv_bytes = requests * _drafter_kv_bytes_per_request(drafter, target, context_tokens)
    attention = 4.0 * target.num_attention_heads * target.head_dim * context_tokens * drafter.num_layers * tokens
    flops = 2.0 * tokens * layers + 2.0 * fused_tokens * fusion + 2.0 * logit_positions * lm_head + attention
    body = (compute_ms(flops, gpu.bf16_tflops, params), memory_ms(weight_bytes + kv_bytes, gpu, params))
    sampler = (0.0, memory_ms(logit_positions * vocab * params.sampler_bytes_per_logit, gpu, params))
    # +1 layer: the LM head is one more large kernel.
    overhead = params.draft_pass_overhead_ms + (drafter.num_layers + 1) * params.layer_overhead_ms
    return combine([body, sampler], flops, weight_bytes, kv_bytes, overhead, params.kernel_overlap_loss)


@dataclass(frozen=True)
class DraftCost:
    """Predicted drafting cost of one step: all drafter passes together."""

    cost: PassCost
    parallel: bool

    @property
    def passes(self) -> int:
        return self.cost.passes


def draft_cost(
    drafter: DrafterSpec,
    target: ModelSpec,
    gpu: GPUSpec,
    batch_size: int,
    k: int,
    parallel: bool,
    context_tokens: float,
    params: RooflineParams,
) -> DraftCost:
    """Cost of drafting K tokens for B requests (module docstring). K = 0 costs nothing.

    Example: gpt-oss-120b's P-EAGLE head, B = 1, K = 5: one pass over 10 rows with 5 logit rows in parallel; run
    sequentially, a pass over 6 rows then 4 passes over 1 row, each with 1 logit row.
    """
    if k < 0:
        raise ValueError(f"K must be >= 0, but got K={k}.")
    if k == 0:
        return DraftCost(ZERO_PASS, parallel)
    verified = batch_size * (k + 1)
    if parallel:
        rows = verified + batch_size * (k - 1)
        one = drafter_pass(drafter, target, gpu, rows, verified, batch_size * k, batch_size, context_tokens, params)
        return DraftCost(one, parallel=True)
    first = drafter_pass(drafter, target, gpu, verified, verified, batch_size, batch_size, context_tokens, params)
    if k == 1:
        return DraftCost(first, parallel=False)
    rest = drafter_pass(drafter, target, gpu, batch_size, 0, batch_size, batch_size, context_tokens, params)
    return DraftCost(first + rest.repeated(k - 1), parallel=False)
