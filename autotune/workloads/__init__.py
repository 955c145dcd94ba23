"""Workloads: named classes of prompts with sampling parameters, and their loaders."""

from __future__ import annotations

from autotune.workloads._load import (
    HF_DATASETS,
    MAX_WORKLOAD_CLASSES,
    REFERENCE_FOR_CLASS,
    list_builtin_workloads,
    load_workload,
)
from autotune.workloads._parse import MAX_TOKENS_LIMIT
from autotune.workloads._workload import Workload, WorkloadRequest

__all__ = [
    "HF_DATASETS",
    "MAX_TOKENS_LIMIT",
    "MAX_WORKLOAD_CLASSES",
    "REFERENCE_FOR_CLASS",
    "Workload",
    "WorkloadRequest",
    "list_builtin_workloads",
    "load_workload",
]
