"""Profiling: one engine launch per drafter measures acceptance per class and position and the step cost T(B, K).

``profile(model, drafters, workload, ...)`` runs each drafter once at K_max with the scheduler plugin changing the
verified depth at runtime, and returns (and stores) a `ProfileResult` per drafter.

What the rest of autotune predicts from (use these instead of building a ``ModelBackend`` or parsing profiles):

- `predictor_from_profile`: a stored profile as (acceptance per class, step-cost model), measured;
- `step_cost_entries`: step-time samples in the store's ``step_costs`` form;
- `roofline_cost_model`, `predicted_step_costs`, `predicted_goodput`: the model backend's roofline predictions for
  catalog models on catalog GPUs, where nothing was measured.
"""

from __future__ import annotations

from autotune.profiling._analysis import (
    acceptance_per_class,
    first_phase_outliers,
    fit_cost_model,
    metrics_check,
    outlier_warning,
    phase_totals,
    predictor_from_profile,
    step_cost_entries,
)
from autotune.profiling._plugin_run import (
    EngineRun,
    plan_warmup,
    plugin_provenance,
    run_plugin_job,
    shape_warmup,
    warmup_cost,
)
from autotune.profiling._predicted import predicted_goodput, predicted_step_costs, roofline_cost_model
from autotune.profiling._profile import DEFAULT_CONCURRENCIES, DEFAULT_MAX_K, profile
from autotune.profiling._result import ProfileResult, store_profile

__all__ = [
    "DEFAULT_CONCURRENCIES",
    "DEFAULT_MAX_K",
    "EngineRun",
    "ProfileResult",
    "acceptance_per_class",
    "first_phase_outliers",
    "fit_cost_model",
    "metrics_check",
    "outlier_warning",
    "phase_totals",
    "plan_warmup",
    "plugin_provenance",
    "predicted_goodput",
    "predicted_step_costs",
    "predictor_from_profile",
    "profile",
    "roofline_cost_model",
    "run_plugin_job",
    "shape_warmup",
    "step_cost_entries",
    "store_profile",
    "warmup_cost",
]
