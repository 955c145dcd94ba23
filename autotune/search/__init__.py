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
