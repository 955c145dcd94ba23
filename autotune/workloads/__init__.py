"""Workloads: named classes of prompts with sampling parameters, and their loaders."""

from __future__ import annotations

from autotune.workloads._load import HF_DATASETS, REFERENCE_FOR_CLASS, list_builtin_workloads, load_workload
from autotune.workloads._workload import Workload, WorkloadRequest

__all__ = [
    "HF_DATASETS",
    "REFERENCE_FOR_CLASS",
    "Workload",
    "WorkloadRequest",
    "list_builtin_workloads",
    "load_workload",
]
