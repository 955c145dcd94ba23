"""Profiling: one engine launch per drafter measures acceptance per class and position and the step cost T(B, K).

``profile(model, drafters, workload, ...)`` runs each drafter once at K_max with the scheduler plugin changing the
verified depth at runtime, and returns (and stores) a `ProfileResult` per drafter. `predictor_from_profile` turns a
stored profile into what the model backend predicts from: ``ModelBackend(acceptance=..., cost_model=...)``.
"""

from __future__ import annotations

from autotune.profiling._analysis import (
    acceptance_per_class,
    fit_cost_model,
    metrics_check,
    phase_totals,
    predictor_from_profile,
)
from autotune.profiling._profile import (
    DEFAULT_CONCURRENCIES,
    DEFAULT_MAX_K,
    EngineRun,
    ProfileResult,
    profile,
    run_plugin_job,
    store_profile,
)

__all__ = [
    "DEFAULT_CONCURRENCIES",
    "DEFAULT_MAX_K",
    "EngineRun",
    "ProfileResult",
    "acceptance_per_class",
    "fit_cost_model",
    "metrics_check",
    "phase_totals",
    "predictor_from_profile",
    "profile",
    "run_plugin_job",
    "store_profile",
]
