"""Backends measure (vllm) or predict (model) a config on a workload.

Importing them is cheap: vLLM and torch are imported only inside the engine subprocess.
"""

from __future__ import annotations

from autotune.backends._roofline import CONSTANTS_FILE, fitted_constants, speedup_log_sigma
from autotune.backends.base import Backend
from autotune.backends.in_launch import InLaunchBackend
from autotune.backends.model import ModelBackend, RooflineParams
from autotune.backends.vllm import VLLMBackend, vllm_available

__all__ = [
    "CONSTANTS_FILE",
    "Backend",
    "InLaunchBackend",
    "ModelBackend",
    "RooflineParams",
    "VLLMBackend",
    "fitted_constants",
    "speedup_log_sigma",
    "vllm_available",
]
