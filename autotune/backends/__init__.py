"""Backends measure (vllm) or predict (model) a config on a workload."""

from __future__ import annotations

from autotune.backends.base import Backend

__all__ = ["Backend"]
