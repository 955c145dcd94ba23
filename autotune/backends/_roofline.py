"""Roofline prediction of one target forward pass: pure functions over catalog specs, no GPU, no vLLM.

A decode step with speculation verifies ``T = B * (K + 1)`` tokens (B requests, K drafts each, plus the bonus
position) in one target pass. Every figure here is a PREDICTION from datasheet rates and parameter counts;
`RooflineParams` holds every assumed constant (the free ones are fitted to published throughput by
``benchmarks/calibrate_model.py``; values, priors and sources in ``autotune/backends/roofline.yaml``; the report
is docs/benchmarks/model.md).

The pass is a sum of components, each bounded by its own roofline (a kernel overlaps its own loads and math, not
another kernel's):

- dense matmuls (attention projections, router, LM head): all non-expert weights once per pass, ``2 T`` FLOPs per
  weight at the BF16 rate;
- MoE experts: only the experts the step's tokens route to (`expected_distinct_experts`); grouped GEMMs pad each
  active expert's rows to a tile that grows with rows per expert (`moe_tile`) and run at `moe_compute_efficiency`
  of the tensor peak,
  so they are memory-bound at decode batch sizes and turn compute-bound once enough tokens share each expert
  (what makes verification stop being free at high concurrency);
- attention over the KV cache: each request reads its context once whatever K (the K + 1 queries share it),
  sliding-window layers at most the window; FLOPs grow with every query token;
- logits and sampling: ``T * vocab`` logits written and read by the sampler (`sampler_bytes_per_logit`);

at the ACHIEVABLE rates (datasheet * `bandwidth_efficiency` / `compute_efficiency`), each kernel hiding only part
of its smaller term under the larger (`kernel_overlap_loss`), plus fixed costs that do not shrink on a faster GPU:
per step (scheduler, input preparation, output processing), per running request, per layer (kernel floors).
Tokens of one request are consecutive, so their routing overlaps (`routing_locality`).

Worked example (gpt-oss-120b on one H200, B = 1, context 1280, K = 0): 3.10 GB of non-expert weights + 4 experts
x 36 layers x 13.2 MB = 1.90 GB + 0.05 GB of KV -> 5.06 GB at 4.8 TB/s * efficiency; plus the step, request and
36 layer overheads.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from autotune.catalogs import GPUSpec, ModelSpec
from autotune.errors import UsageError

__all__ = [
    "Bound",
    "PassCost",
    "RooflineParams",
    "ZERO_PASS",
    "fitted_constants",
    "speedup_log_sigma",
    "attention_flops_per_token",
    "compute_ms",
    "expected_distinct_experts",
    "memory_ms",
    "moe_tile",
    "routed_tokens",
    "scaled_gpu",
    "target_pass",
    "tensor_tflops",
]

Bound = Literal["memory", "compute"]

#: The fitted constants and the speedup spread, with their priors and sources (benchmarks/calibrate_model.py).
CONSTANTS_FILE = Path(__file__).with_name("roofline.yaml")


@functools.cache
def fitted_constants() -> dict[str, Any]:
    """The data file's contents: ``constants`` (name -> {value, prior, source}) and ``speedup_log_sigma``."""
    data = yaml.safe_load(CONSTANTS_FILE.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("constants"), dict):
        raise UsageError(f"{CONSTANTS_FILE} must hold a `constants` mapping; reinstall peagle-tune.")
    return data


def _fitted(name: str) -> float:
    return float(fitted_constants()["constants"][name]["value"])


def speedup_log_sigma() -> float:
    """One sigma of a predicted speedup on the log scale, from the calibration's residuals."""
    return float(fitted_constants().get("speedup_log_sigma", 0.0))


@dataclass(frozen=True)
class RooflineParams:
    """Every constant the roofline assumes (ms, fractions, tokens).

    The FITTED ones (`bandwidth_efficiency`, `compute_efficiency`, `moe_compute_efficiency`, `step_overhead_ms`,
    `draft_pass_overhead_ms`, `routing_locality`, `spec_request_overhead_ms`, `kernel_overlap_loss`,
    `draft_token_overhead_ms`) default to the values in ``autotune/backends/roofline.yaml`` (`fitted_constants`),
    which also holds each one's prior (mean, sigma) and the source of that prior. ``python -m
    benchmarks.calibrate_model --fit --write`` fits them to the published throughput points in
    ``autotune/backends/model_calibration.yaml`` (least squares on log errors plus those priors) and rewrites the
    values. The others are set from kernel and engine facts, not fitted. A `Calibration` fitted from one measured
    profile corrects the predicted step times for a real deployment.
    """

    bandwidth_efficiency: float = _fitted("bandwidth_efficiency")
    """FITTED. Fraction of the datasheet HBM bandwidth decode kernels achieve (bandwidth tests on H100/H200/B200
    reach ~90% of peak, tuned GEMV/attention/grouped-GEMM kernels less)."""
    compute_efficiency: float = _fitted("compute_efficiency")
    """FITTED. Fraction of the dense tensor-core peak that dense matmuls and attention achieve at decode shapes
    (cuBLAS reaches 70-80% on large square bf16 GEMMs; decode shapes, a few hundred rows, less)."""
    moe_compute_efficiency: float = _fitted("moe_compute_efficiency")
    """FITTED. Fraction of the tensor-core peak (of the expert weight format, `tensor_tflops`) that grouped MoE GEMMs
    achieve: many small per-expert tiles, token permutes and (on Hopper) in-loop MXFP4 -> bf16 dequantisation keep
    them well below dense GEMMs. This is what turns verification compute-bound at high concurrency."""
    moe_tile_rows: int = 16
    """Smallest row tile of a grouped MoE GEMM: each active expert's token rows are padded up to a multiple of the
    tile (`moe_tile`). With m tokens on an expert the padded rows average ``max(tile, m + tile / 2)`` (at least one
    tile; above it, half a tile of waste)."""
    moe_max_tile_rows: int = 128
    """Largest row tile. The tile grows with the routed rows per expert: triton_kernels' ``matmul_ogs`` (vLLM's
    gpt-oss MXFP4 MoE path on Hopper) picks ``block_m = max(16, min(next_pow2(rows // experts), 128))`` (the
    heuristic vLLM restates in ``fused_moe/experts/gpt_oss_triton_kernels_moe.py``); other grouped-GEMM backends
    scale their tiles with tokens per expert alike. A larger tile wastes more padded rows once experts hold more
    than 16 rows each (gpt-oss-20b's 32 experts from ~concurrency 16 with K >= 3)."""
    step_overhead_ms: float = _fitted("step_overhead_ms")
    """FITTED. Per engine step, ms: scheduling, input preparation, sampler launch and output processing that
    async scheduling does not hide (vLLM V1 spends a few hundred microseconds of CPU per step)."""
    request_overhead_ms: float = 0.008
    """Per running request per step, ms: the scheduler's and output processor's per-request Python work (~5-10 us
    each in vLLM V1), which is what fixed costs grow with at high concurrency."""
    layer_overhead_ms: float = 0.015
    """Per decoder layer per forward pass, ms: ~5 kernels (norm, QKV, attention, O-proj, MLP) of >= ~3 us each,
    the floor of a small kernel (launch gap under CUDA graphs plus ramp and tail) whatever the bytes it moves."""
    moe_layer_overhead_ms: float = 0.030
    """Extra per mixture-of-experts layer per pass, ms: router GEMM, top-k, token permute, two grouped GEMMs,
    activation, un-permute: ~8 more small kernels at ~4 us."""
    spec_step_overhead_ms: float = 0.15
    """Extra per step that speculates, ms: rejection sampling kernels, draft bookkeeping, one more host sync."""
    spec_request_overhead_ms: float = _fitted("spec_request_overhead_ms")
    """FITTED. Extra per running request per step that speculates, ms: the host-side work speculation adds per
    request (the scheduler appending and trimming K draft token ids and the accepted count, spec-decode metadata
    and the drafter's per-request input preparation), exposed because the accepted count must reach the host
    before the next step is scheduled (~2-4x the 8 us of a plain decode step's per-request work). It is the term
    that grows with concurrency whatever the weights: it damps, but does not reverse, the rise of gpt-oss-120b's
    gain from c = 8 to c = 64 (docs/benchmarks/model.md, "What limits the result")."""
    kernel_overlap_loss: float = _fitted("kernel_overlap_loss")
    """FITTED. Share of the smaller of a kernel's compute and memory times it does NOT hide under the larger
    (0 = perfect overlap, the plain roofline ``max``; 1 = none, ``compute + memory``). A GEMM overlaps loads and
    math only in its steady state: the first tiles load before any math (prologue) and the last math and stores
    run after the loads end (epilogue); at decode shapes a kernel runs one or two waves of tiles per SM, so these
    ends are a large share of it. It makes the cost of extra verified tokens visible before a component turns
    compute-bound."""
    draft_token_overhead_ms: float = _fitted("draft_token_overhead_ms")
    """FITTED. Host cost per draft token slot per speculating step (B * K), ms: vLLM V1 turns the [B, K] draft ids
    and the [B, K + 1] sampled ids into Python lists each step, the scheduler stores K spec token ids per request
    and validates each accepted token (stop checks); work per token, not per request."""
    moe_row_bytes_per_hidden: float = 16.0
    """Activation bytes per routed row (token x expert) per MoE layer, in units of hidden_size: the token
    permute/gather (h bf16 read), the gate_up output written and read (2 x 2h bf16), the activation written and
    read (2 x h), the down output written and read for the weighted combine (2 x h): 2 * (1 + 4 + 2 + 2) ~ 16-18
    h bytes. Token-proportional traffic the weight roofline misses (gpt-oss: 46 KB per row per layer)."""
    draft_pass_overhead_ms: float = _fitted("draft_pass_overhead_ms")
    """FITTED. Per drafter forward pass, ms: preparing its inputs (hidden-state gather, positions, slot mapping,
    attention metadata, done on the host per pass), its launch and the argmax over its logits; its layers and LM
    head add `layer_overhead_ms` each on top. vLLM's sequential EAGLE loop pays it K times, parallel drafting once
    (vLLM PR #32628 sees sequential TPOT grow ~0.24 ms per extra draft token at concurrency 1)."""
    routing_locality: float = _fitted("routing_locality")
    """FITTED. Share of a token's experts already chosen by the previous token of the same request (consecutive
    tokens route alike): the K + 1 verified tokens of one request touch experts like ``1 + K * (1 - locality)``
    independent tokens. 0 = independent routing. Its prior comes from the measured local routing consistency of
    MoEs like gpt-oss (arXiv 2505.16056)."""
    sampler_bytes_per_logit: float = 12.0
    """Bytes moved per logit (token x vocabulary entry) by the LM head output and the sampler: bf16 written and
    read (4 B), float32 copy written and read (8 B)."""
    drafter_layer_params_per_h2: float = 16.0
    """Parameters of one drafter decoder layer in units of hidden_size^2. The published gpt-oss-120b P-EAGLE head
    (1.7 B parameters, 1.16 B of them embedding + LM head, 4 layers) implies ~16 h^2 per layer."""
    drafter_bytes_per_param: float = 2.0
    """Drafter heads are published in bf16."""
    gpu_memory_utilization: float = 0.9
    """vLLM's default --gpu-memory-utilization: the share of device memory the engine may use."""
    runtime_reserve_gb: float = 2.0
    """GB set aside inside that share for the CUDA context, CUDA graphs and peak activations (what vLLM's memory
    profiling subtracts before sizing the KV cache; ~1-3 GB for decode-sized batches)."""
    default_prompt_tokens: int = 1024
    """Prompt length assumed when a workload gives none (tokens)."""
    default_output_tokens: int = 512
    """Output length assumed when a workload gives none (tokens). Mean context = prompt + output / 2 = 1280."""
    chars_per_token: float = 4.0
    """Characters per token used to estimate a prompt's length from its text (English BPE averages ~4)."""

    def __post_init__(self) -> None:
        for name in ("bandwidth_efficiency", "compute_efficiency", "moe_compute_efficiency", "gpu_memory_utilization"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise UsageError(f"RooflineParams.{name} is a fraction in (0, 1], but got {name}={value}.")
        if not 0.0 <= self.kernel_overlap_loss <= 1.0:
            raise UsageError(
                f"RooflineParams.kernel_overlap_loss is a fraction in [0, 1], but got {self.kernel_overlap_loss}."
            )
        if not 0.0 <= self.routing_locality < 1.0:
            raise UsageError(
                f"RooflineParams.routing_locality is a fraction in [0, 1), but got {self.routing_locality}."
            )
        for name in (
            "step_overhead_ms",
            "request_overhead_ms",
            "layer_overhead_ms",
            "moe_layer_overhead_ms",
            "spec_step_overhead_ms",
            "spec_request_overhead_ms",
            "moe_row_bytes_per_hidden",
            "draft_pass_overhead_ms",
            "draft_token_overhead_ms",
            "sampler_bytes_per_logit",
            "runtime_reserve_gb",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise UsageError(f"RooflineParams.{name} must be a finite number >= 0, but got {name}={value}.")
        for name in ("drafter_layer_params_per_h2", "drafter_bytes_per_param", "chars_per_token"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise UsageError(f"RooflineParams.{name} must be > 0, but got {name}={value}.")
        if not 1 <= self.moe_tile_rows <= self.moe_max_tile_rows:
            raise UsageError(
                "RooflineParams.moe_tile_rows must be >= 1 and <= moe_max_tile_rows, but got "
                f"moe_tile_rows={self.moe_tile_rows}, moe_max_tile_rows={self.moe_max_tile_rows}."
            )
        if self.default_prompt_tokens < 1 or self.default_output_tokens < 1:
            raise UsageError(
                "RooflineParams.default_prompt_tokens and default_output_tokens must be >= 1, but got "
                f"{self.default_prompt_tokens} and {self.default_output_tokens}."
            )

    @property
    def default_context_tokens(self) -> int:
        """Mean context a request holds while decoding: its prompt plus half its output (tokens)."""
        return self.default_prompt_tokens + self.default_output_tokens // 2


# ---- building blocks ----------------------------------------------------------------------------------------


def expected_distinct_experts(num_experts: int, experts_per_token: int, tokens: float) -> float:
    """Expected number of distinct experts one MoE layer runs for `tokens` tokens, each routed to
    `experts_per_token` (k) of `num_experts` (E) experts, uniformly and independently across tokens.

    Derivation: a given expert is among one token's k choices with probability k/E, so it is missed by all n
    tokens with probability (1 - k/E)^n. Summing the indicator "expert e is used" over the E experts (linearity of
    expectation) gives ``E * (1 - (1 - k/E)^n)``. n = 1 gives exactly k; as n grows it tends to E (every expert's
    weights are read once per step, however many tokens use them). A fractional n is the effective count of
    independent tokens when routing is correlated (`routed_tokens`).

    Examples: ``(128, 4, 1) -> 4.0``; ``(128, 4, 6) -> 22.20`` (6 independent tokens); ``(128, 4, 384) -> 128.0``
    (to 4 decimals); a dense model (E = 0) has no experts: ``(0, 0, n) -> 0.0``.
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, but got {tokens}.")
    if num_experts <= 0:
        return 0.0
    if not 0 < experts_per_token <= num_experts:
        raise ValueError(
            f"experts_per_token must be in [1, num_experts={num_experts}] for an MoE model, but got "
            f"{experts_per_token}."
        )
    miss = 1.0 - experts_per_token / num_experts
    return float(num_experts * (1.0 - miss**tokens))


def routed_tokens(batch_size: int, k: int, locality: float) -> float:
    """Effective independent tokens of B requests verifying K drafts each: ``B * (1 + K * (1 - locality))``.

    The K + 1 tokens of one request are consecutive text, so each after the first brings only ``1 - locality`` of
    a fresh token's new experts. Example: B = 1, K = 7, locality 0.3 -> 5.9 (not 8).
    """
    return batch_size * (1.0 + k * (1.0 - locality))


def moe_tile(routed_rows: float, num_experts: int, params: RooflineParams) -> int:
    """Row tile of the grouped MoE GEMMs for `routed_rows` (token x expert) rows over `num_experts` experts:
    ``max(min_tile, min(next_pow2(rows // experts), max_tile))`` (`RooflineParams.moe_max_tile_rows`).

    Examples (tiles 16..128): gpt-oss-120b (128 experts, top-4) at 64 requests x 5 verified tokens: 1280 rows,
    10 per expert -> 16; gpt-oss-20b (32 experts) at the same step: 40 per expert -> 64.
    """
    per_expert = int(routed_rows) // max(num_experts, 1)
    tile = 1 << max(per_expert - 1, 0).bit_length()  # next power of two >= per_expert (1 for 0 or 1)
    return max(params.moe_tile_rows, min(tile, params.moe_max_tile_rows))


def tensor_tflops(bytes_per_param: float, gpu: GPUSpec) -> float:
    """Dense tensor-core TFLOP/s that matmuls over weights stored at `bytes_per_param` run at on `gpu`.

    8-bit weights (fp8) run on FP8 tensor cores where the GPU has them. 4-bit weights (MXFP4, NVFP4) run at the
    FP8 rate on GPUs with FP4 tensor cores (Blackwell: vLLM's gpt-oss path quantises activations to MXFP8, W4A8)
    and at the BF16 rate elsewhere (Hopper, Ampere: the kernels dequantise to bf16, W4A16). Everything else runs at
    BF16. Example: MXFP4 (0.53 B) on an H200 -> 989 (BF16); on a B200 -> 4500 (FP8).
    """
    if bytes_per_param <= 0.75:
        if gpu.fp4_tflops is not None and gpu.fp8_tflops is not None:
            return gpu.fp8_tflops
        return gpu.bf16_tflops
    if bytes_per_param <= 1.0 and gpu.fp8_tflops is not None:
        return gpu.fp8_tflops
    return gpu.bf16_tflops


def scaled_gpu(gpu: GPUSpec, tensor_parallel_size: int) -> GPUSpec:
    """`tensor_parallel_size` GPUs seen as one: memory, bandwidth and compute add up (all-reduce time is not
    modelled, so tp > 1 is optimistic). tp = 1 returns `gpu` itself."""
    if tensor_parallel_size < 1:
        raise UsageError(f"tensor_parallel_size must be >= 1, but got {tensor_parallel_size}.")
    if tensor_parallel_size == 1:
        return gpu
    tp = tensor_parallel_size

    def times(x: float | None) -> float | None:
        return None if x is None else x * tp

    return replace(
        gpu,
        display_name=f"{tp}x {gpu.display_name}",
        memory_gb=gpu.memory_gb * tp,
        memory_bandwidth_gbps=gpu.memory_bandwidth_gbps * tp,
        bf16_tflops=gpu.bf16_tflops * tp,
        fp8_tflops=times(gpu.fp8_tflops),
        fp4_tflops=times(gpu.fp4_tflops),
    )


def _sliding_layers(model: ModelSpec) -> float:
    return model.num_layers * model.sliding_window_layer_fraction if model.sliding_window else 0.0


def attention_flops_per_token(model: ModelSpec, context_tokens: float) -> float:
    """Attention FLOPs of one query token over `context_tokens` of context, all layers: ``4 * heads * head_dim *
    context`` per layer (2 for Q.K^T, 2 for P.V), with sliding-window layers seeing at most the window.

    Example: Llama-3.1-8B (32 layers, 32 heads of 128), 1000 tokens: 4 * 32 * 128 * 1000 * 32 = 524 MFLOP, against
    2 * 7.5 B = 15 GFLOP for its weights.
    """
    per_layer = 4.0 * model.num_attention_heads * model.head_dim
    sliding = _sliding_layers(model)
    window = min(context_tokens, model.sliding_window) if model.sliding_window else context_tokens
    return per_layer * ((model.num_layers - sliding) * context_tokens + sliding * window)


def _expert_params_per_expert_layer(model: ModelSpec) -> float:
    if model.num_experts <= 0 or model.expert_params_b <= 0:
        return 0.0
    return model.expert_params_b * 1e9 / (model.num_experts * model.num_layers)


def _streamed_other_params(model: ModelSpec) -> float:
    """Non-expert parameters a forward pass reads: all but the input-embedding table (a gather), which is only
    read whole when it is tied to the LM head."""
    other = (model.total_params_b - model.expert_params_b) * 1e9
    if not model.tie_word_embeddings:
        other -= model.vocab_size * model.hidden_size
    return max(other, 0.0)


# ---- pass cost ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassCost:
    """Predicted cost of forward pass(es): FLOPs, bytes and the times they imply (ms).

    `busy_ms` is the sum over the pass's components of each one's ``max(compute, memory)``; `compute_ms` and
    `memory_ms` are the sums of the components' compute and memory times (for reports); `compute_bound_ms` is the
    part of `busy_ms` spent in compute-bound components.
    """

    flops: float
    weight_bytes: float
    kv_bytes: float
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    busy_ms: float
    compute_bound_ms: float = 0.0
    passes: int = 1
    components: tuple[tuple[str, float], ...] = ()
    """Busy time per named component, ms (a target pass: weights, experts, attention_kv, sampler); empty after
    passes are added or repeated."""

    @property
    def total_ms(self) -> float:
        return self.busy_ms + self.overhead_ms

    @property
    def bound(self) -> Bound:
        """What limits most of the busy time: "compute" or "memory"."""
        return "compute" if self.compute_bound_ms > self.busy_ms / 2.0 else "memory"

    def repeated(self, n: int) -> PassCost:
        """`n` identical sequential passes."""
        return PassCost(*(getattr(self, f) * n for f in _FIELDS))

    def __add__(self, other: PassCost) -> PassCost:
        """Two passes run one after the other."""
        return PassCost(*(getattr(self, f) + getattr(other, f) for f in _FIELDS))


_FIELDS = (
    "flops",
    "weight_bytes",
    "kv_bytes",
    "compute_ms",
    "memory_ms",
    "overhead_ms",
    "busy_ms",
    "compute_bound_ms",
    "passes",
)

ZERO_PASS = PassCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, passes=0)


def memory_ms(nbytes: float, gpu: GPUSpec, params: RooflineParams) -> float:
    """Time to move `nbytes` at the achievable bandwidth, ms."""
    return nbytes / (gpu.memory_bandwidth_gbps * 1e9 * params.bandwidth_efficiency) * 1e3


def compute_ms(flops: float, tflops: float, params: RooflineParams) -> float:
    """Time for `flops` at the achievable fraction of a `tflops` tensor rate, ms."""
    return flops / (tflops * 1e12 * params.compute_efficiency) * 1e3


def combine(parts: list[tuple[float, float]], flops: float, weight_bytes: float, kv_bytes: float,
            overhead_ms: float, overlap_loss: float = 0.0, names: tuple[str, ...] = ()) -> PassCost:
    """A PassCost from its components' (compute_ms, memory_ms), each bounded by its own roofline, plus
    `overlap_loss` of the smaller of the two (`RooflineParams.kernel_overlap_loss`)."""
    times = [max(c, m) + overlap_loss * min(c, m) for c, m in parts]
    busy = sum(times)
    bound = sum(c for c, m in parts if c > m)
    return PassCost(
        flops,
        weight_bytes,
        kv_bytes,
        sum(c for c, _ in parts),
        sum(m for _, m in parts),
        overhead_ms,
        busy,
        bound,
        components=tuple(zip(names, times, strict=True)) if names else (),
    )


def target_pass(
    model: ModelSpec,
    gpu: GPUSpec,
    tokens: int,
    requests: int,
    context_tokens: float,
    params: RooflineParams,
    routed: float | None = None,
) -> PassCost:
    """One target forward pass over `tokens` tokens of `requests` requests, each with `context_tokens` of context.

    `routed`: effective independent tokens for expert coverage (`routed_tokens`); default `tokens`. Components
    (module docstring): dense weights, MoE experts (tile-padded grouped GEMMs), attention over the KV cache, logits
    and sampling. Overhead: `step_overhead_ms` + per-request + per-layer overheads.
    """
    if tokens < 1 or requests < 1:
        raise ValueError(f"a pass needs tokens >= 1 and requests >= 1, but got tokens={tokens}, {requests=}.")
    bf16 = gpu.bf16_tflops
    other = _streamed_other_params(model)
    dense_bytes = other * model.bytes_per_param_other
    dense_flops = 2.0 * tokens * other
    dense = (compute_ms(dense_flops, tensor_tflops(model.bytes_per_param_other, gpu), params),
             memory_ms(dense_bytes, gpu, params))

    per_expert = _expert_params_per_expert_layer(model)
    experts = expected_distinct_experts(model.num_experts, model.experts_per_token,
                                        tokens if routed is None else min(float(routed), float(tokens)))
    moe_bytes = model.num_layers * experts * per_expert * model.bytes_per_param_expert
    # Token-proportional activation traffic of the routed rows (not weights: reported apart from weight_bytes).
    row_bytes = (model.num_layers * tokens * model.experts_per_token * model.hidden_size
                 * params.moe_row_bytes_per_hidden) if experts > 0 else 0.0
    routed_rows = tokens * model.experts_per_token
    tile = float(moe_tile(routed_rows, model.num_experts, params))
    rows = max(experts * tile, routed_rows + experts * tile / 2.0) if experts > 0 else 0.0
    moe_flops = 2.0 * model.num_layers * rows * per_expert
    # compute_ms applies compute_efficiency; grouped MoE GEMMs run at moe_compute_efficiency instead.
    moe_rate = tensor_tflops(model.bytes_per_param_expert, gpu) * params.moe_compute_efficiency
    moe = (compute_ms(moe_flops, moe_rate / params.compute_efficiency, params),
           memory_ms(moe_bytes + row_bytes, gpu, params))

    kv_bytes = requests * model.kv_bytes(max(int(round(context_tokens)), 0))
    attn_flops = tokens * attention_flops_per_token(model, context_tokens)
    attention = (compute_ms(attn_flops, bf16, params), memory_ms(kv_bytes, gpu, params))

    sampler = (0.0, memory_ms(tokens * model.vocab_size * params.sampler_bytes_per_logit, gpu, params))

    moe_overhead = params.moe_layer_overhead_ms if model.num_experts > 0 else 0.0
    overhead = (
        params.step_overhead_ms
        + requests * params.request_overhead_ms
        + model.num_layers * (params.layer_overhead_ms + moe_overhead)
    )
    return combine([dense, moe, attention, sampler], dense_flops + moe_flops + attn_flops,
                   dense_bytes + moe_bytes, kv_bytes, overhead, params.kernel_overlap_loss,
                   ("weights", "experts", "attention_kv", "sampler"))
