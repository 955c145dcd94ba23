"""Whether vLLM starts (issue 39.5): weights, overhead and one sequence of max_model_len in gpu_memory_utilization x
memory per GPU, naming the max_model_len or tensor-parallel size that starts, a short concurrency as a warning; on
vLLM's CPU build against RAM and VLLM_CPU_KVCACHE_SPACE. Plain numbers."""

from __future__ import annotations

import math

import pytest

from autotune.fit import (
    BLOCK_TOKENS,
    CPU_OVERHEAD_BYTES,
    GIB,
    GPU_OVERHEAD_TP1_BYTES,
    MXFP4_MOE_OVERHEAD_TP1_BYTES,
    MXFP4_MOE_OVERHEAD_TP_BYTES,
    check_cpu_fit,
    check_gpu_fit,
    kv_shape,
    max_model_len_for,
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
# KV per sequence of 8192 tokens at rest: 2 (K, V) x 8 heads x 64 x 2 bytes = 2048 B per token and layer; 18 full layers
# hold 8192 tokens, 18 sliding layers ceil((128 - 1) / 16) + 1 = 9 blocks of 16 (vLLM's SlidingWindowSpec).
KV_PER_SEQ = 2048 * (18 * 8192 + 18 * (128 + 16))


H100_NVML = 85_520_809_984  # what NVML reports for an H100 80GB HBM3 (autotune.environment.detect_gpus)
# gpt-oss-120b is an MXFP4 MoE checkpoint: the check takes its larger overhead from these two fields.
MXFP4 = {"quantization_config": {"quant_method": "mxfp4"}, "num_local_experts": 128}


def _gpt_oss(**changes: object) -> dict[str, object]:
    args: dict[str, object] = dict(model="openai/gpt-oss-120b", target_weight_bytes=WEIGHTS, drafter_weight_bytes=HEAD,
                                   target_config={**GPT_OSS_120B, **MXFP4}, max_model_len=8192, max_num_seqs=64,
                                   device_memory_bytes=H100, device_name="NVIDIA H100 80GB HBM3",
                                   gpu_memory_utilization=0.9, gpus_here=2)
    args.update(changes)
    return args


def test_gpt_oss_120b_with_a_head_on_one_h100_needs_two_gpus_at_any_max_model_len() -> None:
    # vLLM's arithmetic: 0.92 x 85.5 GB = 78.7 GB requested; weights 65.3 + head 3.4 + MXFP4 MoE overhead 13.0 GiB
    # (14.0 GB) = 82.7 GB before any KV cache, so no max_model_len starts. vLLM #23278, #27508, #33155 report
    # -2 to +2 GiB of KV for the model alone; ours alone: 78.7 - 65.3 - 14.0 = -0.6 GB, inside that range.
    budget = int(0.92 * H100_NVML)
    assert budget - WEIGHTS - MXFP4_MOE_OVERHEAD_TP1_BYTES == pytest.approx(-0.58e9, abs=0.01e9)
    fit = check_gpu_fit(**_gpt_oss(device_memory_bytes=H100_NVML, gpu_memory_utilization=0.92, gpus_here=1))  # type: ignore[arg-type]
    assert not fit.fits and fit.max_model_len_that_fits is None and fit.suggested_tensor_parallel_size == 2
    assert fit.kv_available_bytes == budget - WEIGHTS - HEAD - MXFP4_MOE_OVERHEAD_TP1_BYTES
    assert "\n" not in fit.message
    assert fit.message.startswith(
        "openai/gpt-oss-120b (65.3 GB weights) + drafter (3.4 GB) + overhead (14.0 GB per GPU: ")
    assert "need 82.7 GB before any KV cache, more than 0.92 x 85.5 GB = 78.7 GB on one NVIDIA H100" in fit.message
    assert fit.message.endswith("so vLLM refuses to start: needs --tensor-parallel-size 2 (needs 2 GPUs; 1 here).")


def test_gpt_oss_120b_on_one_h200_says_the_max_model_len_and_kv_it_fits_with() -> None:
    fit = check_gpu_fit(**_gpt_oss(device_memory_bytes=141 * 10**9, device_name="NVIDIA H200",
                                   gpu_memory_utilization=0.92))  # type: ignore[arg-type]
    kv = int(0.92 * 141e9) - WEIGHTS - HEAD - MXFP4_MOE_OVERHEAD_TP1_BYTES  # 129.7 - 68.7 - 14.0 = 47.1 GB
    null = 2048 * 16 * 36  # one block of every layer, held back by vLLM's pool
    seqs = (kv - null) // KV_PER_SEQ
    assert fit.fits and fit.kv_available_bytes == kv and fit.warning is None and fit.max_num_seqs_that_fit is None
    assert seqs >= 64
    assert fit.message.endswith(f"fits with max_model_len 8192 and about {kv / GIB:.1f} GiB of KV ({seqs} sequences "
                                "of 8192 at once).")


def test_long_context_is_queued_not_refused() -> None:
    # 131,072 tokens x 64 sequences would need 64 x 4.8 GB; vLLM starts when ONE fits and queues the rest.
    fit = check_gpu_fit(**_gpt_oss(device_memory_bytes=141 * 10**9, device_name="NVIDIA H200",
                                   max_model_len=131072))  # type: ignore[arg-type]
    kv = int(0.9 * 141e9) - WEIGHTS - HEAD - MXFP4_MOE_OVERHEAD_TP1_BYTES
    per_seq = 2048 * (18 * 131072 + 18 * 144)
    seqs = (kv - 2048 * 16 * 36) // per_seq
    assert fit.fits and 1 <= seqs < 64 and fit.max_num_seqs_that_fit == seqs
    assert fit.warning is not None and f"holds {seqs} sequences of 131072 tokens at once" in fit.warning
    assert "vLLM queues the rest" in fit.warning and f"--max-num-seqs {seqs}" in fit.warning


def test_too_long_for_one_sequence_names_the_max_model_len_that_fits() -> None:
    # A Llama-3-8B-shaped model (32 layers, 8 KV heads of 128, bf16: 131,072 B per token) on a 24 GB GPU at 0.92:
    # 22.08 GB - 16.06 GB weights - 3.5 GiB overhead = 2.26 GB of KV, while one 131,072-token sequence needs 17.2 GB.
    llama = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    fit = check_gpu_fit(model="llama", target_weight_bytes=16_060_000_000, target_config=llama, max_model_len=131072,
                        max_num_seqs=8, device_memory_bytes=24 * 10**9, device_name="NVIDIA L4",
                        gpu_memory_utilization=0.92)
    room = int(0.92 * 24e9) - 16_060_000_000 - GPU_OVERHEAD_TP1_BYTES - 131072 * 16  # less the null block
    longest = room // 131072 // 16 * 16
    assert not fit.fits and fit.max_model_len_that_fits == longest and 16_000 < longest < 18_000
    assert f"less than one sequence of 131072 tokens needs (17.2 GB), so vLLM refuses to start: use " \
           f"--max-model-len {longest}" in fit.message
    # The suggested length starts.
    assert check_gpu_fit(model="llama", target_weight_bytes=16_060_000_000, target_config=llama, max_model_len=longest,
                         max_num_seqs=8, device_memory_bytes=24 * 10**9, device_name="NVIDIA L4",
                         gpu_memory_utilization=0.92).fits


def test_the_same_fits_at_tp_2_on_h100s() -> None:
    fit = check_gpu_fit(**_gpt_oss(tensor_parallel_size=2))  # type: ignore[arg-type]
    # Per GPU: 0.9 x 80 GB = 72.0 GB - (65.3 + 3.4) / 2 GB - 12.2 GiB = 24.6 GB of KV.
    assert fit.fits and fit.kv_available_bytes == int(0.9 * H100) - (WEIGHTS + HEAD) // 2 - MXFP4_MOE_OVERHEAD_TP_BYTES
    assert "split over 2 GPUs" in fit.message and fit.suggested_tensor_parallel_size is None


def test_a_suggested_tp_says_when_this_machine_has_too_few_gpus() -> None:
    fit = check_gpu_fit(**_gpt_oss(gpus_here=1))  # type: ignore[arg-type]
    assert "needs --tensor-parallel-size 2 (needs 2 GPUs; 1 here)" in fit.message


def test_tp_must_divide_the_attention_heads_and_too_big_says_so() -> None:
    six_heads = {**GPT_OSS_120B, "num_attention_heads": 6, "num_key_value_heads": 6}
    # Needs four GPUs' worth of memory, but 6 heads split over 1 or 2 GPUs only (vLLM requires heads % TP == 0).
    fit = check_gpu_fit(**_gpt_oss(target_config=six_heads, target_weight_bytes=3 * H100, drafter_weight_bytes=0,
                                   max_num_seqs=1))  # type: ignore[arg-type]
    assert not fit.fits and fit.suggested_tensor_parallel_size is None and fit.max_num_seqs_that_fit is None
    assert "does not fit even with --tensor-parallel-size 2" in fit.message


def test_the_max_model_len_of_a_workload_has_headroom_and_respects_the_model() -> None:
    # 2,000 estimated prompt tokens + 25% = 2,500, + 1,024 output = 3,524 -> the next power of two.
    assert max_model_len_for(2000, 1024) == 4096
    assert max_model_len_for(2000, 1024, estimated=False) == 4096  # 3,024 -> 4,096
    assert max_model_len_for(3072, 1024, estimated=False) == 4096  # exactly 4,096
    assert max_model_len_for(3300, 1024) == 8192  # 4,125 + 1,024 = 5,149
    assert max_model_len_for(100_000, 40_000, model_limit=131072) == 131072
    assert max_model_len_for(1, 1) == BLOCK_TOKENS


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
    # vLLM needs one sequence to start (the head's layer: 2048 B x 8192 tokens); the 64 asked hold 64 of them.
    assert with_head.per_device_need - without.per_device_need == 2048 * 8192
    assert with_head.kv_bytes - without.kv_bytes == 64 * 2048 * 8192


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


def test_cpu_kv_space_short_of_the_concurrency_is_a_warning_naming_the_space_to_set() -> None:
    seqs = 4 * GIB // TINY_KV_PER_SEQ + 10
    fit = check_cpu_fit(**_cpu(max_num_seqs=seqs))  # type: ignore[arg-type]
    wanted = math.ceil(seqs * TINY_KV_PER_SEQ / GIB)
    held = 4 * GIB // TINY_KV_PER_SEQ
    assert fit.fits and fit.max_num_seqs_that_fit == held and fit.warning is not None
    assert f"set VLLM_CPU_KVCACHE_SPACE to {wanted} GiB for all, or use --max-num-seqs {held}" in fit.warning
    # RAM holds the 4 GiB space but not the larger one: fewer sequences is the fix.
    ram = 7_090_760 + 4 * GIB + CPU_OVERHEAD_BYTES + 1_000_000
    tight = check_cpu_fit(**_cpu(max_num_seqs=seqs, available_ram_bytes=ram))  # type: ignore[arg-type]
    assert tight.fits and tight.warning is not None and "VLLM_CPU_KVCACHE_SPACE to" not in tight.warning
    assert f"use --max-num-seqs {held}" in tight.warning


def test_cpu_kv_space_that_cannot_hold_one_sequence_is_refused() -> None:
    # One sequence of 2**21 tokens: 2 x 4 x 64 x 2 B x 4 layers x 2,097,152 = 8 GiB > 4 GiB.
    fit = check_cpu_fit(**_cpu(max_model_len=2**21))  # type: ignore[arg-type]
    assert not fit.fits and "so vLLM refuses to start: set it to 8 GiB or lower --max-model-len" in fit.message


def test_impossible_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        check_gpu_fit(**_gpt_oss(max_num_seqs=0))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        check_cpu_fit(**_cpu(kv_cache_gib=0))  # type: ignore[arg-type]
