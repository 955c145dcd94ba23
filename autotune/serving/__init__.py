"""`peagle-tune serve`: vLLM with the tuned config, the adaptive depth controller and per-request policies.

- `resolve_tuned_config`: the recommendation (newest for this model and device, or by id), a policy file's
  overrides, and acceptance priors / step-cost model from the newest stored profile;
- `build_launch`: the ``vllm serve`` command, environment and plugin config (``--dry-run`` prints it);
- `run_server`: runs it, forwards signals and, through a `LiveRecorder`, stores live profiles (kind "live") and
  warns when live acceptance drifts (`check_drift`);
- `PeagleClassMiddleware`: classifies requests in vLLM's API server (served model name, built-in classifier).
"""

from __future__ import annotations

from autotune.profiling import roofline_cost_model
from autotune.serving._launch import (
    LOOPBACK,
    MIDDLEWARE,
    POLICY_ENV,
    PROMETHEUS_ENV,
    ServeLaunch,
    build_launch,
    default_run_dir,
)
from autotune.serving._live import (
    DEFAULT_DRIFT_THRESHOLD,
    DEFAULT_MIN_DRAFTS,
    DriftReport,
    LiveProfile,
    check_drift,
    live_acceptance,
    live_profile,
)
from autotune.serving._memory import cpu_memory_fraction, read_meminfo
from autotune.serving._middleware import PeagleClassMiddleware, label_request, prompt_text
from autotune.serving._recorder import LiveRecorder
from autotune.serving._server import run_server
from autotune.serving._tuned import TunedConfig, plugin_config, resolve_tuned_config

__all__ = [
    "DEFAULT_DRIFT_THRESHOLD",
    "DEFAULT_MIN_DRAFTS",
    "LOOPBACK",
    "MIDDLEWARE",
    "POLICY_ENV",
    "PROMETHEUS_ENV",
    "DriftReport",
    "LiveProfile",
    "LiveRecorder",
    "PeagleClassMiddleware",
    "ServeLaunch",
    "TunedConfig",
    "build_launch",
    "check_drift",
    "cpu_memory_fraction",
    "default_run_dir",
    "label_request",
    "live_acceptance",
    "live_profile",
    "plugin_config",
    "prompt_text",
    "read_meminfo",
    "resolve_tuned_config",
    "roofline_cost_model",
    "run_server",
]
