"""Our KV arithmetic against vLLM's own (issue 39, item 5): the KV bytes one sequence of max_model_len needs, and
whether vLLM starts, from vLLM 0.32's `FullAttentionSpec` / `SlidingWindowSpec` (built from a gpt-oss-shaped
config: alternating sliding-window and full layers, 8 KV heads of 64, bf16), `max_memory_usage_bytes`,
`check_enough_kv_cache_memory` and `estimate_max_model_len`, on a real `VllmConfig`. No engine starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.fit import BLOCK_TOKENS, check_gpu_fit, kv_shape

CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 4,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880,
    "intermediate_size": 2880, "vocab_size": 201088, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 2, "max_position_embeddings": 131072,
    "num_local_experts": 4, "num_experts_per_tok": 2, "torch_dtype": "bfloat16", "rope_theta": 150000,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096},
}


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("vllm")
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig

    model = Path(tmp_path_factory.mktemp("gpt-oss-shaped"))
    (model / "config.json").write_text(json.dumps(CONFIG))
    model_config = ModelConfig(model=str(model), max_model_len=8192, skip_tokenizer_init=True)
    scheduler = SchedulerConfig(max_num_batched_tokens=2048, max_model_len=8192, is_encoder_decoder=False)
    config = VllmConfig(model_config=model_config, scheduler_config=scheduler)
    config.cache_config.kv_cache_layout = "NHD"  # what the engine core resolves before its check
    return config


def _specs() -> dict[str, Any]:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    full = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=8, head_size=64, dtype=torch.bfloat16)
    sliding = SlidingWindowSpec(block_size=BLOCK_TOKENS, num_kv_heads=8, head_size=64, dtype=torch.bfloat16,
                                sliding_window=128)
    return {f"model.layers.{i}.self_attn.attn": sliding if t == "sliding_attention" else full
            for i, t in enumerate(CONFIG["layer_types"])}


@pytest.mark.parametrize("max_model_len", [8192, 100, 1000])
def test_one_sequence_needs_what_vllm_says(vllm_config: Any, max_model_len: int) -> None:
    from vllm.v1.core.kv_cache_utils import max_memory_usage_bytes

    vllm_config.model_config.max_model_len = max_model_len
    try:
        theirs = max_memory_usage_bytes(vllm_config, _specs().values())
    finally:
        vllm_config.model_config.max_model_len = 8192
    shape = kv_shape(CONFIG)
    assert next(iter(_specs().values())).page_size_bytes == shape.per_token_layer() * BLOCK_TOKENS
    in_flight = vllm_config.max_in_flight_tokens  # 2048 here: one synchronous batch of max_num_batched_tokens
    assert shape.bytes_per_device(max_model_len, 1, 1, in_flight) == theirs


def test_vllm_starts_where_we_say_it_starts(vllm_config: Any) -> None:
    from vllm.v1.core.kv_cache_utils import (
        check_enough_kv_cache_memory,
        estimate_max_model_len,
        get_kv_cache_groups,
        max_memory_usage_bytes,
    )

    specs = _specs()
    need = max_memory_usage_bytes(vllm_config, specs.values())
    # vLLM holds back one block of its largest layer group (2 layers here); we hold back one block of every layer.
    groups = get_kv_cache_groups(vllm_config, dict(specs))
    their_null = max(len(g.layer_names) for g in groups) * next(iter(specs.values())).page_size_bytes
    our_null = kv_shape(CONFIG).block_bytes()
    assert their_null <= our_null

    def ours(available: int) -> Any:
        return check_gpu_fit(model="m", target_weight_bytes=0, target_config=CONFIG, max_model_len=8192,
                             max_num_seqs=1, device_memory_bytes=available, device_name="GPU",
                             gpu_memory_utilization=1.0, in_flight_tokens=vllm_config.max_in_flight_tokens,
                             overhead_bytes=0)

    def theirs(available: int) -> bool:
        try:
            check_enough_kv_cache_memory(vllm_config, specs, available)
        except ValueError as exc:
            assert "To serve at least one request with the model's max seq len (8192)" in str(exc)
            return False
        return True

    assert theirs(need + their_null) and not theirs(need + their_null - 1)
    assert ours(need + our_null).fits and theirs(need + our_null)
    assert not ours(need + their_null - 1).fits  # where vLLM refuses, so do we
    # Below one sequence both name about the same longest max_model_len (ours in whole blocks, with our larger null
    # block held back: at most 2 blocks shorter).
    short = need // 2
    theirs_len = estimate_max_model_len(vllm_config, specs, short - their_null)
    fit = ours(short)
    assert not fit.fits and fit.max_model_len_that_fits is not None
    assert 0 <= theirs_len - fit.max_model_len_that_fits < 2 * BLOCK_TOKENS
