"""Trace-driven simulation of continuous batching with speculative decoding: predicted serving on a GPU.

A discrete-event simulation of vLLM-style continuous batching (closed loop at a concurrency or Poisson arrivals;
chunked prefill; ``max_num_seqs``), in which each step's time comes from a step-cost source (the model backend's
roofline for a GPU, or a measured `policies.StepCostModel`) and each request's accepted drafts come from an
acceptance model (class profiles with autocorrelation, or recorded per-request traces). Configs compared side by
side: no speculation, static K, vLLM's batch-size schedule, the adaptive controller (the real
`policies.DepthController`, driven through its public API) and the per-phase oracle. Everything it outputs is
PREDICTED and says from what.

Example::

    from autotune.simulate import gpu_setup, phases_from_workload, predict
    from autotune.workloads import load_workload

    w = load_workload("mixed")
    workloads = {s: phases_from_workload(w, s, 64, classes=["chat", "code"]) for s in ("shifting", "stationary")}
    setup = gpu_setup("gpt-oss-120b", "h200", workloads)
    result = predict(setup, workloads, concurrencies=[1, 8, 64])
    study = store_simulation(Store(), result)   # kept as trials of study `study`; load_simulation reads it back
"""

from __future__ import annotations

from autotune.simulate._acceptance import (
    AcceptanceModel,
    AcceptanceStream,
    RequestTrace,
    autocorrelation_statistic,
    fit_autocorrelation,
    load_traces,
)
from autotune.simulate._compare import ORACLE_LABEL, oracle_result, run_configs
from autotune.simulate._configs import (
    OFF_STEP_MODES,
    Adaptive,
    BatchSizeSchedule,
    DepthRule,
    NoSpeculation,
    ServingConfig,
    StaticDepth,
    off_step_mode,
)
from autotune.simulate._cost import (
    FittedStepCost,
    RooflineStepCost,
    StepCostSource,
    StepShape,
    controller_cost_model,
    drafter_token_ratio,
    params_per_token,
)
from autotune.simulate._engine import MAX_CATCH_UP_TOKENS, RequestRecord, SimRun, simulate
from autotune.simulate._predict import predict
from autotune.simulate._prefix_cache import PrefixCache
from autotune.simulate._requests import SHAPES, Phase, SimRequest, WorkloadShape, phases_from_workload
from autotune.simulate._result import ConfigResult, SimulationResult
from autotune.simulate._setup import (
    CONFIG_KINDS,
    Setup,
    gpu_setup,
    mean_context,
    profile_setup,
    published_profiles,
    token_weights,
)
from autotune.simulate._store import (
    SIMULATE_BACKEND,
    StoredSimulation,
    is_simulation,
    list_simulations,
    load_simulation,
    simulation_study_name,
    store_simulation,
)
from autotune.simulate._terms import (
    ProfileTerms,
    drafter_token_ms,
    idle_drafter_ms,
    mean_cost_model,
    model_config,
    profile_step_means,
    profile_terms,
    prompt_token_costs,
)

__all__ = [
    "PrefixCache",
    "CONFIG_KINDS",
    "MAX_CATCH_UP_TOKENS",
    "OFF_STEP_MODES",
    "ORACLE_LABEL",
    "SHAPES",
    "SIMULATE_BACKEND",
    "AcceptanceModel",
    "AcceptanceStream",
    "Adaptive",
    "BatchSizeSchedule",
    "ConfigResult",
    "DepthRule",
    "FittedStepCost",
    "NoSpeculation",
    "Phase",
    "ProfileTerms",
    "RequestRecord",
    "RequestTrace",
    "RooflineStepCost",
    "ServingConfig",
    "Setup",
    "SimRequest",
    "SimRun",
    "SimulationResult",
    "StaticDepth",
    "StepCostSource",
    "StepShape",
    "StoredSimulation",
    "WorkloadShape",
    "autocorrelation_statistic",
    "controller_cost_model",
    "drafter_token_ms",
    "drafter_token_ratio",
    "fit_autocorrelation",
    "gpu_setup",
    "idle_drafter_ms",
    "is_simulation",
    "list_simulations",
    "load_simulation",
    "load_traces",
    "mean_context",
    "mean_cost_model",
    "model_config",
    "off_step_mode",
    "oracle_result",
    "params_per_token",
    "phases_from_workload",
    "predict",
    "profile_setup",
    "profile_step_means",
    "profile_terms",
    "prompt_token_costs",
    "published_profiles",
    "run_configs",
    "simulate",
    "simulation_study_name",
    "store_simulation",
    "token_weights",
]
