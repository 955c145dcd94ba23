"""Does a model fit: weights plus KV cache against device memory (GPU) or RAM (vLLM's CPU build). Pure.

GPU (`check_gpu_fit`) follows vLLM 0.32's own arithmetic. At start-up each GPU worker takes ``requested =
gpu_memory_utilization x total memory`` (``v1/worker/utils.py`` 716-771, ``request_memory``), loads the weights,
runs a profile pass and estimates the CUDA-graph pool, and keeps ``requested - weights - activation peak - non-torch
memory - graph memory`` for the KV cache (``v1/worker/gpu_worker.py`` 676-743, ``determine_available_memory``).
It then refuses to start when that cannot hold ONE sequence of ``max_model_len`` tokens, and its error names the
longest max_model_len that would fit (``v1/core/kv_cache_utils.py`` 1003-1040 and 1104-1137,
``check_enough_kv_cache_memory``). Fewer than ``max_num_seqs`` such sequences is no refusal: the scheduler queues
what does not fit. So `MemoryFit.fits` means "vLLM will start", and a concurrency short of ``max_num_seqs`` is
`MemoryFit.warning`. We cannot profile, so weights are the checkpoint's bytes (split over the tensor-parallel GPUs)
and everything else is `gpu_overhead_bytes`, a sourced figure; when it does not fit we name the longest
``--max-model-len`` that fits and the smallest ``--tensor-parallel-size`` in (1, 2, 4, 8) that fits (it must divide
the attention heads, as vLLM requires).

CPU (`check_cpu_fit`): vLLM's CPU build keeps the weights in RAM and reserves VLLM_CPU_KVCACHE_SPACE GiB for the KV
cache, refusing to start when RAM cannot hold it; we ask whether that KV space holds ``max_num_seqs`` sequences
of ``max_model_len`` tokens and whether weights + KV space + `CPU_OVERHEAD_BYTES` fit in the available RAM.

KV cache per token and layer: ``2 (K and V) x kv_heads x head_dim x dtype bytes`` (MLA models: ``kv_lora_rank +
qk_rope_head_dim`` per layer, not split over GPUs), in blocks of `BLOCK_TOKENS`; under tensor parallelism each GPU
holds ``max(1, kv_heads // tp)`` heads. A sliding-window layer holds ``ceil(min(window - 1 + in-flight tokens,
max_model_len) / 16) + 1`` blocks per sequence (vLLM's ``SlidingWindowSpec.max_admission_blocks_per_request``,
``v1/kv_cache_interface.py`` 859-896), where in-flight tokens are max_num_batched_tokens per concurrent batch for
the one-sequence check and none for a sequence at rest.
Sizes in messages are decimal GB (10^9 bytes), as GPU datasheets and the Hugging Face hub state them; the KV cache
vLLM will have is also said in GiB, as vLLM logs it ("Available KV cache memory").

`max_model_len_of` is the one place a workload's ``max_model_len`` is decided (`max_model_len_for` its arithmetic):
launches and exports pass it to vLLM, and the fit check sizes the KV cache by it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024**3
#: vLLM 0.32's default gpu_memory_utilization (vllm/config/cache.py).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: vLLM's KV cache block size (tokens) on GPUs.
BLOCK_TOKENS = 16
#: Tensor-parallel sizes we suggest.
TP_SIZES = (1, 2, 4, 8)
#: vLLM 0.32's max_num_batched_tokens for ``vllm serve`` on GPUs of 70 GiB or more other than A100 (H100, H200;
#: ``engine/arg_utils.py`` 2933-2942), the deployment exports are for.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: Batches in flight at once under async scheduling, vLLM's GPU default (``VllmConfig.max_concurrent_batches``,
#: ``config/vllm.py`` 576-587): a sliding-window layer keeps ``2 x max_num_batched_tokens`` in-flight tokens.
ASYNC_CONCURRENT_BATCHES = 2
#: Per-GPU memory besides weights and KV cache, one GPU. vLLM measures it at start-up instead of assuming it; its own
#: figures (vllm PR #10511, Llama-3-8B on an H100): non-torch memory (CUDA context, cuBLAS workspaces) 1.79 GiB and
#: PyTorch activation peak 1.26 GiB; CUDA graphs add an estimated 0.36 GiB (vLLM 0.27 start-up log, 16 piecewise
#: sizes). 1.79 + 1.26 + 0.36 = 3.41, rounded up: 3.5 GiB. An assumption for models of other sizes: the activation
#: peak grows with the vocabulary and max_num_batched_tokens.
GPU_OVERHEAD_TP1_BYTES = int(3.5 * GIB)
#: The same with tensor parallelism: the same PR measured non-torch memory 3.58 GiB per GPU at TP 2 (NCCL buffers),
#: so 3.58 + 1.26 + 0.36 = 5.2, rounded up: 5.5 GiB.
GPU_OVERHEAD_TP_BYTES = int(5.5 * GIB)
#: MXFP4 mixture-of-experts checkpoints (gpt-oss) take far more beside their checkpoint bytes: vLLM re-lays the
#: MXFP4 experts out for its MoE kernels (it reports "Model loading took 65.97 GiB" for gpt-oss-120b, vLLM
#: #23278, and 64.38 GiB, #33155, against 60.8 GiB = 65.3 GB of safetensors), and the profile pass of a
#: 201,088-token vocabulary over 8192 batched tokens holds large logits. Derived from #23278 (one H100 of 79.19 GiB
#: at gpu_memory_utilization 0.90, no drafter): requested 71.27 GiB, "Available KV cache memory: -2.14 GiB", so
#: everything but KV is 73.41 GiB, 12.6 GiB above the 60.8 GiB checkpoint; vLLM 0.10.1 did not yet count the graph
#: pool there, so add the 0.36 GiB of `GPU_OVERHEAD_TP1_BYTES`' graphs: 13.0 GiB.
MXFP4_MOE_OVERHEAD_TP1_BYTES = int(13.0 * GIB)
#: The same per GPU under tensor parallelism: the re-layout (65.97 - 60.8 = 5.2 GiB) is split over the GPUs (at
#: most 2.6 GiB each from TP 2), the activation peak and graphs (7.8 GiB) are not, and NCCL adds 1.8 GiB
#: (3.58 - 1.79, PR #10511): 2.6 + 7.8 + 1.8 = 12.2 GiB.
MXFP4_MOE_OVERHEAD_TP_BYTES = int(12.2 * GIB)
#: RAM a vLLM CPU engine takes besides weights and KV space: ~1.6 GiB measured per engine with the test fixtures
#: (engine core, worker and driver processes: benchmarks/bench_runtime.py ENGINE_GIB), rounded up.
CPU_OVERHEAD_BYTES = 2 * GIB
#: Tokens a chat template adds to a conversation beyond its text (role markers, a system preamble such as gpt-oss's
#: harmony header with the model identity, dates and reasoning effort): an assumed allowance, added to chat requests
#: only (raw prompts go to /v1/completions without a template).
CHAT_TEMPLATE_TOKENS = 128
#: Characters per token where no tokenizer counts a prompt: English prose runs ~4, code and other languages ~3;
#: the lower figure overestimates tokens, which the fit prefers to underestimating them.
CHARS_PER_TOKEN = 3

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "float8_e4m3fn": 1,
                "float8_e5m2": 1}


def is_mxfp4_moe(config: Mapping[str, Any]) -> bool:
    """Whether a config.json describes an MXFP4 mixture-of-experts checkpoint (gpt-oss): its quantization_config
    says quant_method "mxfp4" and it has experts."""
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    experts = config.get("num_local_experts") or config.get("num_experts")
    return method == "mxfp4" and bool(experts)


def gpu_overhead_bytes(tensor_parallel_size: int, mxfp4_moe: bool = False) -> int:
    """Per-GPU memory we reserve for everything but weights and KV cache (see the constants)."""
    if mxfp4_moe:
        return MXFP4_MOE_OVERHEAD_TP1_BYTES if tensor_parallel_size <= 1 else MXFP4_MOE_OVERHEAD_TP_BYTES
    return GPU_OVERHEAD_TP1_BYTES if tensor_parallel_size <= 1 else GPU_OVERHEAD_TP_BYTES


def split_gpu_memory_utilization(one_engine: float, engines: int) -> float:
    """The gpu_memory_utilization each of `engines` engines sharing one GPU takes: an equal share of what one
    engine would, rounded down to 0.01 (vLLM refuses to start the last one when the others left less free than it
    asks for). Example: ``split_gpu_memory_utilization(0.92, 2)`` is 0.46."""
    if engines < 1 or not 0 < one_engine <= 1:
        raise ValueError(f"engines must be >= 1 and one_engine in (0, 1], but got {engines=}, {one_engine=}.")
    return math.floor(one_engine / engines * 100 + 1e-9) / 100


def _gb(n: float) -> str:
    """Decimal GB with one decimal; MB below 1 GB (fixture-sized models)."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ------------------------------------------------------------------------------------------------ max_model_len
def max_model_len_for(prompt_tokens: int, output_tokens: int, model_limit: int | None = None,
                           *, estimated: bool = True) -> int:
    """The max_model_len a workload needs: its longest prompt plus its largest max_tokens, with headroom, rounded up
    to a power of two and never above `model_limit` (the model's max_position_embeddings; None: no limit).

    Headroom: an `estimated` prompt length (characters at `CHARS_PER_TOKEN`, or a tokenizer's count of the text
    before the chat template) gets a quarter more tokens, since tokenizers differ by that much on code and
    non-English text and templates add tokens; the sum is then rounded up to a power of two (at least one 16-token
    block), which adds at most as much again. vLLM refuses a request longer than max_model_len,
    so headroom costs only KV for one sequence, while too little fails requests.
    Example: a 6,000-character prompt estimated at 2,000 tokens, 1,024 output tokens: 2,500 + 1,024 = 3,524 -> 4,096.
    """
    prompt = math.ceil(max(prompt_tokens, 0) * (1.25 if estimated else 1.0))
    need = max(prompt + max(output_tokens, 0), BLOCK_TOKENS)
    length = 1 << (need - 1).bit_length()
    return min(length, model_limit) if model_limit else length


def max_model_len_of(workload: Any, model_limit: int | None = None, given: int | None = None,
                     count_tokens: Callable[[str], int] | None = None) -> int:
    """The max_model_len launches and exports of `workload` (an `autotune.workloads.Workload`) pass to vLLM: `given`
    (the user's) when set, else `max_model_len_for` of its longest prompt and its largest max_tokens, within
    `model_limit`. Prompts are counted by `count_tokens` (the model's tokenizer) when given, else estimated at
    `CHARS_PER_TOKEN` characters a token; a chat request adds `CHAT_TEMPLATE_TOKENS`."""
    if given:
        return given
    count = count_tokens or (lambda text: math.ceil(len(text) / CHARS_PER_TOKEN))
    requests = [r for _, r in workload.requests()]
    longest = max((count(r.text()) + (CHAT_TEMPLATE_TOKENS if r.messages else 0) for r in requests), default=0)
    output = max((r.max_tokens for r in requests), default=0)
    return max_model_len_for(longest, output, model_limit)


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

    def per_token_layer(self, tensor_parallel_size: int = 1) -> int:
        """KV bytes of one token in one layer on one GPU (vLLM's page size divided by the block size)."""
        if self.mla_width:
            return self.mla_width * self.dtype_bytes
        heads = max(1, self.kv_heads // max(1, tensor_parallel_size))
        return 2 * heads * self.head_dim * self.dtype_bytes

    def bytes_per_device(self, tokens: int, sequences: int, tensor_parallel_size: int = 1,
                         in_flight_tokens: int = 0) -> int:
        """KV bytes on one GPU for `sequences` sequences of `tokens` tokens each, with `in_flight_tokens` scheduled
        but not yet settled (only sliding-window layers keep them beside their window).

        Example: gpt-oss-120b (18 full + 18 sliding layers of window 128, 8 KV heads of 64, bf16), 64 x 8192
        tokens, TP 1: 2 x 8 x 64 x 2 = 2048 B per token and layer; 18 x 8192 + 18 x (ceil(127 / 16) + 1) x 16
        tokens per sequence -> 2048 x 150,048 x 64 = 19.7 GB.
        """
        if tokens <= 0 or sequences <= 0:
            return 0
        blocks = math.ceil(tokens / BLOCK_TOKENS) * BLOCK_TOKENS
        sliding = 0
        if self.window:
            held = min(self.window - 1 + max(in_flight_tokens, 0), tokens)
            sliding = (math.ceil(held / BLOCK_TOKENS) + 1) * BLOCK_TOKENS
        token_layers = self.full_layers * blocks + self.sliding_layers * sliding
        return self.per_token_layer(tensor_parallel_size) * token_layers * sequences

    def block_bytes(self, tensor_parallel_size: int = 1) -> int:
        """One block of every layer on one GPU: the null block vLLM's pool holds back before its one-sequence
        check (``v1/core/kv_cache_utils.py`` 1122-1131; there it is one block of the largest layer group, at most
        this)."""
        return self.per_token_layer(tensor_parallel_size) * BLOCK_TOKENS * (self.full_layers + self.sliding_layers)


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
    """vLLM will start: the weights and its own buffers fit, and the KV cache left holds one sequence of
    max_model_len (vLLM's own rule). Fewer than max_num_seqs such sequences is `warning`, not a refusal."""
    message: str
    """One line: what is needed, what there is, what will happen, and what to change."""
    per_device_need: int
    """GPU: weights + overhead + one sequence of max_model_len on one GPU (what vLLM needs to start). CPU: RAM."""
    per_device_budget: int
    weight_bytes: int
    """Target plus drafter weights, all devices."""
    kv_bytes: int
    """KV cache for max_num_seqs x max_model_len, all devices (CPU: what those sequences need)."""
    tensor_parallel_size: int = 1
    suggested_tensor_parallel_size: int | None = None
    """The smallest TP in `TP_SIZES` at which vLLM starts, when it does not at the asked one; None when none does
    (or it starts)."""
    max_num_seqs_that_fit: int | None = None
    """How many sequences of max_model_len the KV cache holds at once, when fewer than max_num_seqs (vLLM then
    queues the rest); None when all fit."""
    warning: str | None = None
    """One line when vLLM starts but its KV cache holds fewer than max_num_seqs sequences of max_model_len."""
    max_model_len: int = 0
    kv_available_bytes: int = 0
    """GPU: the KV cache vLLM will have on each GPU (negative: none); CPU: the KV space."""
    max_model_len_that_fits: int | None = None
    """When one sequence does not fit: the longest max_model_len whose sequence does (None: none)."""


def _gpus_here(tp: int, gpus_here: int | None) -> str:
    if gpus_here is None:
        return ""
    if gpus_here >= tp:
        return f" ({gpus_here} GPU{'s' * (gpus_here != 1)} here)"
    return f" (needs {tp} GPUs; {gpus_here} here)"


def _longest_that_fits(need: Any, room: int, limit: int) -> int | None:
    """The largest length in [1, limit) with ``need(length) <= room`` (vLLM's `estimate_max_model_len` searches the
    same way), rounded down to a whole block; None when not even one block fits."""
    low, high = 0, max(limit - 1, 0)
    while low < high:
        mid = (low + high + 1) // 2
        if need(mid) <= room:
            low = mid
        else:
            high = mid - 1
    fits = low // BLOCK_TOKENS * BLOCK_TOKENS
    return fits if fits >= BLOCK_TOKENS else None


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
    in_flight_tokens: int = ASYNC_CONCURRENT_BATCHES * DEFAULT_MAX_NUM_BATCHED_TOKENS,
    overhead_bytes: int | None = None,
) -> MemoryFit:
    """Whether vLLM starts `model` (+ drafter) with `max_model_len` on each of `tensor_parallel_size` GPUs of
    `device_memory_bytes`, and how many sequences of max_model_len its KV cache then holds (see the module).

    KV left per GPU = ``gpu_memory_utilization x device_memory_bytes - weights / tp - overhead`` (`overhead_bytes`,
    default `gpu_overhead_bytes`: larger for MXFP4 MoE configs); vLLM starts when that, less its null block, holds
    one sequence of max_model_len with `in_flight_tokens` in its sliding-window layers. `drafter_config` adds the
    drafter's own KV cache (EAGLE heads keep one per layer). `gpus_here`: GPUs on this machine (None: not known),
    said beside a suggested TP.
    Example: gpt-oss-120b (65.3 GB of weights, MXFP4 MoE: 13.0 GiB overhead) + a 1.8 GB head on an H100 of
    85.5 GB at 0.92: 78.7 - 65.3 - 1.8 - 14.0 = -2.4 GB, so vLLM cannot start at any max_model_len: "needs
    --tensor-parallel-size 2".
    """
    if tensor_parallel_size < 1 or max_model_len < 1 or max_num_seqs < 1:
        raise ValueError("tensor_parallel_size, max_model_len and max_num_seqs must be >= 1")
    shape = kv_shape(target_config, kv_dtype_bytes)
    head = kv_shape(drafter_config, kv_dtype_bytes) if drafter_config else None
    mxfp4 = is_mxfp4_moe(target_config)
    weights = target_weight_bytes + drafter_weight_bytes
    budget = int(gpu_memory_utilization * device_memory_bytes)

    def overhead(tp: int) -> int:
        return overhead_bytes if overhead_bytes is not None else gpu_overhead_bytes(tp, mxfp4)

    def kv(tp: int, tokens: int, seqs: int, in_flight: int = 0) -> int:
        return (shape.bytes_per_device(tokens, seqs, tp, in_flight)
                + (head.bytes_per_device(tokens, seqs, tp, in_flight) if head else 0))

    def room(tp: int) -> int:
        """KV memory vLLM will have on each GPU, less the null block."""
        null = shape.block_bytes(tp) + (head.block_bytes(tp) if head else 0)
        return budget - math.ceil(weights / tp) - overhead(tp) - null

    def one_sequence(tp: int, tokens: int = max_model_len) -> int:
        return kv(tp, tokens, 1, in_flight_tokens)

    def starts(tp: int) -> bool:
        return room(tp) > 0 and one_sequence(tp) <= room(tp)

    tp = tensor_parallel_size
    available = budget - math.ceil(weights / tp) - overhead(tp)
    kv_total = kv(1, max_model_len, max_num_seqs)
    per_device = math.ceil(weights / tp) + overhead(tp) + one_sequence(tp)
    drafter = f" + drafter ({_gb(drafter_weight_bytes)})" if drafter_weight_bytes else ""
    where = f"one {device_name}" if tp == 1 else f"each of {tp} x {device_name}"
    have = f"{gpu_memory_utilization:.2f} x {_gb(device_memory_bytes)} = {_gb(budget)} on {where}"
    split = "" if tp == 1 else f" split over {tp} GPUs"
    what = (f"{model} ({_gb(target_weight_bytes)} weights){drafter}{split} + overhead ({_gb(overhead(tp))} per GPU: "
            f"activations, CUDA graphs, non-torch memory{', MXFP4 MoE' if mxfp4 and overhead_bytes is None else ''})")

    def result(fits: bool, message: str, **more: Any) -> MemoryFit:
        return MemoryFit(fits=fits, message=message, per_device_need=per_device, per_device_budget=budget,
                         weight_bytes=weights, kv_bytes=kv_total, tensor_parallel_size=tp,
                         max_model_len=max_model_len, kv_available_bytes=available, **more)

    if starts(tp):
        per_seq = kv(tp, max_model_len, 1)
        seqs = room(tp) // per_seq if per_seq > 0 else max_num_seqs
        short = seqs < max_num_seqs
        warning = None
        if short:
            warning = (f"The KV cache holds {seqs} sequence{'s' * (seqs != 1)} of {max_model_len} tokens at once, "
                       f"fewer than max_num_seqs {max_num_seqs}: vLLM queues the rest (or use --max-num-seqs "
                       f"{seqs} or a shorter --max-model-len).")
        message = (f"{what} leave {_gb(available)} of {have} for KV cache: fits with max_model_len {max_model_len} "
                   f"and about {_gib(available)} of KV ({seqs} sequence{'s' * (seqs != 1)} of {max_model_len} at "
                   "once).")
        return result(True, message, warning=warning, max_num_seqs_that_fit=seqs if short else None)

    candidates = [t for t in TP_SIZES if t > tp and shape.attention_heads % t == 0]
    suggested = next((t for t in candidates if starts(t)), None)
    longest = _longest_that_fits(lambda n: one_sequence(tp, n), room(tp), max_model_len) if room(tp) > 0 else None
    fixes = [f"use --max-model-len {longest}"] if longest is not None else []
    if suggested is not None:
        tp_flag = f"--tensor-parallel-size {suggested}{_gpus_here(suggested, gpus_here)}"
        fixes.append(tp_flag if fixes else f"needs {tp_flag}")
    if not fixes:
        fixes.append("use a quantized checkpoint or a larger GPU (it does not fit even with --tensor-parallel-size "
                     f"{max([tp, *candidates])})")
    if room(tp) > 0:
        why = (f"{what} leave {_gb(available)} of {have} for KV cache, less than one sequence of {max_model_len} "
               f"tokens needs ({_gb(one_sequence(tp))}), so vLLM refuses to start")
    else:
        why = (f"{what} need {_gb(math.ceil(weights / tp) + overhead(tp))} before any KV cache, more than {have}, "
               "so vLLM refuses to start")
    return result(False, f"{why}: {', or '.join(fixes)}.", suggested_tensor_parallel_size=suggested,
                  max_model_len_that_fits=longest)


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
    """Whether vLLM's CPU build starts `model` (+ drafter) in `available_ram_bytes` with `kv_cache_gib` GiB of KV
    space (VLLM_CPU_KVCACHE_SPACE; EngineOptions.cpu_kv_cache_gib): RAM holds weights + space + overhead, and the
    space holds one sequence of `max_model_len` (vLLM's rule, as on GPUs). A space that holds fewer than
    `max_num_seqs` such sequences is `MemoryFit.warning` (vLLM queues the rest), naming the space to set."""
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
    ram_need = weights + space + CPU_OVERHEAD_BYTES
    wanted_gib = math.ceil(max(space, kv_need) / GIB)
    drafter = f" + drafter ({_gb(drafter_weight_bytes)})" if drafter_weight_bytes else ""
    what = f"{model} ({_gb(weights - drafter_weight_bytes)} weights){drafter}"
    seqs = int(space // kv(1)) if kv(1) else max_num_seqs
    seqs_fit = seqs if seqs < max_num_seqs else None

    def result(fits: bool, message: str, warning: str | None = None) -> MemoryFit:
        return MemoryFit(fits=fits, message=message, per_device_need=ram_need, per_device_budget=available_ram_bytes,
                         weight_bytes=weights, kv_bytes=kv_need, max_num_seqs_that_fit=seqs_fit if fits else None,
                         warning=warning, max_model_len=max_model_len, kv_available_bytes=space)

    if ram_need > available_ram_bytes:
        return result(False, (
            f"{what} + KV space {kv_cache_gib:g} GiB + overhead ({_gb(CPU_OVERHEAD_BYTES)}) needs "
            f"{_gb(ram_need)} of RAM, but {_gb(available_ram_bytes)} is available: free memory, or use a "
            "smaller model or a quantized checkpoint."))
    if seqs < 1:
        return result(False, (
            f"One sequence of {max_model_len} tokens of {model} needs {_gb(kv(1))} of KV cache, more than the "
            f"{kv_cache_gib:g} GiB KV space (VLLM_CPU_KVCACHE_SPACE), so vLLM refuses to start: set it to "
            f"{math.ceil(kv(1) / GIB)} GiB or lower --max-model-len."))
    message = (f"{what} + KV space {kv_cache_gib:g} GiB (holds {seqs} sequence{'s' * (seqs != 1)} of "
               f"{max_model_len} tokens at once) + overhead ({_gb(CPU_OVERHEAD_BYTES)}) needs {_gb(ram_need)} of RAM, "
               f"within {_gb(available_ram_bytes)} available.")
    warning = None
    if seqs_fit is not None:
        room = weights + wanted_gib * GIB + CPU_OVERHEAD_BYTES <= available_ram_bytes
        warning = (f"The {kv_cache_gib:g} GiB KV space holds {seqs} of the {max_num_seqs} sequences of "
                   f"{max_model_len} tokens asked: vLLM queues the rest ("
                   + (f"set VLLM_CPU_KVCACHE_SPACE to {wanted_gib} GiB for all, or " if room else "")
                   + f"use --max-num-seqs {seqs}).")
    return result(True, message, warning)
