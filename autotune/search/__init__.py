"""Search: an Optuna study per scenario over the space, each trial measured (or predicted) by a backend.

Modules, from what is searched to how:

- `objective`: what is optimised (throughput, latency, goodput under SLOs, the throughput/TPOT Pareto front) and
  the SLO constraints; `space`: the configs (drafter, K, parallel drafting, max_num_seqs, max_num_batched_tokens);
  `schedule`: batch-size -> K schedules;
- `strategy`: the `Strategy` interface and the narrow `StrategyContext` its hooks see; `strategies` (blackbox,
  random, grid), `model_guided` (predict from profiles, verify, recalibrate with the pure `calibration`, stop when
  the best is confirmed), `registry` (``--strategy NAME``), `profiles` (stored or new drafter profiles);
- `study`: the loop (`Search`); `coordination`: sharing a study between workers (claim lock, heartbeats, storage);
  `trials` / `records`: our attributes of each trial and our store's copy of it; `events`: progress;
- `compare`: pure trial comparison (each drafter variant's best config, the tie rule);
- `result`: `ScenarioResult` and the rules that pick the recommendation (`depths` adds the schedule and per-class
  caps when the backend predicts);
- `session`: the search command as an application service (resolve the inputs, one search per concurrency, store
  the recommendations; no printing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.errors import StudyStorageError
    from autotune.search.calibration import calibration_scales
    from autotune.search.events import EventCallback, SearchEvent
    from autotune.search.machine import choose_backend
    from autotune.search.model_guided import DEFAULT_NOISE, DEFAULT_PREDICTION_ERROR, ModelGuidedStrategy
    from autotune.search.objective import OBJECTIVES, SLO_METRICS, MissingFigureError, Objective, measurement_metrics
    from autotune.search.profiles import DrafterProfile, store_or_profile, stored_profile
    from autotune.search.registry import STRATEGIES, StrategyFactory, make_strategy, register_strategy
    from autotune.search.result import ParetoPoint, ScenarioResult
    from autotune.search.schedule import ScheduleEntry, best_depth_per_batch, default_batch_sizes, merge_schedule
    from autotune.search.session import (
        SearchOptions,
        SearchPlan,
        SearchRun,
        plan_search,
        resolve_strategy,
        run_search,
    )
    from autotune.search.space import DrafterChoice, SearchSpace, SpaceSpec, load_space_file, space_from_options
    from autotune.search.strategies import BlackboxStrategy, GridStrategy, RandomStrategy
    from autotune.search.strategy import ProfileProvider, Strategy, StrategyContext
    from autotune.search.study import Search, default_study_prefix, study_name_for

#: Where each public name lives: imported on first use (PEP 562), so importing one module of the package does not
#: load them all.
_HOMES = {
    "StudyStorageError": "autotune.errors",
    "calibration_scales": "autotune.search.calibration",
    "EventCallback": "autotune.search.events",
    "SearchEvent": "autotune.search.events",
    "choose_backend": "autotune.search.machine",
    "DEFAULT_NOISE": "autotune.search.model_guided",
    "DEFAULT_PREDICTION_ERROR": "autotune.search.model_guided",
    "ModelGuidedStrategy": "autotune.search.model_guided",
    "OBJECTIVES": "autotune.search.objective",
    "SLO_METRICS": "autotune.search.objective",
    "MissingFigureError": "autotune.search.objective",
    "Objective": "autotune.search.objective",
    "measurement_metrics": "autotune.search.objective",
    "DrafterProfile": "autotune.search.profiles",
    "store_or_profile": "autotune.search.profiles",
    "stored_profile": "autotune.search.profiles",
    "STRATEGIES": "autotune.search.registry",
    "StrategyFactory": "autotune.search.registry",
    "make_strategy": "autotune.search.registry",
    "register_strategy": "autotune.search.registry",
    "ParetoPoint": "autotune.search.result",
    "ScenarioResult": "autotune.search.result",
    "ScheduleEntry": "autotune.search.schedule",
    "best_depth_per_batch": "autotune.search.schedule",
    "default_batch_sizes": "autotune.search.schedule",
    "merge_schedule": "autotune.search.schedule",
    "SearchOptions": "autotune.search.session",
    "SearchPlan": "autotune.search.session",
    "SearchRun": "autotune.search.session",
    "plan_search": "autotune.search.session",
    "resolve_strategy": "autotune.search.session",
    "run_search": "autotune.search.session",
    "DrafterChoice": "autotune.search.space",
    "SearchSpace": "autotune.search.space",
    "SpaceSpec": "autotune.search.space",
    "load_space_file": "autotune.search.space",
    "space_from_options": "autotune.search.space",
    "BlackboxStrategy": "autotune.search.strategies",
    "GridStrategy": "autotune.search.strategies",
    "RandomStrategy": "autotune.search.strategies",
    "ProfileProvider": "autotune.search.strategy",
    "Strategy": "autotune.search.strategy",
    "StrategyContext": "autotune.search.strategy",
    "Search": "autotune.search.study",
    "default_study_prefix": "autotune.search.study",
    "study_name_for": "autotune.search.study",
}

__all__ = [
    "DEFAULT_NOISE",
    "DEFAULT_PREDICTION_ERROR",
    "OBJECTIVES",
    "SLO_METRICS",
    "STRATEGIES",
    "BlackboxStrategy",
    "DrafterChoice",
    "DrafterProfile",
    "EventCallback",
    "GridStrategy",
    "MissingFigureError",
    "ModelGuidedStrategy",
    "Objective",
    "ParetoPoint",
    "ProfileProvider",
    "RandomStrategy",
    "ScenarioResult",
    "ScheduleEntry",
    "Search",
    "SearchEvent",
    "SearchOptions",
    "SearchPlan",
    "SearchRun",
    "SearchSpace",
    "SpaceSpec",
    "Strategy",
    "StrategyContext",
    "StrategyFactory",
    "StudyStorageError",
    "best_depth_per_batch",
    "calibration_scales",
    "choose_backend",
    "default_batch_sizes",
    "default_study_prefix",
    "load_space_file",
    "make_strategy",
    "measurement_metrics",
    "merge_schedule",
    "plan_search",
    "register_strategy",
    "resolve_strategy",
    "run_search",
    "space_from_options",
    "store_or_profile",
    "stored_profile",
    "study_name_for",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'autotune.search' has no attribute {name!r}")
