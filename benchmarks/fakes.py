"""A stand-in for vLLM's engine core that builds the scheduler plugin without a model: the tests of the plugin's
scheduler and `benchmarks.bench_plugin_overhead` drive the scheduler it builds step by step with fake runner outputs.

vLLM is imported when a scheduler is built, not when this module is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.spec import SpecConfig
from benchmarks.common import DEFAULT_MODELS

#: The drafter depth of the built scheduler's speculative config.
K = 4


class FakeEngineCore:
    """Builds a scheduler the way vLLM's ``EngineCore.__init__`` does: with ``self.model_executor`` in scope (the
    plugin finds the executor for its drafter-width handshake there). `executor` answers ``collective_rpc``."""

    def __init__(self, executor: Any) -> None:
        self.model_executor = executor

    def build(
        self,
        scheduler_cls: type,
        batch: int = 8,
        *,
        num_blocks: int = 256,
        async_scheduling: bool | None = None,
        models: Path = DEFAULT_MODELS,
    ) -> Any:
        """`scheduler_cls` for the fixture target with the 1-layer drafter (draft_model, parallel drafting, K=`K`),
        float32, max_model_len 256, max_num_seqs `batch`, no prefix caching, a KV cache of `num_blocks` blocks of
        16 tokens; `async_scheduling` as given (None: vLLM's default). The CPU platform turns async scheduling off
        whatever was asked; True sets it back on the scheduler config, as vLLM's config on a GPU has it."""
        import torch
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        speculative = SpecConfig("draft_model", str(models / "drafter-1l"), K, parallel_drafting=True)
        more: dict[str, Any] = {} if async_scheduling is None else {"async_scheduling": async_scheduling}
        config = EngineArgs(
            model=str(models / "target"), dtype="float32", max_model_len=256, max_num_seqs=batch, enforce_eager=True,
            enable_prefix_caching=False, speculative_config=speculative.speculative_config(), **more,
        ).create_engine_config()
        config.cache_config.num_gpu_blocks = num_blocks
        if async_scheduling:
            config.scheduler_config.async_scheduling = True
        spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
        kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        return scheduler_cls(vllm_config=config, kv_cache_config=kv, log_stats=True,
                             structured_output_manager=StructuredOutputManager(config), block_size=16)
