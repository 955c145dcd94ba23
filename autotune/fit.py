"""Does a model fit: weights plus KV cache against device memory (GPU) or RAM (vLLM's CPU build). Pure.

GPU (`check_gpu_fit`): vLLM takes ``gpu_memory_utilization x device memory`` on each GPU and fills what weights,
activations and its own buffers leave with KV cache. We ask whether the weights (target plus drafter, split over
the tensor-parallel GPUs) and the KV cache of ``max_num_seqs`` sequences of ``max_model_len`` tokens fit in that,
with `gpu_overhead_bytes` for the rest; when they do not, we name the smallest ``--tensor-parallel-size`` in
(1, 2, 4, 8) that fits (it must divide the attention heads, as vLLM requires) and, when the weights fit, the
``--max-num-seqs`` that would.

CPU (`check_cpu_fit`): vLLM's CPU build keeps the weights in RAM and reserves VLLM_CPU_KVCACHE_SPACE GiB for the KV
cache, refusing to start when RAM cannot hold it; we ask whether that KV space holds ``max_num_seqs`` sequences
of ``max_model_len`` tokens and whether weights + KV space + `CPU_OVERHEAD_BYTES` fit in the available RAM.

KV cache per token and layer: ``2 (K and V) x kv_heads x head_dim x dtype bytes`` (MLA models: ``kv_lora_rank +
qk_rope_head_dim`` per layer, not split over GPUs), in blocks of `BLOCK_TOKENS`; sliding-window layers keep only
the window (plus one block); under tensor parallelism each GPU holds ``max(1, kv_heads // tp)`` heads.
Sizes in messages are decimal GB (10^9 bytes), as GPU datasheets and the Hugging Face hub state them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024**3
#: vLLM 0.32's default gpu_memory_utilization (vllm/config/cache.py).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: vLLM's KV cache block size (tokens) on GPUs.
BLOCK_TOKENS = 16
#: Tensor-parallel sizes we suggest.
TP_SIZES = (1, 2, 4, 8)
#: Per-GPU memory besides weights and KV cache, one GPU. vLLM measures it at start-up instead of assuming it; its own
#: figures (vllm PR #10511, Llama-3-8B on an H100): non-torch memory (CUDA context, cuBLAS workspaces) 1.79 GiB and
#: PyTorch activation peak 1.26 GiB; CUDA graphs add an estimated 0.36 GiB (vLLM 0.27 start-up log, 16 piecewise
#: sizes). 1.79 + 1.26 + 0.36 = 3.41, rounded up: 3.5 GiB. An assumption for models of other sizes: the activation
#: peak grows with the vocabulary and max_num_batched_tokens.
GPU_OVERHEAD_TP1_BYTES = int(3.5 * GIB)
#: The same with tensor parallelism: the same PR measured non-torch memory 3.58 GiB per GPU at TP 2 (NCCL buffers),
#: so 3.58 + 1.26 + 0.36 = 5.2, rounded up: 5.5 GiB.
GPU_OVERHEAD_TP_BYTES = int(5.5 * GIB)
#: RAM a vLLM CPU engine takes besides weights and KV space: ~1.6 GiB measured per engine with the test fixtures
#: (engine core, worker and driver processes: benchmarks/bench_runtime.py ENGINE_GIB), rounded up.
CPU_OVERHEAD_BYTES = 2 * GIB

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "float8_e4m3fn": 1,
                "float8_e5m2": 1}


def gpu_overhead_bytes(tensor_parallel_size: int) -> int:
    """Per-GPU memory we reserve for everything but weights and KV cache (see the constants)."""
    return GPU_OVERHEAD_TP1_BYTES if tensor_parallel_size <= 1 else GPU_OVERHEAD_TP_BYTES


def _gb(n: float) -> str:
    """Decimal GB with one decimal; MB below 1 GB (fixture-sized models)."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


# ------------------------------------------------------------------------------------------------ KV shape
@dataclass(frozen=True)
class KVShape:
    """What a model's KV cache holds per token, read from its config.json."""

    full_layers: int
    sliding_layers: int
    window: int | None
    kv_heads: int
    head_dim: int
    attention_heads: int
    dtype_bytes: int
    mla_width: int = 0
    """kv_lora_rank + qk_rope_head_dim for MLA models (DeepSeek-style): one latent per token and layer."""

    def bytes_per_device(self, tokens: int, sequences: int, tensor_parallel_size: int = 1) -> int:
        """KV bytes on one GPU for `sequences` sequences of `tokens` tokens each.

        Example: gpt-oss-120b (18 full + 18 sliding layers of window 128, 8 KV heads of 64, bf16), 64 x 8192
        tokens, TP 1: 2 x 8 x 64 x 2 = 2048 B per token and layer; 18 x 8192 + 18 x (128 + 16) tokens per sequence
        -> 2048 x 150,048 x 64 = 19.7 GB.
        """
        if tokens <= 0 or sequences <= 0:
            return 0
        blocks = math.ceil(tokens / BLOCK_TOKENS) * BLOCK_TOKENS
        sliding = min(blocks, math.ceil(self.window / BLOCK_TOKENS) * BLOCK_TOKENS + BLOCK_TOKENS) if self.window else 0
        token_layers = self.full_layers * blocks + self.sliding_layers * sliding
        if self.mla_width:
            per_token_layer = self.mla_width * self.dtype_bytes
        else:
            heads = max(1, self.kv_heads // max(1, tensor_parallel_size))
            per_token_layer = 2 * heads * self.head_dim * self.dtype_bytes
        return per_token_layer * token_layers * sequences


def _int(config: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def kv_shape(config: Mapping[str, Any], kv_dtype_bytes: int | None = None) -> KVShape:
    """The KV shape of a HF config (multimodal wrappers: their text_config). `kv_dtype_bytes` None: the model's
    dtype (vLLM's kv_cache_dtype "auto"; quantized checkpoints keep a bf16 dtype)."""
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, Mapping):
        config = {**config, **text}
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads", 1)
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim") or _int(config, "hidden_size") // heads
    window = _int(config, "sliding_window") or None
    if config.get("use_sliding_window") is False:
        window = None
    layer_types = config.get("layer_types")
    if window is None:
        sliding = 0
    elif isinstance(layer_types, list) and layer_types:
        sliding = sum(1 for t in layer_types[:layers] if t == "sliding_attention")
    else:
        sliding = layers  # Mistral-style: every layer uses the window
    if kv_dtype_bytes is None:
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
        kv_dtype_bytes = _DTYPE_BYTES.get(dtype, 2)
    mla = _int(config, "kv_lora_rank")
    mla_width = mla + _int(config, "qk_rope_head_dim") if mla else 0
    return KVShape(full_layers=layers - sliding, sliding_layers=sliding, window=window, kv_heads=kv_heads,
                   head_dim=head_dim, attention_heads=heads, dtype_bytes=kv_dtype_bytes, mla_width=mla_width)


# ------------------------------------------------------------------------------------------------ GPU
@dataclass(frozen=True)
class MemoryFit:
    """The verdict and its figures (bytes; `per_device_*` on one GPU, or RAM for the CPU check)."""

    fits: bool
    message: str
    """One line: what is needed, what there is, and what to change."""
    per_device_need: int
    per_device_budget: int
    weight_bytes: int
    """Target plus drafter weights, all devices."""
    kv_bytes: int
    """KV cache for max_num_seqs x max_model_len, all devices (CPU: what those sequences need)."""
    tensor_parallel_size: int = 1
    suggested_tensor_parallel_size: int | None = None
    """The smallest TP in `TP_SIZES` that fits, when the asked one does not; None when none does (or it fits)."""
    max_num_seqs_that_fit: int | None = None
    """The most sequences of max_model_len that fit at the asked TP (CPU: in the KV space), when fewer than asked."""


def _device_need(shape: KVShape, weights: int, *, tokens: int, seqs: int, tp: int) -> int:
    return math.ceil(weights / tp) + shape.bytes_per_device(tokens, seqs, tp) + gpu_overhead_bytes(tp)


def _gpus_here(tp: int, gpus_here: int | None) -> str:
    if gpus_here is None:
        return ""
    if gpus_here >= tp:
        return f" ({gpus_here} GPU{'s' * (gpus_here != 1)} here)"
    return f" (needs {tp} GPUs; {gpus_here} here)"


def check_gpu_fit(
    *,
    model: str,
    target_weight_bytes: int,
    target_config: Mapping[str, Any],
    drafter_weight_bytes: int = 0,
    max_model_len: int,
    max_num_seqs: int,
    device_memory_bytes: int,
    device_name: str,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    tensor_parallel_size: int = 1,
    gpus_here: int | None = None,
    kv_dtype_bytes: int | None = None,
    drafter_config: Mapping[str, Any] | None = None,
) -> MemoryFit:
    """Whether `model` (+ drafter) with KV cache for `max_num_seqs` x `max_model_len` tokens fits in
    ``gpu_memory_utilization x device_memory_bytes`` on each of `tensor_parallel_size` GPUs.

    `drafter_config` adds the drafter's own KV cache (EAGLE heads keep one per layer). `gpus_here`: GPUs on this
    machine (None: not known), said beside a suggested TP.
    Example: gpt-oss-120b (65.3 GB of weights) + a 3.4 GB head + 64 x 8192 tokens on an 80 GB card at 0.92 needs
    more than 73.6 GB: "use --tensor-parallel-size 2".
    """
    if tensor_parallel_size < 1 or max_model_len < 1 or max_num_seqs < 1:
        raise ValueError("tensor_parallel_size, max_model_len and max_num_seqs must be >= 1")
    shape = kv_shape(target_config, kv_dtype_bytes)
    head = kv_shape(drafter_config, kv_dtype_bytes) if drafter_config else None
    weights = target_weight_bytes + drafter_weight_bytes
    budget = int(gpu_memory_utilization * device_memory_bytes)

    def need(tp: int, seqs: int = max_num_seqs) -> int:
        total = _device_need(shape, weights, tokens=max_model_len, seqs=seqs, tp=tp)
        return total + (head.bytes_per_device(max_model_len, seqs, tp) if head else 0)

    tp = tensor_parallel_size
    kv_total = (shape.bytes_per_device(max_model_len, max_num_seqs, 1)
                + (head.bytes_per_device(max_model_len, max_num_seqs, 1) if head else 0))
    per_device = need(tp)
    drafter = f" + drafter ({_gb(drafter_weight_bytes)})" if drafter_weight_bytes else ""
    what = (f"{model} ({_gb(target_weight_bytes)} weights){drafter} + KV cache for {max_num_seqs} x {max_model_len} "
            f"tokens ({_gb(kv_total)}) + overhead ({_gb(gpu_overhead_bytes(tp) * tp)})")
    where = (f"one {device_name}" if tp == 1 else f"each of {tp} x {device_name}")
    have = f"{gpu_memory_utilization:.2f} x {_gb(device_memory_bytes)} = {_gb(budget)} on {where}"
    needs = f"needs {_gb(per_device)}" + ("" if tp == 1 else f" per GPU ({_gb(per_device * tp)} in all)")
    if per_device <= budget:
        return MemoryFit(fits=True, message=f"{what} {needs}, within {have}.", per_device_need=per_device,
                         per_device_budget=budget, weight_bytes=weights, kv_bytes=kv_total, tensor_parallel_size=tp)

    fixed = need(tp, 0)
    per_seq = need(tp, 1) - fixed
    seqs = int((budget - fixed) // per_seq) if per_seq > 0 and budget > fixed else 0
    seqs_fit = seqs if 1 <= seqs < max_num_seqs else None
    candidates = [t for t in TP_SIZES if t > tp and shape.attention_heads % t == 0]
    suggested = next((t for t in candidates if need(t) <= budget), None)
    fixes = []
    if suggested is not None:
        fixes.append(f"use --tensor-parallel-size {suggested}{_gpus_here(suggested, gpus_here)}")
    if seqs_fit is not None:
        fixes.append(f"--max-num-seqs {seqs_fit}")
    if not fixes:
        fixes.append("lower --max-model-len / --max-num-seqs or use a quantized checkpoint (it does not fit even "
                     f"with --tensor-parallel-size {max([tp, *candidates])})")
    return MemoryFit(
        fits=False, message=f"{what} {needs}, but {have}: {', or '.join(fixes)}.", per_device_need=per_device,
        per_device_budget=budget, weight_bytes=weights, kv_bytes=kv_total, tensor_parallel_size=tp,
        suggested_tensor_parallel_size=suggested, max_num_seqs_that_fit=seqs_fit,
    )


# ------------------------------------------------------------------------------------------------ CPU
def check_cpu_fit(
    *,
    model: str,
    target_weight_bytes: int,
    target_config: Mapping[str, Any],
    drafter_weight_bytes: int = 0,
    max_model_len: int,
    max_num_seqs: int,
    kv_cache_gib: float,
    available_ram_bytes: int,
    kv_dtype_bytes: int | None = None,
    drafter_config: Mapping[str, Any] | None = None,
) -> MemoryFit:
    """Whether vLLM's CPU build holds `model` (+ drafter) in `available_ram_bytes` with `kv_cache_gib` GiB of KV
    space (VLLM_CPU_KVCACHE_SPACE; EngineOptions.cpu_kv_cache_gib), and whether that space holds `max_num_seqs`
    sequences of `max_model_len` tokens. The message names the KV space to set when it is too small."""
    if max_model_len < 1 or max_num_seqs < 1 or kv_cache_gib <= 0:
        raise ValueError("max_model_len, max_num_seqs and kv_cache_gib must be positive")
    shape = kv_shape(target_config, kv_dtype_bytes)
    head = kv_shape(drafter_config, kv_dtype_bytes) if drafter_config else None

    def kv(seqs: int) -> int:
        return shape.bytes_per_device(max_model_len, seqs) + (head.bytes_per_device(max_model_len, seqs)
                                                              if head else 0)

    kv_need = kv(max_num_seqs)
    space = int(kv_cache_gib * GIB)
    weights = target_weight_bytes + drafter_weight_bytes
    wanted_space = max(space, kv_need)
    wanted_gib = math.ceil(wanted_space / GIB)
    ram_need = weights + wanted_space + CPU_OVERHEAD_BYTES
    drafter = f" + drafter ({_gb(drafter_weight_bytes)})" if drafter_weight_bytes else ""
    what = f"{model} ({_gb(weights - drafter_weight_bytes)} weights){drafter}"
    seqs = space // kv(1) if kv(1) else max_num_seqs
    kv_short = kv_need > space
    seqs_fit = int(seqs) if kv_short and seqs >= 1 else None

    def result(fits: bool, need: int, message: str) -> MemoryFit:
        return MemoryFit(fits=fits, message=message, per_device_need=need, per_device_budget=available_ram_bytes,
                         weight_bytes=weights, kv_bytes=kv_need, max_num_seqs_that_fit=seqs_fit)

    if ram_need <= available_ram_bytes and not kv_short:
        return result(True, ram_need, (
            f"{what} + KV space {kv_cache_gib:g} GiB (holds {max_num_seqs} x {max_model_len} tokens: "
            f"{_gb(kv_need)}) + overhead ({_gb(CPU_OVERHEAD_BYTES)}) needs {_gb(ram_need)} of RAM, within "
            f"{_gb(available_ram_bytes)} available."))
    if ram_need <= available_ram_bytes:  # only the KV space is short, and RAM allows more
        return result(False, ram_need, (
            f"KV cache for {max_num_seqs} x {max_model_len} tokens of {model} needs {_gb(kv_need)}, more than the "
            f"{kv_cache_gib:g} GiB KV space (VLLM_CPU_KVCACHE_SPACE): set it to {wanted_gib} GiB ({_gb(ram_need)} "
            f"of RAM in all, {_gb(available_ram_bytes)} available)"
            + (f", or use --max-num-seqs {seqs_fit}" if seqs_fit else "") + "."))
    floor_need = weights + space + CPU_OVERHEAD_BYTES
    if floor_need > available_ram_bytes:
        return result(False, floor_need, (
            f"{what} + KV space {kv_cache_gib:g} GiB + overhead ({_gb(CPU_OVERHEAD_BYTES)}) needs "
            f"{_gb(floor_need)} of RAM, but {_gb(available_ram_bytes)} is available: free memory, or use a "
            "smaller model or a quantized checkpoint."))
    return result(False, ram_need, (
        f"KV cache for {max_num_seqs} x {max_model_len} tokens of {model} needs {_gb(kv_need)}, more than the "
        f"{kv_cache_gib:g} GiB KV space (VLLM_CPU_KVCACHE_SPACE), and RAM ({_gb(available_ram_bytes)} available) "
        f"cannot hold {wanted_gib} GiB beside {_gb(weights)} of weights"
        + (f": use --max-num-seqs {seqs_fit}" if seqs_fit else ": lower --max-model-len") + "."))
