"""Workloads: named classes of prompts with sampling parameters, and their loaders."""

from __future__ import annotations

from autotune.workloads._workload import Workload, WorkloadRequest

__all__ = ["Workload", "WorkloadRequest"]
