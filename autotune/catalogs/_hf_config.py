"""Read a local Hugging Face model directory (its config.json) into a ModelSpec or a DrafterSpec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.catalogs._specs import DrafterSpec, ModelSpec, architecture_params
from autotune.errors import UnknownModelError

#: Keys vLLM accepts as the mask token that parallel drafting needs (any one of them).
PARALLEL_DRAFTING_TOKEN_KEYS: tuple[str, ...] = ("pard_token", "mask_token_id", "ptd_token_id")

_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0, "float": 4.0}
#: MXFP4: 32 four-bit values share one 8-bit E8M0 scale: (32*4 + 8) / 32 = 4.25 bits.
_MXFP4_BYTES = 4.25 / 8
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")


def read_config(path: Path) -> dict[str, Any]:
    """The parsed config.json of a model directory, or UnknownModelError saying what is wrong."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UnknownModelError(
            f"{path} is a directory without a config.json; a local model must be a Hugging Face model directory "
            "(config.json plus weights)."
        )
    from autotune.checkpoints._cache import read_json  # bounded in size, depth and number length

    data = read_json(config_file, "config.json")
    if not isinstance(data, dict):
        raise UnknownModelError(f"{config_file} holds a {type(data).__name__}; expected a JSON object (a HF config).")
    # Multimodal wrappers keep the language model's fields under text_config.
    text = data.get("text_config")
    if "num_hidden_layers" not in data and isinstance(text, dict):
        return {**data, **text}
    return data


def _int(config: dict[str, Any], key: str, config_file: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if value is None:
            raise UnknownModelError(
                f"{config_file} has no {key!r}; expected a Hugging Face causal-LM config (Llama-style fields "
                "num_hidden_layers, hidden_size, num_attention_heads, vocab_size)."
            )
        raise UnknownModelError(f"{config_file}: {key!r} must be a non-negative integer, but got {value!r}.")
    return value


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def model_from_config(config: dict[str, Any], path: Path) -> ModelSpec:
    """A ModelSpec from a HF config: Llama-style dense fields plus MoE fields when present.

    Parameter counts are derived from the architecture (`architecture_params`), so they ignore biases and norms.
    Weights are taken as stored in ``torch_dtype``/``dtype`` (MXFP4 experts when quant_method is mxfp4) and the KV
    cache in the model dtype, which is vLLM's default.
    """
    config_file = path / "config.json"
    num_layers = _int(config, "num_hidden_layers", config_file)
    hidden = _int(config, "hidden_size", config_file)
    heads = _int(config, "num_attention_heads", config_file)
    kv_heads = _int(config, "num_key_value_heads", config_file, default=heads)
    vocab = _int(config, "vocab_size", config_file)
    if heads == 0 or num_layers == 0 or hidden == 0:
        raise UnknownModelError(
            f"{config_file}: num_hidden_layers, hidden_size and num_attention_heads must be positive, but got "
            f"{num_layers}, {hidden}, {heads}."
        )
    head_dim = config.get("head_dim") or hidden // heads
    num_experts = _first_int(config, _EXPERT_COUNT_KEYS)
    top_k = _first_int(config, _TOPK_KEYS) if num_experts else 0
    if num_experts:
        ffn = config.get("moe_intermediate_size") or config.get("intermediate_size") or 0
    else:
        ffn = config.get("intermediate_size") or 0
    tie = bool(config.get("tie_word_embeddings", False))
    params = architecture_params(
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        vocab_size=vocab,
        ffn_intermediate_size=int(ffn),
        num_experts=num_experts,
        experts_per_token=top_k,
        tie_word_embeddings=tie,
    )

    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
    dtype_bytes = _DTYPE_BYTES.get(dtype, 2.0)
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    expert_bytes = other_bytes = dtype_bytes
    weight_format = dtype
    if method == "mxfp4":
        expert_bytes, weight_format = _MXFP4_BYTES, f"mxfp4 experts, {dtype} rest"
    elif method == "fp8":
        expert_bytes = other_bytes = 1.0
        weight_format = "fp8"
    elif method and isinstance(quant.get("bits"), int):
        expert_bytes = other_bytes = quant["bits"] / 8
        weight_format = f"{method} {quant['bits']}-bit"

    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False or not isinstance(window, int) or window <= 0:
        window = None
    layer_types = config.get("layer_types")
    if window is None:
        fraction = 0.0
    elif isinstance(layer_types, list) and layer_types:
        fraction = sum(1 for t in layer_types if t == "sliding_attention") / len(layer_types)
    else:
        fraction = 1.0  # Mistral-style: every layer uses the window.

    resolved = path.resolve()
    return ModelSpec(
        name=str(resolved),
        aliases=(resolved.name,),
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        vocab_size=vocab,
        num_experts=num_experts,
        experts_per_token=top_k,
        total_params_b=params.total_b,
        active_params_b=params.active_b,
        expert_params_b=params.expert_b,
        weight_format=weight_format,
        bytes_per_param_expert=expert_bytes,
        bytes_per_param_other=other_bytes,
        kv_bytes_per_element=dtype_bytes,
        sliding_window=window,
        sliding_window_layer_fraction=fraction,
        source=f"config.json in {resolved} (parameter counts derived from the architecture; biases ignored)",
        ffn_intermediate_size=int(ffn),
        tie_word_embeddings=tie,
        local_path=str(resolved),
    )


def _trained_k(config: dict[str, Any]) -> int | None:
    """Draft positions a checkpoint declares, if it does (top-level or in a speculators config)."""
    value = config.get("num_speculative_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    spec = config.get("speculators_config")
    if isinstance(spec, dict):
        for proposal in spec.get("proposal_methods") or []:
            tokens = proposal.get("speculative_tokens") if isinstance(proposal, dict) else None
            if isinstance(tokens, int) and tokens > 0:
                return tokens
    return None


def drafter_from_config(config: dict[str, Any], path: Path, target: str | None) -> DrafterSpec:
    """A DrafterSpec from a drafter's HF config.

    parallel_drafting is True iff the config has one of `PARALLEL_DRAFTING_TOKEN_KEYS` (what vLLM requires);
    method is "eagle3" for EAGLE-3 architectures, "eagle" for EAGLE-1/2 and "draft_model" for a plain causal LM.
    """
    config_file = path / "config.json"
    architectures = " ".join(str(a) for a in config.get("architectures") or []).lower()
    speculator_type = str(config.get("speculators_model_type", "")).lower()
    if "eagle3" in architectures or speculator_type == "eagle3":
        method = "eagle3"
    elif "eagle" in architectures or speculator_type == "eagle":
        method = "eagle"
    else:
        method = "draft_model"
    parallel = any(config.get(key) is not None for key in PARALLEL_DRAFTING_TOKEN_KEYS)
    # EAGLE-3 heads with a reduced ("hot") vocabulary say so; the LM head then has that many rows.
    draft_vocab = config.get("draft_vocab_size")
    resolved = path.resolve()
    return DrafterSpec(
        name=str(resolved),
        target=target,
        method=method,
        num_layers=_int(config, "num_hidden_layers", config_file),
        hidden_size=_int(config, "hidden_size", config_file),
        trained_k=_trained_k(config),
        recommended_k=None,
        parallel_drafting=parallel,
        reference_acceptance={},
        source=f"config.json in {resolved}",
        aliases=(resolved.name,),
        draft_vocab_size=draft_vocab if isinstance(draft_vocab, int) and draft_vocab > 0 else None,
        local_path=str(resolved),
    )
