"""Catalogs of GPUs, target models and drafters, each figure with its source.

The data lives in packaged YAML files (gpus.yaml, models.yaml, drafters.yaml). Lookups are case-insensitive and
accept aliases; models and drafters can also be local Hugging Face directories, read from their config.json.
User catalog files (``--catalog FILE`` -> `use_catalog`, or the PEAGLE_CATALOG environment variable) add entries of
the same schema, winning over packaged entries of the same name. Published acceptance lengths become per-position
curves (`reference_survival`, `acceptance_survival`): exact through two published depths, else through one with the
decay prior of heads that draft the same way.
"""

from __future__ import annotations

from autotune.catalogs._catalog import (
    DEFAULT_GPU,
    acceptance_survival,
    default_gpu,
    drafter_names,
    drafters_for,
    get_drafter,
    get_gpu,
    list_drafters,
    list_gpus,
    list_models,
    load_user_catalog,
    model_names,
    position_decay_prior,
    resolve_model,
    use_catalog,
)
from autotune.catalogs._hf_config import PARALLEL_DRAFTING_TOKEN_KEYS
from autotune.catalogs._specs import (
    DrafterSpec,
    GPUSpec,
    ModelSpec,
    ParamCounts,
    ReferenceAcceptance,
    architecture_params,
    reference_survival,
)
from autotune.catalogs._user_catalog import ENV_VAR as CATALOG_ENV_VAR
from autotune.catalogs._user_catalog import UserCatalog, clear_catalogs

__all__ = [
    "CATALOG_ENV_VAR",
    "DEFAULT_GPU",
    "PARALLEL_DRAFTING_TOKEN_KEYS",
    "DrafterSpec",
    "GPUSpec",
    "ModelSpec",
    "ParamCounts",
    "ReferenceAcceptance",
    "acceptance_survival",
    "UserCatalog",
    "architecture_params",
    "clear_catalogs",
    "default_gpu",
    "drafter_names",
    "drafters_for",
    "get_drafter",
    "get_gpu",
    "list_drafters",
    "list_gpus",
    "list_models",
    "model_names",
    "load_user_catalog",
    "position_decay_prior",
    "reference_survival",
    "resolve_model",
    "use_catalog",
]
