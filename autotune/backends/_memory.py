"""Whether vLLM starts a predicted deployment on a GPU: `autotune.fit.check_gpu_fit` on catalog figures."""

from __future__ import annotations

from autotune.backends._drafter_cost import drafter_weight_params
from autotune.backends._roofline import RooflineParams
from autotune.catalogs import DrafterSpec, GPUSpec, ModelSpec
from autotune.fit import MemoryFit, check_gpu_fit

__all__ = ["predicted_fit"]


def predicted_fit(
    model: ModelSpec,
    drafter: DrafterSpec | None,
    gpu: GPUSpec,
    tp: int,
    params: RooflineParams,
    sequences: int,
    tokens: int,
) -> MemoryFit:
    """Whether vLLM starts `model` (with `drafter`, if any) with max_model_len `tokens` on `tp` GPUs like `gpu`, and
    holds `sequences` such sequences at once: the one memory-fit check (`check_gpu_fit`, as search's vllm path runs
    it on checkpoints) with the weights predicted from the catalog's parameter counts and the KV shape from its
    layers and heads (a drafter keeps full-context KV in each of its layers with the target's heads). The message
    says what vLLM will do: the KV it will have, or the --max-model-len / --tensor-parallel-size that would start."""
    heads = {"num_attention_heads": model.num_attention_heads, "num_key_value_heads": model.num_kv_heads,
             "head_dim": model.head_dim}
    sliding = round(model.num_layers * model.sliding_window_layer_fraction) if model.sliding_window else 0
    layer_types = ["sliding_attention"] * sliding + ["full_attention"] * (model.num_layers - sliding)
    target_config: dict[str, object] = {"num_hidden_layers": model.num_layers, **heads,
                                        "sliding_window": model.sliding_window, "layer_types": layer_types}
    if "mxfp4" in model.weight_format.lower() and model.num_experts:
        # What config.json says of such a checkpoint, so the check takes the MXFP4 MoE overhead (autotune.fit).
        target_config.update(quantization_config={"quant_method": "mxfp4"}, num_local_experts=model.num_experts)
    drafter_bytes = 0
    if drafter is not None:
        stored = drafter_weight_params(drafter, model, params)[1]
        drafter_bytes = int(stored * params.drafter_bytes_per_param)
    return check_gpu_fit(
        model=model.name, target_weight_bytes=int(model.weight_bytes()), target_config=target_config,
        drafter_weight_bytes=drafter_bytes,
        drafter_config={"num_hidden_layers": drafter.num_layers, **heads} if drafter is not None else None,
        max_model_len=max(int(tokens), 1), max_num_seqs=max(sequences, 1),
        device_memory_bytes=int(gpu.memory_gb * 1e9), device_name=gpu.display_name,
        tensor_parallel_size=tp, kv_dtype_bytes=max(int(model.kv_bytes_per_element), 1),
    )
