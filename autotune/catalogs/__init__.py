"""Catalogs of GPUs, target models and drafters, each figure with its source.

The data lives in packaged YAML files (gpus.yaml, models.yaml, drafters.yaml). Lookups are case-insensitive and
accept aliases; models and drafters can also be local Hugging Face directories, read from their config.json.
"""

from __future__ import annotations

from autotune.catalogs._catalog import (
    DEFAULT_GPU,
    default_gpu,
    drafters_for,
    get_drafter,
    get_gpu,
    list_drafters,
    list_gpus,
    list_models,
    resolve_model,
)
from autotune.catalogs._hf_config import PARALLEL_DRAFTING_TOKEN_KEYS
from autotune.catalogs._specs import (
    DrafterSpec,
    GPUSpec,
    ModelSpec,
    ParamCounts,
    ReferenceAcceptance,
    architecture_params,
)

__all__ = [
    "DEFAULT_GPU",
    "PARALLEL_DRAFTING_TOKEN_KEYS",
    "DrafterSpec",
    "GPUSpec",
    "ModelSpec",
    "ParamCounts",
    "ReferenceAcceptance",
    "architecture_params",
    "default_gpu",
    "drafters_for",
    "get_drafter",
    "get_gpu",
    "list_drafters",
    "list_gpus",
    "list_models",
    "resolve_model",
]
