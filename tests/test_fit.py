"""Whether weights plus KV cache fit (issue 32.4): on GPUs under gpu_memory_utilization x memory x TP, naming the
tensor-parallel size that fits; on vLLM's CPU build against RAM and VLLM_CPU_KVCACHE_SPACE. Plain numbers."""

from __future__ import annotations

import math

import pytest

from autotune.fit import (
    BLOCK_TOKENS,
    CPU_OVERHEAD_BYTES,
    GIB,
    GPU_OVERHEAD_TP1_BYTES,
    GPU_OVERHEAD_TP_BYTES,
    check_cpu_fit,
    check_gpu_fit,
    kv_shape,
)

# gpt-oss-120b's config.json, the fields that size its KV cache.
GPT_OSS_120B = {
    "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "hidden_size": 2880, "sliding_window": 128, "torch_dtype": "bfloat16",
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}
WEIGHTS = 65_300_000_000  # the checkpoint's safetensors
HEAD = 3_400_000_000
H100 = 80_000_000_000
# KV per sequence of 8192 tokens: 2 (K, V) x 8 heads x 64 x 2 bytes = 2048 B per token and layer; 18 full layers hold
# 8192 tokens, 18 sliding layers their window of 128 plus one block of 16.
KV_PER_SEQ = 2048 * (18 * 8192 + 18 * (128 + 16))


def _gpt_oss(**changes: object) -> dict[str, object]:
    args: dict[str, object] = dict(model="openai/gpt-oss-120b", target_weight_bytes=WEIGHTS, drafter_weight_bytes=HEAD,
                                   target_config=GPT_OSS_120B, max_model_len=8192, max_num_seqs=64,
                                   device_memory_bytes=H100, device_name="NVIDIA H100 80GB HBM3",
                                   gpu_memory_utilization=0.9, gpus_here=2)
    args.update(changes)
    return args


def test_gpt_oss_120b_with_a_head_and_64_long_sequences_needs_two_80gb_gpus() -> None:
    need_tp1 = WEIGHTS + HEAD + 64 * KV_PER_SEQ + GPU_OVERHEAD_TP1_BYTES
    budget = 0.9 * H100
    need_tp2 = (WEIGHTS + HEAD) / 2 + 64 * KV_PER_SEQ / 2 + GPU_OVERHEAD_TP_BYTES  # 8 KV heads: 4 per GPU
    assert need_tp1 > budget >= need_tp2
    fit = check_gpu_fit(**_gpt_oss())  # type: ignore[arg-type]
    assert not fit.fits and fit.suggested_tensor_parallel_size == 2
    assert fit.per_device_need == need_tp1 and fit.kv_bytes == 64 * KV_PER_SEQ
    assert "\n" not in fit.message
    assert fit.message.startswith(
        "openai/gpt-oss-120b (65.3 GB weights) + drafter (3.4 GB) + KV cache for 64 x 8192 tokens (19.7 GB)")
    assert f"needs {need_tp1 / 1e9:.1f} GB, but 0.90 x 80.0 GB = 72.0 GB on one NVIDIA H100 80GB HBM3" in fit.message
    assert "use --tensor-parallel-size 2 (2 GPUs here)" in fit.message


def test_the_same_fits_on_one_h200_and_at_tp_2_on_h100s() -> None:
    assert check_gpu_fit(**_gpt_oss(device_memory_bytes=141 * 10**9, device_name="NVIDIA H200")).fits  # type: ignore[arg-type]
    fit = check_gpu_fit(**_gpt_oss(tensor_parallel_size=2))  # type: ignore[arg-type]
    assert fit.fits and "per GPU" in fit.message and fit.suggested_tensor_parallel_size is None


def test_a_suggested_tp_says_when_this_machine_has_too_few_gpus() -> None:
    fit = check_gpu_fit(**_gpt_oss(gpus_here=1))  # type: ignore[arg-type]
    assert "use --tensor-parallel-size 2 (needs 2 GPUs; 1 here)" in fit.message


def test_fewer_sequences_are_offered_when_the_weights_fit() -> None:
    fit = check_gpu_fit(**_gpt_oss(drafter_weight_bytes=0, max_num_seqs=256))  # type: ignore[arg-type]
    room = int(0.9 * H100) - WEIGHTS - GPU_OVERHEAD_TP1_BYTES
    assert fit.max_num_seqs_that_fit == room // KV_PER_SEQ
    assert f"or --max-num-seqs {room // KV_PER_SEQ}" in fit.message


def test_tp_must_divide_the_attention_heads_and_too_big_says_so() -> None:
    six_heads = {**GPT_OSS_120B, "num_attention_heads": 6, "num_key_value_heads": 6}
    # Needs four GPUs' worth of memory, but 6 heads split over 1 or 2 GPUs only (vLLM requires heads % TP == 0).
    fit = check_gpu_fit(**_gpt_oss(target_config=six_heads, target_weight_bytes=3 * H100, drafter_weight_bytes=0,
                                   max_num_seqs=1))  # type: ignore[arg-type]
    assert not fit.fits and fit.suggested_tensor_parallel_size is None and fit.max_num_seqs_that_fit is None
    assert "does not fit even with --tensor-parallel-size 2" in fit.message


def test_kv_cache_shape_from_config() -> None:
    shape = kv_shape(GPT_OSS_120B)
    assert (shape.full_layers, shape.sliding_layers, shape.window, shape.kv_heads, shape.dtype_bytes) == (
        18, 18, 128, 8, 2)
    assert shape.bytes_per_device(8192, 1) == KV_PER_SEQ
    # No sliding layers: every layer holds the whole sequence; a fp8 cache halves it.
    dense = {k: v for k, v in GPT_OSS_120B.items() if k not in ("sliding_window", "layer_types")}
    assert kv_shape(dense).bytes_per_device(8192, 1) == 2048 * 36 * 8192
    assert kv_shape(dense, kv_dtype_bytes=1).bytes_per_device(8192, 1) == 1024 * 36 * 8192
    # Partial blocks are whole blocks; KV heads split over TP until one per GPU is left (then replicated).
    assert kv_shape(dense).bytes_per_device(1, 1) == 2048 * 36 * BLOCK_TOKENS
    assert kv_shape(dense).bytes_per_device(8192, 1, 4) == 2048 * 36 * 8192 // 4
    assert kv_shape(dense).bytes_per_device(8192, 1, 16) == kv_shape(dense).bytes_per_device(8192, 1, 8)
    # head_dim from hidden_size / heads when absent; Qwen-style use_sliding_window false disables the window.
    qwen = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "sliding_window": 64,
            "use_sliding_window": False}
    assert kv_shape(qwen).bytes_per_device(128, 1) == 2 * 4 * 64 * 2 * 2 * 128


def test_a_drafter_config_adds_its_kv_cache() -> None:
    head = {"num_hidden_layers": 1, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64}
    without = check_gpu_fit(**_gpt_oss(device_memory_bytes=200 * 10**9))  # type: ignore[arg-type]
    with_head = check_gpu_fit(**_gpt_oss(device_memory_bytes=200 * 10**9, drafter_config=head))  # type: ignore[arg-type]
    assert with_head.per_device_need - without.per_device_need == 64 * 2048 * 8192


# ------------------------------------------------------------------------------------------------ CPU
TINY = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64}
TINY_KV_PER_SEQ = 2 * 4 * 64 * 2 * 4 * 512  # 512 tokens, 4 layers


def _cpu(**changes: object) -> dict[str, object]:
    args: dict[str, object] = dict(model="org/target", target_weight_bytes=7_090_760, target_config=TINY,
                                   max_model_len=512, max_num_seqs=8, kv_cache_gib=4, available_ram_bytes=20 * GIB)
    args.update(changes)
    return args


def test_cpu_fit_counts_weights_kv_space_and_overhead_against_available_ram() -> None:
    fit = check_cpu_fit(**_cpu())  # type: ignore[arg-type]
    assert fit.fits and fit.per_device_need == 7_090_760 + 4 * GIB + CPU_OVERHEAD_BYTES
    assert fit.kv_bytes == 8 * TINY_KV_PER_SEQ
    short = check_cpu_fit(**_cpu(available_ram_bytes=5 * GIB))  # type: ignore[arg-type]
    assert not short.fits and "free memory" in short.message and "\n" not in short.message


def test_cpu_kv_space_too_small_names_the_space_to_set() -> None:
    seqs = 4 * GIB // TINY_KV_PER_SEQ + 10
    fit = check_cpu_fit(**_cpu(max_num_seqs=seqs))  # type: ignore[arg-type]
    wanted = math.ceil(seqs * TINY_KV_PER_SEQ / GIB)
    assert not fit.fits and f"set it to {wanted} GiB" in fit.message
    assert fit.max_num_seqs_that_fit == 4 * GIB // TINY_KV_PER_SEQ
    assert f"or use --max-num-seqs {4 * GIB // TINY_KV_PER_SEQ}" in fit.message
    # RAM holds the 4 GiB space but not the larger one: fewer sequences is the fix.
    ram = 7_090_760 + 4 * GIB + CPU_OVERHEAD_BYTES + 1_000_000
    tight = check_cpu_fit(**_cpu(max_num_seqs=seqs, available_ram_bytes=ram))  # type: ignore[arg-type]
    assert not tight.fits and f"cannot hold {wanted} GiB" in tight.message
    assert f"use --max-num-seqs {4 * GIB // TINY_KV_PER_SEQ}" in tight.message


def test_impossible_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        check_gpu_fit(**_gpt_oss(max_num_seqs=0))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        check_cpu_fit(**_cpu(kv_cache_gib=0))  # type: ignore[arg-type]
