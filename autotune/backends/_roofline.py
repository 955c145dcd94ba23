"""Roofline prediction of one vLLM engine step: pure functions over catalog specs, no GPU, no vLLM.

One decode step with speculation verifies ``B * (K + 1)`` tokens (B requests, K drafts each, plus the bonus
position) in one target forward pass and drafts the next K tokens with the drafter. Every figure here is a
PREDICTION from datasheet rates and parameter counts; `RooflineParams` holds every assumed constant and
`Calibration` corrects the result from measured step times.

A pass takes ``max(compute, memory) + overhead`` where

- memory = (weight bytes read + KV-cache bytes read) / (datasheet bandwidth * `bandwidth_efficiency`);
- compute = FLOPs / (dense tensor rate of the weight format * `compute_efficiency`);
- overhead = fixed launch and scheduling time that does not shrink with a faster GPU (see `RooflineParams`).

Weight bytes read by the target: every non-expert weight once (the input-embedding table is a gather of B rows,
not a read of the whole table, so it is left out unless it doubles as the LM head) plus, for a mixture-of-experts
model, only the experts the step's tokens are routed to (`expected_distinct_experts`). A dense model reads all
its weights. KV bytes: each request reads its own context once per step, whatever K (the K+1 query tokens share
it); sliding-window layers read at most the window.

Worked example (gpt-oss-120b on one H200, B=1, context 1280 tokens, default params):

- K=0: 1.551 B non-expert params * 2 B = 3.10 GB, plus 4 experts * 36 layers * 13.22 MB = 1.90 GB, plus KV
  2048 B * (18 * 1280 + 18 * 128) = 0.05 GB -> 5.06 GB / (4800 GB/s * 0.8) = 1.32 ms; 2 * 5.13 GFLOP = 10 GFLOP
  is nothing at 593 TFLOP/s; overhead 0.5 + 36 * (0.015 + 0.030) = 2.12 ms -> 3.44 ms per step (291 tokens/s).
- K=5: the 6 verified tokens touch 128 * (1 - (1 - 4/128)^6) = 22.2 experts per layer, not 4, so the pass
  reads 13.7 GB (3.57 ms); the P-EAGLE head (4 layers of 12 * 2880^2, a 3h -> h fusion layer and a 201088-row LM
  head, bf16) reads 2.0 GB once (0.52 ms + 0.18 ms overhead); plus 0.2 ms of rejection sampling. 6.6 ms per step
  for AL(5) = 2.68 tokens -> 2.68 * 3.44 / 6.6 = 1.4x the tokens/s of no speculation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from autotune.catalogs import DrafterSpec, GPUSpec, ModelSpec
from autotune.errors import UsageError

__all__ = [
    "Calibration",
    "DraftCost",
    "MemoryBudget",
    "PassCost",
    "RooflineParams",
    "StepTime",
    "attention_flops_per_token",
    "draft_cost",
    "drafter_weight_params",
    "expected_distinct_experts",
    "fit_calibration",
    "memory_budget",
    "prefill_ms",
    "request_kv_bytes",
    "scaled_gpu",
    "step_time",
    "target_pass",
    "tensor_tflops",
]

Bound = Literal["memory", "compute"]


@dataclass(frozen=True)
class RooflineParams:
    """Every constant the roofline assumes. Defaults are engineering estimates, not measurements: fit a
    `Calibration` from one measured profile to correct them for a real deployment."""

    bandwidth_efficiency: float = 0.8
    """Fraction of the datasheet HBM bandwidth a decode step achieves. Bandwidth tests on H100/H200 reach ~90% of
    peak and well-tuned GEMV/attention kernels 75-85%; 0.8 is the middle of that range."""
    compute_efficiency: float = 0.6
    """Fraction of the dense tensor-core peak the matmuls achieve. cuBLAS reaches 70-80% on large square bf16
    GEMMs; decode shapes (few rows, many small experts, attention) reach less, so 0.6."""
    step_overhead_ms: float = 0.5
    """Per engine step, ms: scheduling, input preparation, sampling and output processing that async scheduling
    does not hide (vLLM V1 spends a few hundred microseconds of CPU per step at small batch)."""
    layer_overhead_ms: float = 0.015
    """Per decoder layer per forward pass, ms: ~5 kernels (norm, QKV, attention, O-proj, MLP) of >= ~3 us each,
    the floor of a small kernel (launch gap under CUDA graphs plus ramp and tail) whatever the bytes it moves."""
    moe_layer_overhead_ms: float = 0.030
    """Extra per mixture-of-experts layer per pass, ms: router GEMM, top-k, token permute, two grouped GEMMs,
    activation, un-permute: ~8 more small kernels at ~4 us. gpt-oss-120b: 0.5 + 36 * 0.045 = 2.12 ms per step."""
    spec_step_overhead_ms: float = 0.2
    """Extra per step that speculates, ms: rejection sampling, draft bookkeeping, one more host sync."""
    draft_pass_overhead_ms: float = 0.1
    """Per drafter forward pass, ms: preparing its inputs (hidden-state gather, positions) and its launch; its
    layers and LM head add `layer_overhead_ms` each on top."""
    drafter_layer_params_per_h2: float = 12.0
    """Parameters of one drafter decoder layer in units of hidden_size^2: 4 h^2 attention + 8 h^2 MLP, the classic
    transformer-layer count (the catalog gives a drafter's layer count and width, not its parameter count). The
    published gpt-oss-120b P-EAGLE head (1.7 B parameters, 1.16 B of them embedding + LM head) implies ~16 h^2,
    so this slightly underestimates it."""
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
        for name in ("bandwidth_efficiency", "compute_efficiency", "gpu_memory_utilization"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise UsageError(f"RooflineParams.{name} is a fraction in (0, 1], but got {name}={value}.")
        for name in (
            "step_overhead_ms",
            "layer_overhead_ms",
            "moe_layer_overhead_ms",
            "spec_step_overhead_ms",
            "draft_pass_overhead_ms",
            "runtime_reserve_gb",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise UsageError(f"RooflineParams.{name} must be a finite number >= 0, but got {name}={value}.")
        for name in ("drafter_layer_params_per_h2", "drafter_bytes_per_param", "chars_per_token"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise UsageError(f"RooflineParams.{name} must be > 0, but got {name}={value}.")
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


def expected_distinct_experts(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Expected number of distinct experts one MoE layer runs for `tokens` tokens, each routed to
    `experts_per_token` (k) of `num_experts` (E) experts, uniformly and independently across tokens.

    Derivation: a given expert is among one token's k choices with probability k/E, so it is missed by all n
    tokens with probability (1 - k/E)^n. Summing the indicator "expert e is used" over the E experts (linearity of
    expectation) gives ``E * (1 - (1 - k/E)^n)``. n = 1 gives exactly k; as n grows it tends to E (every expert's
    weights are read once per step, however many tokens use them). Real routing is correlated across consecutive
    tokens, so this slightly overestimates the experts a speculative step touches.

    Examples: ``(128, 4, 1) -> 4.0``; ``(128, 4, 6) -> 22.20`` (gpt-oss-120b verifying K=5 drafts of one request);
    ``(128, 4, 384) -> 128.0`` (to 4 decimals); a dense model (E = 0) has no experts: ``(0, 0, n) -> 0.0``.
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
    return num_experts * (1.0 - miss**tokens)


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

    from dataclasses import replace

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


@dataclass(frozen=True)
class PassCost:
    """Predicted cost of forward pass(es): FLOPs, bytes and the times they imply (ms)."""

    flops: float
    weight_bytes: float
    kv_bytes: float
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    passes: int = 1

    @property
    def busy_ms(self) -> float:
        """GPU time of the pass(es): the larger of compute and memory time, ms."""
        return max(self.compute_ms, self.memory_ms)

    @property
    def total_ms(self) -> float:
        return self.busy_ms + self.overhead_ms

    @property
    def bound(self) -> Bound:
        return "compute" if self.compute_ms > self.memory_ms else "memory"

    def repeated(self, n: int) -> PassCost:
        """`n` identical sequential passes."""
        return PassCost(
            self.flops * n,
            self.weight_bytes * n,
            self.kv_bytes * n,
            self.compute_ms * n,
            self.memory_ms * n,
            self.overhead_ms * n,
            self.passes * n,
        )


ZERO_PASS = PassCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, passes=0)


def _memory_ms(nbytes: float, gpu: GPUSpec, params: RooflineParams) -> float:
    return nbytes / (gpu.memory_bandwidth_gbps * 1e9 * params.bandwidth_efficiency) * 1e3


def _compute_ms(flops: float, tflops: float, params: RooflineParams) -> float:
    return flops / (tflops * 1e12 * params.compute_efficiency) * 1e3


def target_pass(
    model: ModelSpec,
    gpu: GPUSpec,
    tokens: int,
    requests: int,
    context_tokens: float,
    params: RooflineParams,
) -> PassCost:
    """One target forward pass over `tokens` tokens of `requests` requests, each with `context_tokens` of context.

    Weights: non-expert weights once, plus ``layers * expected_distinct_experts(E, k, tokens)`` experts (all
    weights for a dense model). KV: ``requests * model.kv_bytes(context)``. FLOPs: ``2 * tokens`` per streamed
    matmul parameter a token uses (non-expert + k experts per layer) plus attention; expert matmuls run at the
    rate of the expert format, the rest at BF16's. Overhead: `step_overhead_ms` + per-layer overheads.
    """
    if tokens < 1 or requests < 1:
        raise ValueError(f"a pass needs tokens >= 1 and requests >= 1, but got tokens={tokens}, {requests=}.")
    per_expert = _expert_params_per_expert_layer(model)
    other = _streamed_other_params(model)
    experts_read = model.num_layers * expected_distinct_experts(model.num_experts, model.experts_per_token, tokens)
    weight_bytes = other * model.bytes_per_param_other + experts_read * per_expert * model.bytes_per_param_expert
    kv_bytes = requests * model.kv_bytes(max(int(round(context_tokens)), 0))

    expert_flops = 2.0 * tokens * model.num_layers * model.experts_per_token * per_expert
    other_flops = 2.0 * tokens * other + tokens * attention_flops_per_token(model, context_tokens)
    compute_ms = _compute_ms(expert_flops, tensor_tflops(model.bytes_per_param_expert, gpu), params) + _compute_ms(
        other_flops, tensor_tflops(model.bytes_per_param_other, gpu), params
    )
    memory_ms = _memory_ms(weight_bytes + kv_bytes, gpu, params)
    moe = params.moe_layer_overhead_ms if model.num_experts > 0 else 0.0
    overhead = params.step_overhead_ms + model.num_layers * (params.layer_overhead_ms + moe)
    return PassCost(expert_flops + other_flops, weight_bytes, kv_bytes, compute_ms, memory_ms, overhead)


def drafter_weight_params(drafter: DrafterSpec, target: ModelSpec, params: RooflineParams) -> tuple[float, float]:
    """(streamed, stored) parameters of a drafter: streamed = what one pass reads (its layers, EAGLE-3's 3h -> h
    fusion layer, its LM head over the target vocabulary); stored adds its input embedding.

    Example: the 4-layer P-EAGLE head of gpt-oss-120b (h = 2880, vocab 201088): 4 * 12 * 2880^2 = 398 M,
    3 * 2880^2 = 25 M, LM head 579 M -> 1.002 B streamed, 1.581 B stored (published: 1.7 B).
    """
    h = drafter.hidden_size
    layers = drafter.num_layers * params.drafter_layer_params_per_h2 * h * h
    fusion = 3.0 * h * h if drafter.method in ("eagle3", "eagle") else 0.0
    lm_head = float(target.vocab_size * h)
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


def _drafter_pass(
    drafter: DrafterSpec,
    target: ModelSpec,
    gpu: GPUSpec,
    tokens: int,
    logit_positions: int,
    requests: int,
    context_tokens: float,
    params: RooflineParams,
) -> PassCost:
    streamed, _ = drafter_weight_params(drafter, target, params)
    lm_head = float(target.vocab_size * drafter.hidden_size)
    body = streamed - lm_head
    weight_bytes = streamed * params.drafter_bytes_per_param
    kv_bytes = requests * _drafter_kv_bytes_per_request(drafter, target, context_tokens)
    attention = 4.0 * target.num_attention_heads * target.head_dim * context_tokens * drafter.num_layers * tokens
    flops = 2.0 * tokens * body + 2.0 * logit_positions * lm_head + attention
    compute_ms = _compute_ms(flops, gpu.bf16_tflops, params)
    memory_ms = _memory_ms(weight_bytes + kv_bytes, gpu, params)
    # +1 layer: the LM head is one more large kernel.
    overhead = params.draft_pass_overhead_ms + (drafter.num_layers + 1) * params.layer_overhead_ms
    return PassCost(flops, weight_bytes, kv_bytes, compute_ms, memory_ms, overhead)


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
    """Cost of drafting K tokens for B requests, ms.

    Parallel drafting (P-EAGLE, PARD): ONE pass over ``B * (K + 1)`` tokens (the verified positions whose target
    hidden states it reads plus the K - 1 mask positions is ``B * (AL + K - 1)``, which is ``B * (K + 1)`` at the
    typical AL of 2) with the LM head evaluated at B * K positions. Sequential drafting (EAGLE-3, draft model):
    K passes over B tokens each, the LM head at B positions per pass. The weights are read once per pass, which is
    why sequential drafting costs K times the bytes. K = 0 costs nothing.

    Example: gpt-oss-120b's P-EAGLE head on an H200, B=1: 1 pass whatever K; run sequentially at K=5: 5 passes.
    """
    if k < 0:
        raise ValueError(f"K must be >= 0, but got K={k}.")
    if k == 0:
        return DraftCost(ZERO_PASS, parallel)
    if parallel:
        one = _drafter_pass(
            drafter, target, gpu, batch_size * (k + 1), batch_size * k, batch_size, context_tokens, params
        )
        return DraftCost(one, parallel=True)
    one = _drafter_pass(drafter, target, gpu, batch_size, batch_size, batch_size, context_tokens, params)
    return DraftCost(one.repeated(k), parallel=False)


# ---- the step -----------------------------------------------------------------------------------------------


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
        """Target pass GPU time (max of compute and memory), ms."""
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
        """What limits the target pass: "memory" (bytes) or "compute" (FLOPs)."""
        return self.verify.bound

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

    Example: gpt-oss-120b, H200, B=1, context 1280: K=0 -> 3.44 ms; K=5 with its P-EAGLE head in parallel
    -> 6.6 ms (see the module docstring for the arithmetic).
    """
    params = params or RooflineParams()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, but got {batch_size}.")
    if k < 0:
        raise ValueError(f"K must be >= 0, but got K={k}.")
    if k > 0 and drafter is None:
        raise ValueError(f"K={k} > 0 needs a drafter to price the drafting; pass drafter=... or K=0.")
    context = params.default_context_tokens if context_tokens is None else context_tokens
    verify = target_pass(model, gpu, batch_size * (k + 1), batch_size, context, params)
    if k == 0 or drafter is None:
        return StepTime(batch_size, 0, verify, DraftCost(ZERO_PASS, parallel), 0.0)
    draft = draft_cost(drafter, model, gpu, batch_size, k, parallel, context, params)
    return StepTime(batch_size, k, verify, draft, params.spec_step_overhead_ms)


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
        cost += _drafter_pass(drafter, model, gpu, tokens, 1, 1, tokens / 2.0, params).total_ms
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
    2.13 B * 2 = 65.2 GB; its P-EAGLE head 1.58 B * 2 = 3.2 GB; leaving 1.6 GB of KV cache: 22 requests of
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
