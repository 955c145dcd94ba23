"""Workloads: named classes of prompts with sampling parameters, and their loaders (benchmark datasets through
vLLM's loaders, files, and the samples shipped here)."""

from __future__ import annotations

from autotune.workloads._datasets import DATASETS
from autotune.workloads._load import (
    DEFAULT_MEASURED,
    DEFAULT_PREDICTED,
    MAX_WORKLOAD_CLASSES,
    REFERENCE_FOR_CLASS,
    SAMPLE_ALIASES,
    default_note,
    list_builtin_workloads,
    load_workload,
    resolve_workload,
)
from autotune.workloads._parse import MAX_TOKENS_LIMIT
from autotune.workloads._workload import Workload, WorkloadRequest, summary_line

__all__ = [
    "DATASETS",
    "DEFAULT_MEASURED",
    "DEFAULT_PREDICTED",
    "MAX_TOKENS_LIMIT",
    "MAX_WORKLOAD_CLASSES",
    "REFERENCE_FOR_CLASS",
    "SAMPLE_ALIASES",
    "Workload",
    "WorkloadRequest",
    "list_builtin_workloads",
    "default_note",
    "load_workload",
    "resolve_workload",
    "summary_line",
]
