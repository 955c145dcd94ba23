"""Search: an Optuna study per scenario over the space, each trial measured (or predicted) by a backend.

Pieces, top to bottom:

- `Objective`: what is optimised (throughput, latency, goodput under SLOs, or the throughput/TPOT Pareto front) and
  the SLO constraints (Optuna constraints: a trial is feasible when every value is <= 0);
- `Strategy`: how the next config is chosen: `model-guided` (profile once per drafter, predict every config, verify
  the best predictions, recalibrate, stop when the best is confirmed), `blackbox` TPE/GP with pruning, `random`,
  `grid`; `register_strategy` adds more;
- coordination: the study lives in the project's database (or `--storage`), so `--study NAME` resumes after a crash
  with no completed trial lost and several workers on several hosts can share it. Workers claim trials one at a time
  under a lock (a file lock for SQLite, an advisory lock for PostgreSQL), which keeps the study's total at the
  requested number with no config measured twice; heartbeats turn a killed worker's RUNNING trial into FAIL and
  re-queue it;
- `Search`: runs the loop, writes every trial to our store as well, and picks the recommendation.

Every figure keeps the provenance the backend gave it (measured or predicted).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import re
import socket
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import event, make_url
from sqlalchemy.exc import SQLAlchemyError

from autotune.backends.base import Backend
from autotune.errors import PeagleError, UsageError
from autotune.measurement import Measurement
from autotune.schedule import ScheduleEntry, best_depth_per_batch, default_batch_sizes, merge_schedule
from autotune.space import DrafterChoice, SearchSpace
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload
from store import InvalidRecordError, Store, mask_password

log = logging.getLogger(__name__)

__all__ = [
    "OBJECTIVES",
    "STRATEGIES",
    "BlackboxStrategy",
    "DEFAULT_NOISE",
    "DrafterProfile",
    "GridStrategy",
    "ModelGuidedStrategy",
    "ProfileProvider",
    "Objective",
    "ParetoPoint",
    "ProgressCallback",
    "RandomStrategy",
    "RelativeToBestPruner",
    "ScenarioResult",
    "Search",
    "SearchEvent",
    "Strategy",
    "StrategyContext",
    "StudyStorageError",
    "calibration_scales",
    "default_study_prefix",
    "make_strategy",
    "measurement_metrics",
    "register_strategy",
    "store_or_profile",
    "stored_profile",
    "study_name_for",
]

# ----------------------------------------------------------------------------------------------------- objectives

OBJECTIVES: tuple[str, ...] = ("throughput", "latency", "goodput", "pareto")

#: SLO name -> the metric it bounds (ms).
SLO_METRICS: dict[str, str] = {"tpot_ms_p99": "TPOT p99", "ttft_ms_p99": "TTFT p99"}


class _TrialFailed(Exception):
    """A measurement that came back without the figure the objective needs."""


class StudyStorageError(PeagleError):
    """The Optuna storage (--storage, or the --db database) cannot be opened."""


@dataclass(frozen=True)
class Objective:
    """What a search optimises, and the SLOs every recommended config must meet.

    - ``throughput``: maximise output tokens/s;
    - ``latency``: minimise TPOT p50 (ms per output token; p99 is reported);
    - ``goodput``: maximise output tokens/s among configs that meet the SLOs (at least one SLO required);
    - ``pareto``: maximise output tokens/s and minimise TPOT p99 together; the front is kept and the recommended
      point is the front's highest-throughput config that meets the SLOs given.

    SLOs given with any objective are Optuna constraints (``trial.set_constraint``): ``metric - slo`` in ms, feasible
    when <= 0. Violating trials stay in the study and the store with their constraint values and are never
    recommended.
    """

    name: str = "throughput"
    slo_tpot_p99_ms: float | None = None
    """Largest acceptable TPOT p99, ms."""
    slo_ttft_p99_ms: float | None = None
    """Largest acceptable TTFT p99, ms."""

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, but got {self.name!r}.")
        for option, value in (("--slo-tpot-p99", self.slo_tpot_p99_ms), ("--slo-ttft-p99", self.slo_ttft_p99_ms)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UsageError(f"{option} must be a positive number of milliseconds, but got {value}.")
        if self.name == "goodput" and not self.slos:
            raise UsageError(
                "--objective goodput maximises throughput subject to SLOs, but none was given. "
                "Pass --slo-tpot-p99 MS and/or --slo-ttft-p99 MS, or use --objective throughput."
            )

    @property
    def slos(self) -> dict[str, float]:
        """{metric: bound in ms} for the SLOs given."""
        out: dict[str, float] = {}
        if self.slo_tpot_p99_ms is not None:
            out["tpot_ms_p99"] = float(self.slo_tpot_p99_ms)
        if self.slo_ttft_p99_ms is not None:
            out["ttft_ms_p99"] = float(self.slo_ttft_p99_ms)
        return out

    @property
    def multi(self) -> bool:
        return self.name == "pareto"

    @property
    def value_names(self) -> list[str]:
        """The metrics Optuna optimises, in order (also the keys of a stored trial's ``values``)."""
        return {
            "throughput": ["output_tokens_per_s"],
            "goodput": ["output_tokens_per_s"],
            "latency": ["tpot_ms_p50"],
            "pareto": ["output_tokens_per_s", "tpot_ms_p99"],
        }[self.name]

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        return ["minimize" if n.startswith(("tpot", "ttft")) else "maximize" for n in self.value_names]

    def values(self, metrics: Mapping[str, Any]) -> list[float]:
        """The objective values of a measurement's metrics (see `measurement_metrics`)."""
        out = []
        for name in self.value_names:
            value = metrics.get(name)
            if value is None or not math.isfinite(float(value)):
                raise _TrialFailed(f"the backend returned no {name} figure, which objective {self.name} needs")
            out.append(float(value))
        return out

    def constraints(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """{metric: value - SLO} in ms; feasible when every entry is <= 0. A missing figure violates its SLO."""
        out: dict[str, float] = {}
        for metric, bound in self.slos.items():
            value = metrics.get(metric)
            out[metric] = math.inf if value is None else float(value) - bound
        return out

    def progress_value(self, partial: Measurement) -> float | None:
        """The value a partial (warm-up) measurement reports for pruning; None for multi-objective studies, which
        Optuna cannot prune."""
        if self.multi or not partial.ok:
            return None
        value = partial.tpot_ms_p50 if self.name == "latency" else partial.output_tokens_per_s
        return None if value is None or not math.isfinite(value) else float(value)

    def describe(self) -> str:
        base = {
            "throughput": "max output tokens/s",
            "latency": "min TPOT p50",
            "goodput": "max output tokens/s",
            "pareto": "Pareto front of output tokens/s vs TPOT p99",
        }[self.name]
        slos = ", ".join(f"{SLO_METRICS[m]} <= {v:g} ms" for m, v in self.slos.items())
        return f"{base} subject to {slos}" if slos else base

    def slug(self) -> str:
        """Short name for default study names, e.g. ``goodput-tpot30-ttft500``."""
        parts = [self.name]
        if self.slo_tpot_p99_ms is not None:
            parts.append(f"tpot{self.slo_tpot_p99_ms:g}")
        if self.slo_ttft_p99_ms is not None:
            parts.append(f"ttft{self.slo_ttft_p99_ms:g}")
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measurement_metrics(m: Measurement) -> dict[str, Any]:
    """The figures a trial keeps (tokens/s; TPOT and TTFT p50/p99 in ms; acceptance length).

    A backend that gives no p99 (the model backend predicts one steady-state value per config, with no tail) has its
    p50 used as the p99, and ``p99_from_p50`` lists the metrics where that was done.
    """
    out: dict[str, Any] = {
        "output_tokens_per_s": m.output_tokens_per_s,
        "tpot_ms_p50": m.tpot_ms_p50,
        "tpot_ms_p99": m.tpot_ms_p99,
        "ttft_ms_p50": m.ttft_ms_p50,
        "ttft_ms_p99": m.ttft_ms_p99,
    }
    filled = []
    for kind in ("tpot", "ttft"):
        if out[f"{kind}_ms_p99"] is None and out[f"{kind}_ms_p50"] is not None:
            out[f"{kind}_ms_p99"] = out[f"{kind}_ms_p50"]
            filled.append(f"{kind}_ms_p99")
    if filled:
        out["p99_from_p50"] = filled
    if m.spec is not None:
        out["acceptance_length"] = m.spec.mean_acceptance_length
    if "acceptance_length" in m.extra:
        out["acceptance_length"] = m.extra["acceptance_length"]
    if m.speedup_vs_no_spec is not None:
        out["speedup_vs_no_spec"] = m.speedup_vs_no_spec
    return out


# ------------------------------------------------------------------------------------------------------- pruning

#: A backend that can report an intermediate result takes ``measure(config, workload, scenario, on_progress=cb)``
#: and calls ``cb(partial)`` after its warm-up phase with a partial `Measurement` (tokens/s and TPOT so far). ``cb``
#: returns False when the search prunes the trial: the backend should then stop and return what it has.
ProgressCallback = Callable[[Measurement], bool]


def _accepts_progress(backend: Backend) -> bool:
    import inspect

    try:
        return "on_progress" in inspect.signature(backend.measure).parameters
    except (TypeError, ValueError):
        return False


class RelativeToBestPruner(optuna.pruners.BasePruner):
    """Prune a trial whose latest intermediate value is clearly worse than the best finished (feasible) trial.

    "Clearly worse" is beyond `margin` relative to the best: below ``best * (1 - margin)`` when maximising, above
    ``best * (1 + margin)`` when minimising. Nothing is pruned until `n_startup_trials` trials have completed.
    """

    def __init__(self, margin: float = 0.3, n_startup_trials: int = 5) -> None:
        if not 0 < margin < 1:
            raise UsageError(f"The pruning margin must be in (0, 1), but got {margin}.")
        self.margin = margin
        self.n_startup_trials = n_startup_trials

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        done = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if all(c <= 0 for c in t.constraints.values())
        ]
        if len(done) < self.n_startup_trials:
            return False
        if study.direction == optuna.study.StudyDirection.MAXIMIZE:
            best = max(float(t.value) for t in done if t.value is not None)
            return value < best - abs(best) * self.margin
        best = min(float(t.value) for t in done if t.value is not None)
        return value > best + abs(best) * self.margin


# ---------------------------------------------------------------------------------------------------- strategies


@dataclass
class StrategyContext:
    """What a strategy's hooks see: the search (backend, space, objective), the study, the scenario, the target."""

    search: Search
    study: optuna.Study
    scenario: Scenario
    target: int
    """Trials the study should finish (shared by every worker)."""


class Strategy(abc.ABC):
    """How a search chooses configs. Small on purpose, like Optuna's samplers: a sampler, an optional pruner, the
    configs to try first, and hooks after each trial.

    `ModelGuidedStrategy` uses every hook: `initial_configs` returns the top predicted configs for
    ``ctx.scenario`` (and the baselines); `after_trial` recalibrates the predictor from each measurement and
    enqueues the next candidate (``ctx.study.enqueue_trial(ctx.search.space.params_of(config))``); `should_stop`
    ends the search once the best is confirmed within the measurement noise; `report` adds its profiling launches.
    Register a strategy with `register_strategy` (its factory receives ``sampler=`` when --sampler is given).
    """

    name: ClassVar[str] = "base"

    @property
    def label(self) -> str:
        """Name with options, for default study names (e.g. ``blackbox-gp``)."""
        return self.name

    @abc.abstractmethod
    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        """The Optuna sampler; `deterministic` is True when the backend predicts (same config, same value)."""

    def pruner(self, objective: Objective) -> optuna.pruners.BasePruner:
        """The Optuna pruner used when the backend reports intermediate values (default: never prune)."""
        return optuna.pruners.NopPruner()

    def default_trials(self, space: SearchSpace) -> int:
        """Trials per scenario when the user gives no --trials."""
        return 60

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        """Configs to enqueue, in order, before the sampler chooses (configs already in the study are skipped).
        Called under the claim lock each time a worker opens the study."""
        return []

    def after_trial(self, ctx: StrategyContext, config: SpecConfig, measurement: Measurement) -> None:  # noqa: B027
        """Called after each trial this worker measured."""

    def should_stop(self, ctx: StrategyContext) -> bool:
        """True ends this worker's search before the target is reached."""
        return False

    def report(self, ctx: StrategyContext) -> dict[str, Any]:
        """What the strategy adds to the scenario's result (`ScenarioResult.strategy_report`); called once per
        scenario when the search picks its result. ``profile_launches`` there counts engine launches spent outside
        the trials (e.g. profiling) and is added to `ScenarioResult.engine_launches`."""
        return {}


class BlackboxStrategy(Strategy):
    """Optuna's TPE (or GP) over real measurements, baselines first, pruning clearly worse trials after warm-up.

    When the whole grid fits in the trial budget it is measured exhaustively instead.
    """

    name = "blackbox"

    def __init__(self, sampler: str = "tpe", prune_margin: float = 0.3, prune_after: int = 5) -> None:
        if sampler not in ("tpe", "gp"):
            raise UsageError(f"--sampler must be tpe or gp, but got {sampler!r}.")
        self.sampler_name = sampler
        self.prune_margin = prune_margin
        self.prune_after = prune_after

    @property
    def label(self) -> str:
        return self.name if self.sampler_name == "tpe" else f"{self.name}-{self.sampler_name}"

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            # Grouped multivariate TPE (the conditional space) and GP are stable but flagged experimental.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if self.sampler_name == "gp":
                return optuna.samplers.GPSampler(seed=seed, deterministic_objective=deterministic)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)

    def pruner(self, objective: Objective) -> optuna.pruners.BasePruner:
        if objective.multi:
            return optuna.pruners.NopPruner()
        return RelativeToBestPruner(self.prune_margin, self.prune_after)

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        grid = ctx.search.space.grid()
        return grid if len(grid) <= ctx.target else ctx.search.space.baselines()[: ctx.target]


class RandomStrategy(Strategy):
    """Uniformly random configs (Optuna's RandomSampler); the reference point for comparing strategies."""

    name = "random"

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)


class GridStrategy(Strategy):
    """Every config of the space, in `SearchSpace.grid` order (the first `--trials` of them if given)."""

    name = "grid"

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        # Every trial comes from the queue; the sampler only ever fills nothing.
        return optuna.samplers.RandomSampler(seed=seed)

    def default_trials(self, space: SearchSpace) -> int:
        return len(space.grid())

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        return ctx.search.space.grid()[: ctx.target]


# ------------------------------------------------------------------------------------------------- model-guided

#: Relative measurement noise of tokens/s assumed when confirming the best (3%: repeated launches of the same config
#: on the 2-core CPU box of the benchmark differ by 1-3%; GPUs are steadier). Override with ``noise=``.
DEFAULT_NOISE = 0.03
#: Relative error assumed for a calibrated prediction until two speculative configs have been measured.
DEFAULT_PREDICTION_ERROR = 0.10


@dataclass
class DrafterProfile:
    """What model-guided predicts one drafter from: a measured profile (acceptance per class, fitted step cost)."""

    drafter: str
    acceptance: dict[str, Any]
    """Workload class -> `policies.AcceptanceProfile` (measured)."""
    cost_model: Any
    """`policies.StepCostModel` fitted on the profile's measured step times."""
    label: str
    """Where it came from, e.g. ``stored profile #3`` or ``new profile #4``."""
    profile_id: int | None = None
    launches: int = 0
    """Engine launches spent to get it in this search (0: a stored profile was reused)."""


#: (context, drafter) -> its profile. The default, `store_or_profile`, reuses a stored profile or makes one.
ProfileProvider = Callable[[StrategyContext, DrafterChoice], DrafterProfile]


def _drafter_names(name: str) -> list[str]:
    """The names a stored profile of drafter `name` may be filed under (as given, resolved path, vLLM-safe alias)."""
    out = [name]
    if Path(name).expanduser().is_dir():
        from autotune.backends._paths import safe_draft_model_path

        resolved = str(Path(name).expanduser().resolve())
        out += [resolved, safe_draft_model_path(resolved)]
    return list(dict.fromkeys(out))


def stored_profile(search: Search, drafter: DrafterChoice) -> Any | None:
    """The newest stored profile of `drafter` for the search's model, device and workload (same content hash) that
    covers the space's K range, or None."""
    for name in _drafter_names(drafter.name):
        record = search.store.latest_profile(
            search.model, drafter=name, device=search.device, workload_hash=search.workload.content_hash()
        )
        if record is not None and int(record.max_k) >= search.space.k_max:
            return record
    return None


def store_or_profile(ctx: StrategyContext, drafter: DrafterChoice, concurrencies: Sequence[int] = ()) -> DrafterProfile:
    """Reuse the stored profile of `drafter` (same model, drafter, device, workload hash; K_max >= the space's), else
    profile it with ONE engine launch on the search's vllm backend (same engine options) and store it.

    Raises UsageError when there is no stored profile and the backend cannot launch an engine, or profiling fails.
    """
    from autotune.profiling import predictor_from_profile, profile

    search = ctx.search
    record = stored_profile(search, drafter)
    if record is not None:
        acceptance, cost = predictor_from_profile(record)
        return DrafterProfile(drafter.name, acceptance, cost, f"stored profile #{record.id}", record.id, 0)
    backend: Any = search.backend
    if search.backend.name != "vllm" or not hasattr(backend, "model"):
        raise UsageError(
            f"--strategy model-guided predicts from a profile, but none is stored for drafter {drafter.name} with "
            f"model {search.model} on {search.device} and workload {search.workload.name} (hash "
            f"{search.workload.content_hash()[:12]}, K_max >= {search.space.k_max}), and the {search.backend.name} "
            "backend cannot make one. Run `peagle-tune profile` for it, use --backend vllm, or use --strategy blackbox."
        )
    parallel = search.space._pd_options(drafter)[0]
    wanted = sorted({1, ctx.scenario.concurrency, *concurrencies})
    [result] = profile(
        backend.model, [drafter.name], search.workload, concurrencies=wanted, max_k=search.space.k_max,
        store=search.store, model_name=search.model, method=drafter.method, parallel_drafting=parallel,
        ignore_eos=bool(getattr(backend, "ignore_eos", False)), timeout_s=float(getattr(backend, "timeout_s", 1800.0)),
        dtype=str(getattr(backend, "dtype", "auto")), max_model_len=getattr(backend, "max_model_len", None),
        load_format=getattr(backend, "load_format", None), engine_extra=getattr(backend, "engine_extra", None),
        env=getattr(backend, "env", None), cpu_kv_cache_gib=getattr(backend, "cpu_kv_cache_gib", 1),
    )
    if not result.ok or result.cost_model is None:
        raise UsageError(
            f"Profiling drafter {drafter.name} failed ({result.failure_kind}: {result.failure_reason}), so "
            "model-guided has nothing to predict from. Fix the cause (see the engine log) or use --strategy blackbox."
        )
    label = f"new profile #{result.profile_id}" if result.profile_id is not None else "new profile"
    return DrafterProfile(drafter.name, dict(result.acceptance), result.cost_model, label, result.profile_id,
                          result.engine_launches)


def calibration_scales(
    ratios: Mapping[SpecConfig, float], weight: float = 1.0, slope_weight: float = 4.0
) -> tuple[Callable[[SpecConfig], float], float]:
    """Multiplicative calibration of predictions from the measured/predicted ratios of the measured configs.

    `ratios`: config -> log(measured / predicted) of its objective score (higher is better). Speculative configs get
    ``log factor = g + d[drafter] + b * (K - mean measured K)``, fitted by least squares with ridge priors: each
    drafter's offset d is pulled to 0 with `weight` pseudo-observations and the slope b (log units per unit of K) with
    `slope_weight`, so one measurement moves every prediction by the same factor and a K trend is trusted once
    several depths were measured. (A profile run at K_max with the verified depth trimmed cannot see how the
    drafter's own cost grows with K; the slope absorbs that.) The no-speculation baseline is its own group: its
    measured ratio, else g.

    Returns ``(log_scale(config), error)``: the log factor for a config's prediction, and the leave-one-out RMS
    relative error of calibrated predictions of measured speculative configs (NaN with fewer than two).

    Worked example: two configs of one drafter at K=2 and K=4 measured at exactly 0.8x their predictions: g =
    log 0.8, d = 0, b = 0, so every config of every drafter is predicted at 0.8x, and leaving either out predicts it
    at 0.8x again: error 0.
    """
    import numpy as np

    def fit(items: Sequence[tuple[SpecConfig, float]]) -> Callable[[SpecConfig], float]:
        spec = [(c, r) for c, r in items if c.speculative]
        base = [r for c, r in items if not c.speculative]
        drafters = sorted({str(c.drafter) for c, _ in spec})
        k_ref = sum(c.k for c, _ in spec) / len(spec) if spec else 0.0
        g = 0.0
        offsets: dict[str, float] = {}
        slope = 0.0
        if spec:
            n = 2 + len(drafters)  # g, b, d_1..d_n
            rows, ys = [], []
            for c, r in spec:
                row = [1.0, c.k - k_ref] + [1.0 if str(c.drafter) == d else 0.0 for d in drafters]
                rows.append(row)
                ys.append(r)
            rows.append([0.0, math.sqrt(slope_weight)] + [0.0] * len(drafters))
            ys.append(0.0)
            for i in range(len(drafters)):
                row = [0.0] * n
                row[2 + i] = math.sqrt(weight)
                rows.append(row)
                ys.append(0.0)
            theta = np.linalg.lstsq(np.asarray(rows), np.asarray(ys), rcond=None)[0]
            g, slope = float(theta[0]), float(theta[1])
            offsets = {d: float(theta[2 + i]) for i, d in enumerate(drafters)}
        elif base:
            g = sum(base) / len(base)
        base_scale = sum(base) / len(base) if base else g

        def log_scale(c: SpecConfig) -> float:
            if not c.speculative:
                return base_scale
            return g + offsets.get(str(c.drafter), 0.0) + slope * (c.k - k_ref)

        return log_scale

    items = list(ratios.items())
    errors = []
    for i, (c, r) in enumerate(items):
        if not c.speculative:
            continue
        rest = items[:i] + items[i + 1:]
        if not any(o.speculative for o, _ in rest):
            continue
        errors.append(math.expm1(abs(r - fit(rest)(c))))
    error = math.sqrt(sum(e * e for e in errors) / len(errors)) if len(errors) >= 2 else math.nan
    return fit(items), error


@dataclass
class _Guide:
    """Model-guided state of one scenario's study: predictions, measurements, calibration, the stop decision."""

    predicted: dict[SpecConfig, float]
    """Predicted score (higher is better: tokens/s, or 1/TPOT for latency) per config of the space."""
    predicted_feasible: dict[SpecConfig, bool]
    measured: dict[SpecConfig, float | None] = field(default_factory=dict)
    """Measured score per finished config (None: failed or violates an SLO)."""
    stop: bool = False
    reason: str = ""
    error: float = math.nan
    trace: list[dict[str, Any]] = field(default_factory=list)

    def calibrated(self) -> tuple[dict[SpecConfig, float], float]:
        ratios = {
            c: math.log(m / self.predicted[c])
            for c, m in self.measured.items()
            if m is not None and self.predicted.get(c, 0.0) > 0 and m > 0
        }
        log_scale, error = calibration_scales(ratios)
        return {c: p * math.exp(log_scale(c)) for c, p in self.predicted.items() if p > 0}, error


class ModelGuidedStrategy(Strategy):
    """Profile once per drafter, predict every config, verify the best predictions with real trials, recalibrate from
    each, stop once the best measured config is confirmed within the measurement noise.

    1. Profiles: a stored profile of each drafter for the same model, device and workload is reused; otherwise the
       drafter is profiled with one engine launch (`store_or_profile`; `profile_launches` counts them).
    2. Predictions: every config of the space through `ModelBackend(acceptance=..., cost_model=...)` (predicted).
    3. Trials (measured by the search's backend): the best predicted config (of those predicted within the noise of
       the top, the smallest K), then the baselines at its max_num_seqs (no speculation; each drafter at its
       publisher's K), then up to `initial_top` best predicted; after each
       trial the predictions are recalibrated (`calibration_scales`: a multiplicative factor per drafter with a
       trend in K, fitted on measured/predicted) and the best remaining candidate is enqueued.
    4. Stop rule (after at least `min_trials` trials): every unmeasured candidate's calibrated prediction, raised by
       the calibrated predictions' error (leave-one-out; `DEFAULT_PREDICTION_ERROR` until it can be estimated, and
       at least that for a drafter with no measured config), is
       at most the best measured score times ``1 + noise``: no remaining config is expected to beat the best by more
       than the measurement noise.

    The objective score is tokens/s (throughput, goodput, the throughput axis of pareto) or 1/TPOT p50 (latency);
    configs predicted to violate an SLO are tried after every config predicted to meet them.
    """

    name = "model-guided"

    def __init__(
        self,
        sampler: str = "tpe",
        *,
        initial_top: int = 1,
        noise: float = DEFAULT_NOISE,
        min_trials: int = 3,
        profiles: ProfileProvider | None = None,
        profile_concurrencies: Sequence[int] = (),
    ) -> None:
        if sampler not in ("tpe", "gp"):
            raise UsageError(f"--sampler must be tpe or gp, but got {sampler!r}.")
        if not 0 <= noise < 1:
            raise UsageError(f"The measurement noise must be in [0, 1) (a fraction, e.g. 0.03), but got {noise}.")
        if initial_top < 1 or min_trials < 1:
            raise UsageError(f"initial_top and min_trials must be >= 1, but got {initial_top} and {min_trials}.")
        self._fallback = BlackboxStrategy(sampler)
        self.initial_top = initial_top
        self.noise = noise
        self.min_trials = min_trials
        self.profile_concurrencies = tuple(profile_concurrencies)
        self._provider = profiles
        self.profiles: dict[str, DrafterProfile] = {}
        self._guides: dict[str, _Guide] = {}
        self._charged: set[str] = set()
        self._charged_launches = 0

    # ---- Strategy hooks ------------------------------------------------------------------------------------------

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        # Only used once every predicted candidate is queued or measured and the stop rule has not fired.
        return self._fallback.sampler(objective, seed, deterministic=deterministic)

    def default_trials(self, space: SearchSpace) -> int:
        return len(space.grid())  # the stop rule ends the search long before

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        guide = self._guide(ctx)
        if guide.measured:  # a resumed study: continue from its trials
            remaining = self._decide(ctx, guide)
            if guide.stop or self._queued(ctx) or not remaining:
                return []
            return [self._pick(guide, remaining, guide.calibrated()[0])]
        ranked = self._ranked(ctx, guide, guide.predicted)
        if not ranked:
            return []
        first = self._pick(guide, ranked, guide.predicted)
        ranked.remove(first)
        base = ctx.search.space.baselines([first.max_num_seqs])
        out = [first, *base, *ranked[:self.initial_top - 1]]
        return list(dict.fromkeys(out))

    def after_trial(self, ctx: StrategyContext, config: SpecConfig, measurement: Measurement) -> None:
        guide = self._guide(ctx)
        guide.measured[config] = self._score(ctx, measurement)
        self._sync(ctx, guide)
        remaining = self._decide(ctx, guide, config)
        if not guide.stop and remaining and not self._queued(ctx):
            calibrated, _ = guide.calibrated()
            ctx.study.enqueue_trial(ctx.search.space.params_of(self._pick(guide, remaining, calibrated)))

    def _decide(self, ctx: StrategyContext, guide: _Guide, config: SpecConfig | None = None) -> list[SpecConfig]:
        """Recalibrate, apply the stop rule (sets ``guide.stop``), and return the unmeasured, unqueued candidates
        by calibrated prediction."""
        calibrated, error = guide.calibrated()
        guide.error = error
        feasible = [s for s in guide.measured.values() if s is not None]
        best = max(feasible) if feasible else None
        remaining = self._ranked(ctx, guide, calibrated, exclude=set(guide.measured) | self._queued(ctx))
        if config is not None:
            guide.trace.append({
                "trial": len(guide.measured), "config": config.label(), "measured": guide.measured.get(config),
                "predicted": guide.predicted.get(config), "best": best,
                "error": None if math.isnan(error) else error,
            })
        if best is not None and len(guide.measured) >= self.min_trials:
            err = DEFAULT_PREDICTION_ERROR if math.isnan(error) else error
            bound = best * (1.0 + self.noise)
            # A drafter none of whose configs was measured is calibrated from the others only: at least the default
            # prediction error applies to it.
            tried = {str(c.drafter) for c in guide.measured if c.speculative}

            def margin(c: SpecConfig) -> float:
                return err if not c.speculative or str(c.drafter) in tried else max(err, DEFAULT_PREDICTION_ERROR)

            if not any(calibrated.get(c, 0.0) * (1.0 + margin(c)) > bound for c in remaining):
                guide.stop = True
                guide.reason = (
                    f"best confirmed: no unmeasured config is predicted above {1 + self.noise:.2f}x the best measured "
                    f"(calibrated predictions, +{err:.0%} prediction error)"
                )
                return remaining
        if not remaining and not self._queued(ctx) and feasible:
            guide.stop = True
            guide.reason = "every predicted config was measured"
        return remaining

    def should_stop(self, ctx: StrategyContext) -> bool:
        return self._guide(ctx).stop

    # ---- reporting -----------------------------------------------------------------------------------------------

    def report(self, ctx: StrategyContext) -> dict[str, Any]:
        """Profile launches charged to this scenario (a profile shared by several scenarios is charged to the first),
        the profiles used, the stop reason and the calibration trace."""
        guide = self._guide(ctx)
        key = ctx.study.study_name
        launches = 0
        if key not in self._charged:
            self._charged.add(key)
            launches = sum(p.launches for p in self.profiles.values()) - self._charged_launches
            self._charged_launches += launches
        calibrated, error = guide.calibrated()
        top = self._ranked(ctx, guide, guide.predicted)[:1]
        return {
            "profile_launches": launches,
            "profiles": {d: p.label for d, p in self.profiles.items()},
            "stop_reason": guide.reason or "trial budget reached",
            "predicted_best": top[0].label() if top else None,
            "prediction_error": None if math.isnan(error) else error,
            "noise": self.noise,
            "trace": guide.trace,
        }

    # ---- internals -----------------------------------------------------------------------------------------------

    def _provide(self, ctx: StrategyContext, drafter: DrafterChoice) -> DrafterProfile:
        if drafter.name not in self.profiles:
            if self._provider is not None:
                self.profiles[drafter.name] = self._provider(ctx, drafter)
            else:
                self.profiles[drafter.name] = store_or_profile(ctx, drafter, self.profile_concurrencies)
        return self.profiles[drafter.name]

    def _guide(self, ctx: StrategyContext) -> _Guide:
        key = ctx.study.study_name
        if key not in self._guides:
            predicted, feasible = self._predict(ctx)
            self._guides[key] = guide = _Guide(predicted, feasible)
            self._sync(ctx, guide)
        return self._guides[key]

    def _predict(self, ctx: StrategyContext) -> tuple[dict[SpecConfig, float], dict[SpecConfig, bool]]:
        from autotune.backends.model import ModelBackend
        from autotune.catalogs import get_drafter, resolve_model

        search = ctx.search
        space = search.space
        real = [d for d in space.drafters if not d.hypothetical]
        profiles = {d.name: self._provide(ctx, d) for d in real}
        try:
            target = resolve_model(str(getattr(search.backend, "model", search.model)))
        except PeagleError:
            target = resolve_model(search.model)
        backends: dict[str, ModelBackend] = {}
        for d in real:
            p = profiles[d.name]
            try:
                specs = [get_drafter(d.name, target=target.name)]
            except PeagleError:
                specs = []
            backends[d.name] = ModelBackend(
                target, drafters=specs, acceptance=p.acceptance, cost_model=p.cost_model,
                acceptance_drafter=d.name, profile_label=p.label,
            )
        predicted: dict[SpecConfig, float] = {}
        feasible: dict[SpecConfig, bool] = {}
        for config in space.grid():
            backend = backends.get(str(config.drafter)) if config.speculative else next(iter(backends.values()), None)
            if backend is None:
                continue
            m = backend.measure(config, search.workload, ctx.scenario)
            score = self._score(ctx, m, check_slos=False)
            if score is not None:
                predicted[config] = score
                metrics = measurement_metrics(m)
                feasible[config] = all(v <= 0 for v in search.objective.constraints(metrics).values())
        if not predicted:
            raise UsageError(
                "--strategy model-guided could not predict any config of the space from the profiles "
                f"({', '.join(p.label for p in profiles.values()) or 'none'}). Use --strategy blackbox."
            )
        return predicted, feasible

    @staticmethod
    def _score(ctx: StrategyContext, m: Measurement, check_slos: bool = True) -> float | None:
        """Higher-is-better score of a measurement for the objective; None when it failed (or violates an SLO)."""
        if not m.ok:
            return None
        objective = ctx.search.objective
        metrics = measurement_metrics(m)
        try:
            value = objective.values(metrics)[0]
        except _TrialFailed:
            return None
        if check_slos and any(v > 0 for v in objective.constraints(metrics).values()):
            return None
        if value <= 0:
            return None
        return value if objective.directions[0] == "maximize" else 1.0 / value

    def _ranked(
        self, ctx: StrategyContext, guide: _Guide, scores: Mapping[SpecConfig, float],
        exclude: set[SpecConfig] | None = None,
    ) -> list[SpecConfig]:
        """Candidates by score, predicted-feasible first; ties to the smaller K."""
        skip = exclude or set()
        items = [c for c in scores if c not in skip]
        return sorted(items, key=lambda c: (not guide.predicted_feasible.get(c, True), -scores[c], c.k))

    def _pick(self, guide: _Guide, ranked: Sequence[SpecConfig], scores: Mapping[SpecConfig, float]) -> SpecConfig:
        """The next config to verify: of the candidates predicted within the noise of the top one (same predicted
        feasibility), the smallest K. Predictions flatten out at large K, where what a profile cannot see (the
        drafter's own cost growing with K) matters most, so a near-tie is settled toward less verification work."""
        top = ranked[0]
        bar = scores[top] * (1.0 - self.noise)
        near = [c for c in ranked if guide.predicted_feasible.get(c, True) == guide.predicted_feasible.get(top, True)
                and scores[c] >= bar]
        return min(near, key=lambda c: (c.k, -scores[c]))

    def _sync(self, ctx: StrategyContext, guide: _Guide) -> None:
        """Take in trials finished by other workers (or an earlier run of a resumed study)."""
        for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            if not _counted(t) or not t.state.is_finished():
                continue
            config = ctx.search._config_of(t)
            if config is None or config in guide.measured:
                continue
            data = _info(t).get("measurement")
            if t.state == TrialState.COMPLETE and data is not None:
                try:
                    guide.measured[config] = self._score(ctx, Measurement.from_dict(data))
                    continue
                except (TypeError, ValueError, KeyError, PeagleError):
                    pass
            guide.measured[config] = None

    def _queued(self, ctx: StrategyContext) -> set[SpecConfig]:
        out = set()
        for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
            config = ctx.search._config_of(t)
            if config is not None:
                out.add(config)
        return out


StrategyFactory = Callable[..., Strategy]

#: name -> factory(sampler=...). ``model-guided`` is reserved for the profile-driven strategy.
STRATEGIES: dict[str, StrategyFactory] = {
    "blackbox": BlackboxStrategy,
    "random": lambda **_: RandomStrategy(),
    "grid": lambda **_: GridStrategy(),
    "model-guided": ModelGuidedStrategy,
}


def register_strategy(name: str, factory: StrategyFactory) -> None:
    """Make `factory` (called as ``factory(sampler=NAME_OR_NONE)``) available as ``--strategy NAME``."""
    STRATEGIES[name] = factory


def make_strategy(name: str, sampler: str | None = None) -> Strategy:
    """The strategy called `name`; `sampler` (tpe, gp) applies to blackbox only."""
    if name not in STRATEGIES:
        raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}, but got {name!r}.")
    if sampler is not None and name != "blackbox":
        raise UsageError(f"--sampler {sampler} applies to --strategy blackbox only, but the strategy is {name}.")
    return STRATEGIES[name](**({"sampler": sampler} if sampler is not None else {}))


# -------------------------------------------------------------------------------------------------- coordination

#: Retries of a trial whose worker died (a config that kills its worker every time is not tried forever).
MAX_RETRIES = 2
#: Consecutive sampled duplicates after which an unmeasured config is enqueued to keep the search moving.
DUPLICATE_STREAK_LIMIT = 8
#: Key of our per-trial attributes (a dict) in Optuna's trial user attributes.
ATTR = "peagle"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _this_worker() -> dict[str, Any]:
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid()}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: dead for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


class _ClaimLock(AbstractContextManager["_ClaimLock"]):
    """Serialises claiming the next trial (and setting a study up) across all workers of a database.

    SQLite file: an exclusive ``flock`` on ``<db>.claims.lock`` (workers share a host with the file).
    PostgreSQL: a session advisory lock keyed by the study name (released by the server if a worker dies).
    In-memory SQLite: a process-local lock. Other databases: no lock (`exclusive` is False), so concurrent workers
    may overshoot the trial total by up to one trial each.
    """

    _memory_lock = threading.Lock()
    _warned: ClassVar[set[str]] = set()

    def __init__(self, url: str, study_name: str) -> None:
        parsed = make_url(url)
        self.backend = parsed.get_backend_name()
        self._fd: int | None = None
        self._conn: Any = None
        self._engine: Any = None
        self.exclusive = True
        database = parsed.database or ""
        if self.backend == "sqlite" and database not in ("", ":memory:") and "mode=memory" not in database:
            self._kind = "file"
            self._path = f"{database}.claims.lock"
        elif self.backend == "sqlite":
            self._kind = "memory"
        elif self.backend == "postgresql":
            from sqlalchemy import create_engine
            from sqlalchemy.pool import NullPool

            self._kind = "postgres"
            self._key = int.from_bytes(hashlib.sha256(f"peagle:{study_name}".encode()).digest()[:8], "big", signed=True)
            self._engine = create_engine(parsed, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        else:
            self._kind = "none"
            self.exclusive = False
            if self.backend not in self._warned:
                self._warned.add(self.backend)
                log.warning(
                    "No cross-worker lock for %s databases: concurrent workers may overshoot --trials by up to one "
                    "trial each. Use SQLite or PostgreSQL for shared studies.",
                    self.backend,
                )

    def __enter__(self) -> _ClaimLock:
        if self._kind == "file":
            import fcntl

            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        elif self._kind == "memory":
            self._memory_lock.acquire()
        elif self._kind == "postgres":
            from sqlalchemy import text

            self._conn = self._engine.connect()
            self._conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._kind == "file" and self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        elif self._kind == "memory":
            self._memory_lock.release()
        elif self._kind == "postgres" and self._conn is not None:
            from sqlalchemy import text

            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
            finally:
                self._conn.close()
                self._conn = None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


class _Heartbeat(AbstractContextManager["_Heartbeat"]):
    """Records the trial's heartbeat every `interval` seconds while it is measured (a killed worker stops it)."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval: int) -> None:
        self._storage, self._trial_id, self._interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peagle-heartbeat-{trial_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as exc:  # a missed beat only risks a retry; never kill the measurement for it
                log.warning("heartbeat of trial %s failed: %s", self._trial_id, exc)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()


def open_storage(url: str, heartbeat_interval: int = 60, grace_period: int | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage for `url`, with heartbeats (a trial whose worker stops beating for `grace_period`
    seconds, default 2 x interval, becomes FAIL and is re-queued up to `MAX_RETRIES` times).

    SQLite files get a 30 s lock timeout and ``synchronous=NORMAL`` (WAL keeps every committed trial across a process
    crash; only an OS crash can lose the last commits), which makes each trial's commits cheap.
    """
    parsed = make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    memory = sqlite and (parsed.database in (None, "", ":memory:") or "mode=memory" in str(parsed.database))
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 30}} if sqlite else {"pool_pre_ping": True}
    if memory:
        # One shared connection, or every pooled connection would see its own empty database (the study lives
        # as long as this storage: in-memory studies cannot be resumed).
        from sqlalchemy.pool import StaticPool

        engine_kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=MAX_RETRIES
                ),
            )
        except (SQLAlchemyError, ImportError, RuntimeError, ValueError) as exc:
            raise StudyStorageError(
                f"Cannot open the Optuna storage {mask_password(url)}: {str(exc).splitlines()[0]}. Check --storage "
                "(a SQLAlchemy URL such as postgresql://user@host/db; the database must exist and be reachable) or "
                "leave it out to keep studies in the --db database."
            ) from exc
    if sqlite and not memory:

        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(storage.engine, "connect", _pragmas)
        storage.engine.dispose()  # reconnect with the pragmas
    return storage


# --------------------------------------------------------------------------------------------------- trial helpers


def _info(t: FrozenTrial) -> dict[str, Any]:
    value = t.user_attrs.get(ATTR)
    return value if isinstance(value, dict) else {}


def _counted(t: FrozenTrial) -> bool:
    """Does `t` use one of the study's trials: finished with a result, or running? (Duplicates of an already
    measured config and trials whose worker died do not.)"""
    info = _info(t)
    if info.get("duplicate_of") is not None:
        return False
    if t.state in (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and info.get("status") == "failed"


def _feasible(t: FrozenTrial) -> bool:
    return all(v <= 0 for v in t.constraints.values())


def _violation(t: FrozenTrial) -> float:
    return sum(max(v, 0.0) for v in t.constraints.values())


def _slim(m: Measurement) -> dict[str, Any]:
    """A JSON-safe dict of a measurement for a trial attribute (the engine log tail is left out)."""
    data = m.to_dict()
    data["log_tail"] = None
    return json.loads(json.dumps(data, default=str))


# ------------------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ParetoPoint:
    """One config on the Pareto front (throughput vs TPOT p99)."""

    config: SpecConfig
    metrics: dict[str, Any]
    trial: int
    hypothetical: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config.to_dict(), "metrics": self.metrics, "trial": self.trial}
        if self.hypothetical:
            out["hypothetical"] = True
        return out


@dataclass
class ScenarioResult:
    """The outcome of searching one scenario."""

    scenario: Scenario
    study_name: str
    objective: Objective
    strategy: str
    best: Measurement
    """The recommended config's measurement (or, when `feasible` is False, the config closest to the SLOs)."""
    baseline: Measurement | None
    """No speculation at the best config's max_num_seqs."""
    published: Measurement | None
    """The best config's drafter at its publisher's K."""
    n_trials: int
    """Finished trials of the study (all workers): complete + failed + pruned."""
    n_failed: int
    n_pruned: int = 0
    n_running: int = 0
    """Trials other workers were still measuring when this worker finished."""
    n_measurements: int = 0
    """backend.measure calls made by this worker for the study and comparisons (engine launches with vLLM)."""
    profile_launches: int = 0
    """Engine launches the strategy spent outside the trials for this scenario (model-guided: profiling; a profile
    shared by several scenarios is counted for the first)."""
    strategy_report: dict[str, Any] = field(default_factory=dict)
    """What the strategy reported (model-guided: profiles used, stop reason, prediction error, calibration trace)."""
    feasible: bool = True
    rule: str = ""
    """How the best config was chosen, in words."""
    pareto: list[ParetoPoint] = field(default_factory=list)
    hypothetical: str | None = None
    """Set when the best config uses a hypothetical drafter: what it is (no checkpoint exists)."""
    constraints: dict[str, float] = field(default_factory=dict)
    """The best config's constraint values (metric - SLO, ms; <= 0 met)."""
    schedule: list[ScheduleEntry] = field(default_factory=list)
    class_policy: dict[str, dict[str, int]] = field(default_factory=dict)
    recommendation_id: int | None = None

    @property
    def n_complete(self) -> int:
        return self.n_trials - self.n_failed - self.n_pruned

    @property
    def engine_launches(self) -> int:
        """Engine launches this worker used for the scenario: its measurements plus the strategy's profiling (with
        the vllm backend every measurement is one launch; with the model backend nothing is launched)."""
        return self.n_measurements + self.profile_launches

    def speedup_over(self, other: Measurement | None) -> float | None:
        if other is None or not other.ok or not other.output_tokens_per_s or not self.best.output_tokens_per_s:
            return None
        return self.best.output_tokens_per_s / other.output_tokens_per_s


@dataclass(frozen=True)
class SearchEvent:
    """Progress of one scenario's study, for progress bars. Counts cover every worker of the study."""

    kind: Literal["start", "trial", "end"]
    study: str
    target: int
    done: int
    """Finished trials counted against the target."""
    complete: int
    failed: int
    pruned: int
    running: int
    """Trials in flight on other workers."""
    trial_state: str | None = None
    """This worker's last trial: complete, failed, pruned or duplicate (a config already measured: not re-run)."""
    config: SpecConfig | None = None


EventCallback = Callable[[SearchEvent], None]


def study_name_for(prefix: str, scenario: Scenario) -> str:
    return f"{prefix}-c{scenario.concurrency}"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-").lower()


def default_study_prefix(model: str, device: str, workload: str, objective: str, strategy: str = "blackbox") -> str:
    return "-".join(_slug(p) for p in (model.split("/")[-1], device, workload, objective, strategy))


@dataclass
class _Run:
    """State of one scenario's search in this worker."""

    study: optuna.Study
    storage: optuna.storages.RDBStorage
    lock: _ClaimLock
    scenario: Scenario
    target: int
    ctx: StrategyContext
    measurements: int = 0
    streak: int = 0
    rng: random.Random = field(default_factory=random.Random)


@dataclass
class _Claim:
    trial: optuna.trial.Trial
    config: SpecConfig
    info: dict[str, Any]
    """Our attributes of the trial as set at the claim."""
    duplicate_of: FrozenTrial | None
    done: int
    counts: dict[str, int]


# -------------------------------------------------------------------------------------------------------- search


@dataclass
class Search:
    """One search: a model on a device, a workload, a space, an objective and a strategy, per scenario.

    ``n_trials`` is the study's total across all workers (None: the strategy's default; never more than the grid).
    ``study_prefix`` names the studies (``<prefix>-c<concurrency>``); re-running with the same name resumes them.
    ``storage_url`` is where the Optuna study lives (default: the store's database).
    """

    store: Store
    backend: Backend
    model: str
    device: str
    workload: Workload
    space: SearchSpace
    objective: Objective = field(default_factory=Objective)
    strategy: Strategy = field(default_factory=BlackboxStrategy)
    n_trials: int | None = None
    seed: int = 0
    study_prefix: str | None = None
    storage_url: str | None = None
    heartbeat_interval: int = 60
    grace_period: int | None = None
    _cache: dict[tuple[SpecConfig, Scenario], Measurement] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.n_trials is not None and self.n_trials < 1:
            raise UsageError(f"--trials must be >= 1, but got {self.n_trials}.")
        if self.heartbeat_interval < 1:
            raise UsageError(f"--heartbeat must be >= 1 second, but got {self.heartbeat_interval}.")
        if self.study_prefix is None:
            self.study_prefix = default_study_prefix(
                self.model, self.device, self.workload.name, self.objective.slug(), self.strategy.label
            ) + f"-{self.fingerprint()}"

    # ---- public helpers ------------------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """6 hex digits identifying the space and workload content (part of default study names, so a changed space
        or workload starts a new study instead of resuming an incompatible one)."""
        blob = json.dumps([self.space.to_dict(), self.workload.content_hash()], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:6]

    @property
    def target(self) -> int:
        """Trials per scenario: --trials (or the strategy's default), at most the number of configs in the space."""
        wanted = self.n_trials if self.n_trials is not None else self.strategy.default_trials(self.space)
        return min(wanted, len(self.space.grid()))

    def measure(
        self, config: SpecConfig, scenario: Scenario, on_progress: ProgressCallback | None = None
    ) -> Measurement:
        """Measure once per (config, scenario) within this process; predictions and measurements are reused."""
        key = (config, scenario)
        if key not in self._cache:
            if on_progress is not None:
                m = self.backend.measure(config, self.workload, scenario, on_progress=on_progress)  # type: ignore[call-arg]
            else:
                m = self.backend.measure(config, self.workload, scenario)
            self._cache[key] = m
        return self._cache[key]

    # ---- the loop ------------------------------------------------------------------------------------------------

    def run(self, scenarios: Sequence[Scenario], on_event: EventCallback | None = None) -> list[ScenarioResult]:
        return [self.run_scenario(s, on_event) for s in scenarios]

    def run_scenario(self, scenario: Scenario, on_event: EventCallback | None = None) -> ScenarioResult:
        """Run (or resume, or join) the study of `scenario` until it has `target` finished trials, then pick."""
        study_name = study_name_for(str(self.study_prefix), scenario)
        url = self.storage_url or self.store.url
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        setup_lock = _ClaimLock(url, "optuna-schema")
        try:
            with setup_lock:  # workers starting together on a fresh database would race to create Optuna's tables
                storage = open_storage(url, self.heartbeat_interval, self.grace_period)
        finally:
            setup_lock.close()
        lock = _ClaimLock(url, study_name)
        with warnings.catch_warnings():
            # fail_stale_trials, the retry callback and metric names are stable but flagged experimental; Optuna also
            # warns that heartbeats are meant for Study.optimize, but this loop beats itself (see _Heartbeat).
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            warnings.filterwarnings("ignore", message=".*independent sampl", category=UserWarning)
            try:
                return self._run_scenario(scenario, study_name, storage, lock, on_event)
            finally:
                lock.close()
                storage.engine.dispose()

    def _run_scenario(
        self,
        scenario: Scenario,
        study_name: str,
        storage: optuna.storages.RDBStorage,
        lock: _ClaimLock,
        on_event: EventCallback | None,
    ) -> ScenarioResult:
        with lock:
            study = self._open_study(storage, study_name, scenario)
            run = _Run(
                study=study,
                storage=storage,
                lock=lock,
                scenario=scenario,
                target=self.target,
                ctx=StrategyContext(self, study, scenario, self.target),
                rng=random.Random(f"{self.seed}:{study_name}"),
            )
            self._enqueue_initial(run)
            # Release trials of workers that died, so the start counts are right.
            optuna.storages.fail_stale_trials(study)
            self._fail_orphans(run, study.get_trials(deepcopy=False))
        self._emit(on_event, run, "start", study.get_trials(deepcopy=False))
        self._loop(run, on_event)
        self._sync_store(run)
        trials = study.get_trials(deepcopy=False)
        self._emit(on_event, run, "end", trials)
        return self._result(run, trials)

    def _open_study(self, storage: optuna.storages.RDBStorage, name: str, scenario: Scenario) -> optuna.Study:
        """Create or load the study (under the claim lock) and check it is the same search.

        Each opening of a study (a worker joining, or a resumed run) gets its own sampler seed, ``seed + openings``:
        the first run is reproducible, and two workers (or a resumed run) do not replay the same random proposals.
        """
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            pruner=self.strategy.pruner(self.objective),
            directions=self.objective.directions,
            load_if_exists=True,
        )
        meta = {
            "model": self.model,
            "device": self.device,
            "workload": self.workload.name,
            "workload_hash": self.workload.content_hash(),
            "objective": self.objective.to_dict(),
            "scenario": scenario.to_dict(),
            "backend": self.backend.name,
        }
        stored = study.user_attrs.get(ATTR)
        if stored is None:
            stored = {**meta, "space": self.space.to_dict(), "strategy": self.strategy.name, "openings": 0}
            study.set_metric_names(self.objective.value_names)
        else:
            differ = {k: (stored.get(k), v) for k, v in meta.items() if stored.get(k) != v}
            if differ:
                detail = "; ".join(f"{k}: study has {a!r}, this run {b!r}" for k, (a, b) in differ.items())
                raise UsageError(
                    f"Study {name!r} was created for another search ({detail}). Resume it with the same options, "
                    "or pass a new --study name."
                )
        openings = int(stored.get("openings", 0))
        study.set_user_attr(ATTR, {**stored, "openings": openings + 1})
        study.sampler = self.strategy.sampler(
            self.objective, self.seed + openings, deterministic=self.backend.name == "model"
        )
        return study

    def _enqueue_initial(self, run: _Run) -> None:
        """Enqueue the strategy's initial configs that the study does not hold yet (in any state)."""
        trials = run.study.get_trials(deepcopy=False)
        present = {c for c in (self._config_of(t) for t in trials) if c is not None}
        for config in self.strategy.initial_configs(run.ctx):
            if config not in present:
                run.study.enqueue_trial(self.space.params_of(config))
                present.add(config)

    def _config_of(self, t: FrozenTrial) -> SpecConfig | None:
        info = _info(t)
        if "config" in info:
            return SpecConfig.from_dict(info["config"])
        params = t.params or t.system_attrs.get("fixed_params") or {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return self.space.suggest(optuna.trial.FixedTrial(dict(params)))
        except (ValueError, KeyError, PeagleError):
            return None

    def _loop(self, run: _Run, on_event: EventCallback | None) -> None:
        if self.strategy.should_stop(run.ctx):  # e.g. a resumed model-guided study that had confirmed its best
            return
        while True:
            claim = self._claim(run)
            if claim is None:
                return
            try:
                if claim.duplicate_of is not None:
                    state = self._tell_duplicate(run, claim)
                    run.streak += 1
                    measurement = None
                else:
                    run.streak = 0
                    with _Heartbeat(run.storage, claim.trial._trial_id, self.heartbeat_interval):
                        state, measurement = self._evaluate(run, claim)
            except BaseException:
                self._abandon(run, claim)
                raise
            counts = dict(claim.counts)
            if state != "duplicate":
                counts[state] += 1
            self._emit_counts(on_event, run, "trial", claim.done + (state != "duplicate"), counts, state, claim.config)
            if measurement is not None:
                self.strategy.after_trial(run.ctx, claim.config, measurement)
            if self.strategy.should_stop(run.ctx):
                return

    def _claim(self, run: _Run) -> _Claim | None:
        """Under the claim lock: fail dead workers' trials, stop at the target, else ask for the next trial."""
        study = run.study
        with run.lock:
            optuna.storages.fail_stale_trials(study)
            trials = study.get_trials(deepcopy=False)
            if self._fail_orphans(run, trials):
                trials = study.get_trials(deepcopy=False)
            counted = [t for t in trials if _counted(t)]
            if len(counted) >= run.target:
                return None
            claimed: dict[SpecConfig, FrozenTrial] = {}
            for t in counted:
                config = self._config_of(t)
                if config is not None:
                    claimed.setdefault(config, t)
            if not any(t.state == TrialState.WAITING for t in trials):
                unclaimed = [c for c in self.space.grid() if c not in claimed]
                if not unclaimed:
                    return None  # every config of the space has been measured (or is being measured)
                if run.streak >= DUPLICATE_STREAK_LIMIT:
                    study.enqueue_trial(self.space.params_of(run.rng.choice(unclaimed)))
                    run.streak = 0
            trial = study.ask()
            config = self.space.suggest(trial)
            duplicate = claimed.get(config)
            info: dict[str, Any] = {"worker": _this_worker(), "config": config.to_dict()}
            if duplicate is not None:
                info["duplicate_of"] = duplicate.number
            trial.set_user_attr(ATTR, info)
            counts = self._counts(trials)
            done = sum(1 for t in counted if t.state.is_finished())
            return _Claim(trial, config, info, duplicate, done, counts)

    def _fail_orphans(self, run: _Run, trials: Sequence[FrozenTrial]) -> bool:
        """Fail (and re-queue) RUNNING trials whose worker is gone: a worker on this host whose process is dead, or
        (while we hold an exclusive claim lock) a trial claimed without our attributes, i.e. a worker that died
        inside its claim. Workers on other hosts are left to the heartbeat."""
        me = _this_worker()
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)
        failed = False
        for t in trials:
            if t.state != TrialState.RUNNING:
                continue
            worker = _info(t).get("worker")
            if worker is None:
                dead = run.lock.exclusive
            else:
                local = worker.get("host") == me["host"] and worker.get("boot") == me["boot"]
                dead = local and worker.get("pid") != me["pid"] and not _process_alive(int(worker.get("pid", 0)))
            if not dead:
                continue
            try:
                if run.storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    log.warning(
                        "Trial %s of study %s was left running by a worker that is gone; it is re-queued.",
                        t.number, run.study.study_name,
                    )
                    retry(run.study, run.storage.get_trial(t._trial_id))
                    failed = True
            except optuna.exceptions.UpdateFinishedTrialError:
                pass
        return failed

    def _abandon(self, run: _Run, claim: _Claim) -> None:
        """An interrupted measurement (Ctrl-C, a crash in our code): FAIL the trial and re-queue its config."""
        trial = claim.trial
        try:
            if run.storage.get_trial(trial._trial_id).state.is_finished():
                return
            trial.set_user_attr(ATTR, {**claim.info, "status": "interrupted"})
            run.study.tell(trial, state=TrialState.FAIL)
            if claim.duplicate_of is None:
                optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)(
                    run.study, run.storage.get_trial(trial._trial_id)
                )
        except Exception as exc:  # the heartbeat will catch it
            log.warning("could not release trial %s: %s", trial.number, exc)

    def _tell_duplicate(self, run: _Run, claim: _Claim) -> str:
        """A config already measured in this study: tell the sampler the earlier result instead of measuring again."""
        original = run.storage.get_trial(claim.duplicate_of._trial_id) if claim.duplicate_of is not None else None
        trial = claim.trial
        if original is not None and original.state == TrialState.COMPLETE and original.values is not None:
            for key, value in original.constraints.items():
                trial.set_constraint(key, value)
            run.study.tell(trial, original.values)
        elif original is not None and original.state == TrialState.PRUNED:
            run.study.tell(trial, state=TrialState.PRUNED)
        else:
            run.study.tell(trial, state=TrialState.FAIL)
        return "duplicate"

    def _evaluate(self, run: _Run, claim: _Claim) -> tuple[str, Measurement]:
        trial, config, scenario = claim.trial, claim.config, run.scenario
        pruned = False

        def on_progress(partial: Measurement) -> bool:
            nonlocal pruned
            value = self.objective.progress_value(partial)
            if value is None:
                return True
            trial.report(value, step=0)  # step 0: the end of the backend's warm-up
            if trial.should_prune():
                pruned = True
                return False
            return True

        use_progress = _accepts_progress(self.backend) and not self.objective.multi
        fresh = (config, scenario) not in self._cache
        m = self.measure(config, scenario, on_progress if use_progress else None)
        run.measurements += int(fresh)
        metrics = measurement_metrics(m)
        values: list[float] = []
        constraints: dict[str, float] = {}
        failure: str | None = None
        if pruned:
            status = "pruned"
        elif not m.ok:
            status, failure = "failed", f"{m.failure_kind}: {m.failure_reason}"
        else:
            try:
                values = self.objective.values(metrics)
                constraints = self.objective.constraints(metrics)
                status = "complete"
            except _TrialFailed as exc:
                status, failure = "failed", str(exc)
        if constraints:
            metrics["constraints"] = constraints
            metrics["feasible"] = all(v <= 0 for v in constraints.values())
        info = {**claim.info, "status": status, "metrics": metrics, "measurement": _slim(m),
                "provenance": m.provenance.to_dict()}
        if failure:
            info["failure"] = failure
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        trial.set_user_attr(ATTR, info)
        if status == "complete":
            run.study.tell(trial, values)
        else:
            run.study.tell(trial, state=TrialState.PRUNED if status == "pruned" else TrialState.FAIL)
        self._record(run, trial.number, config, status, values, metrics, m, failure)
        return status, m

    def _record(
        self,
        run: _Run,
        number: int,
        config: SpecConfig,
        status: str,
        values: Sequence[float],
        metrics: Mapping[str, Any],
        m: Measurement | None,
        failure: str | None,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            self.store.add_trial(
                study=run.study.study_name,
                number=number,
                model=self.model,
                config=config.to_dict(),
                scenario=run.scenario.to_dict(),
                values=dict(zip(self.objective.value_names, values, strict=False)),
                metrics=dict(metrics),
                status=status,
                failure_reason=failure,
                backend=m.provenance.backend if m is not None else str((provenance or {}).get("backend", "?")),
                provenance=m.provenance.to_dict() if m is not None else dict(provenance or {}),
            )
        except InvalidRecordError:
            pass  # another worker (or an earlier run) stored it already

    def _sync_store(self, run: _Run) -> None:
        """Store finished trials our trials table lacks (a worker killed between Optuna's commit and ours)."""
        stored = {t.number for t in self.store.list_trials(study=run.study.study_name)}
        for t in run.study.get_trials(deepcopy=False):
            info = _info(t)
            if t.number in stored or not _counted(t) or not t.state.is_finished() or "status" not in info:
                continue
            values = list(t.values or []) if t.state == TrialState.COMPLETE else []
            self._record(
                run, t.number, SpecConfig.from_dict(info["config"]), info["status"], values,
                info.get("metrics", {}), None, info.get("failure"), info.get("provenance"),
            )

    @staticmethod
    def _counts(trials: Sequence[FrozenTrial]) -> dict[str, int]:
        counts = {"complete": 0, "failed": 0, "pruned": 0, "running": 0}
        names = {TrialState.COMPLETE: "complete", TrialState.FAIL: "failed", TrialState.PRUNED: "pruned",
                 TrialState.RUNNING: "running"}
        for t in trials:
            if _counted(t):
                counts[names[t.state]] += 1
        return counts

    def _emit(self, on_event: EventCallback | None, run: _Run, kind: Literal["start", "trial", "end"],
              trials: Sequence[FrozenTrial]) -> None:
        counts = self._counts(trials)
        done = counts["complete"] + counts["failed"] + counts["pruned"]
        self._emit_counts(on_event, run, kind, done, counts, None, None)

    @staticmethod
    def _emit_counts(on_event: EventCallback | None, run: _Run, kind: Literal["start", "trial", "end"], done: int,
                     counts: Mapping[str, int], state: str | None, config: SpecConfig | None) -> None:
        if on_event is None:
            return
        on_event(SearchEvent(kind, run.study.study_name, run.target, done, counts["complete"], counts["failed"],
                             counts["pruned"], counts["running"], state, config))

    # ---- picking the recommendation ------------------------------------------------------------------------------

    def _result(self, run: _Run, trials: Sequence[FrozenTrial]) -> ScenarioResult:
        study, scenario = run.study, run.scenario
        counted = [t for t in trials if _counted(t)]
        complete = [t for t in counted if t.state == TrialState.COMPLETE]
        failed = [t for t in counted if t.state == TrialState.FAIL]
        pruned = [t for t in counted if t.state == TrialState.PRUNED]
        running = [t for t in counted if t.state == TrialState.RUNNING]
        if not complete:
            reasons = sorted({str(_info(t).get("failure", "unknown")) for t in failed})
            raise UsageError(
                f"No trial of study {study.study_name!r} completed ({len(failed)} failed, {len(pruned)} pruned, "
                f"{len(running)} running elsewhere): {'; '.join(reasons)[:500]}. Fix the cause above "
                f"(see `peagle-tune show --trials {study.study_name}`) and run again."
            )
        pareto: list[ParetoPoint] = []
        if self.objective.multi:
            front = self._front(study)
            pareto = [self._point(t) for t in front]
            chosen, feasible = self._pick_front(front, complete, scenario)
        else:
            chosen, feasible = self._pick_single(complete, scenario)
        config = self._config_of(chosen)
        assert config is not None
        best = self._measurement_of(run, chosen, config)
        base_config = SpecConfig(max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens)
        baseline = self._lookup_or_measure(run, complete, base_config)
        published = None
        choice = self.space.names.get(str(config.drafter)) if config.speculative else None
        if choice is not None and choice.recommended_k:
            published_config = config.with_(num_speculative_tokens=choice.recommended_k)
            published = self._lookup_or_measure(run, complete, published_config)
        hypo = self.space.hypothetical(config)
        result = ScenarioResult(
            scenario=scenario,
            study_name=study.study_name,
            objective=self.objective,
            strategy=self.strategy.name,
            best=best,
            baseline=baseline,
            published=published,
            n_trials=len(complete) + len(failed) + len(pruned),
            n_failed=len(failed),
            n_pruned=len(pruned),
            n_running=len(running),
            n_measurements=run.measurements,
            feasible=feasible,
            rule=self._rule(feasible),
            pareto=pareto,
            hypothetical=(
                f"{hypo.name} is HYPOTHETICAL ({hypo.note or 'an unreleased variant'}): no checkpoint exists, so vLLM "
                "cannot serve it" if hypo else None
            ),
            constraints=dict(chosen.constraints),
        )
        report = self.strategy.report(run.ctx)
        result.strategy_report = report
        result.profile_launches = int(report.get("profile_launches", 0))
        if feasible and config.speculative:
            result.schedule = self.schedule(config)
            result.class_policy = self.class_policy(config, scenario)
        return result

    def _rule(self, feasible: bool) -> str:
        slos = ", ".join(f"{SLO_METRICS[m]} <= {v:g} ms" for m, v in self.objective.slos.items())
        if not feasible:
            return (
                f"no config met {slos}; shown is the config closest to them (smallest total violation), which is NOT "
                "recommended"
            )
        meeting = f" among configs meeting {slos}" if slos else ""
        tie = "; ties within 0.1% go to the smallest K, then max_num_seqs closest to the concurrency"
        if self.objective.multi:
            return f"the Pareto front's highest-throughput point{meeting}{tie}"
        what = "lowest TPOT p50" if self.objective.name == "latency" else "highest output tokens/s"
        return f"{what}{meeting}{tie}"

    def _front(self, study: optuna.Study) -> list[FrozenTrial]:
        """study.best_trials (feasible-only when SLOs are set), one trial per config, by throughput."""
        seen: set[SpecConfig] = set()
        out: list[FrozenTrial] = []
        for t in sorted(study.best_trials, key=lambda t: (-float(t.values[0]), t.number)):
            config = self._config_of(t)
            if _info(t).get("duplicate_of") is not None or config is None or config in seen:
                continue
            seen.add(config)
            out.append(t)
        return out

    def _point(self, t: FrozenTrial) -> ParetoPoint:
        config = self._config_of(t)
        assert config is not None
        hypothetical = self.space.hypothetical(config) is not None
        return ParetoPoint(config, dict(_info(t).get("metrics", {})), t.number, hypothetical)

    def _tie_key(self, scenario: Scenario) -> Callable[[FrozenTrial], tuple[int, int, int]]:
        def key(t: FrozenTrial) -> tuple[int, int, int]:
            c = self._config_of(t)
            assert c is not None
            return (c.k, abs(c.max_num_seqs - scenario.concurrency), c.max_num_seqs)

        return key

    def _pick_single(self, complete: list[FrozenTrial], scenario: Scenario) -> tuple[FrozenTrial, bool]:
        """The best feasible trial; ties within 0.1% go to the smallest K, then max_num_seqs closest to the
        concurrency, which serve the same with less verification work and memory."""
        feasible = [t for t in complete if _feasible(t) and t.value is not None]
        if not feasible:
            return min(complete, key=lambda t: (_violation(t), t.number)), False
        sign = 1.0 if self.objective.directions[0] == "maximize" else -1.0
        top = max(sign * float(t.value) for t in feasible)  # type: ignore[arg-type]
        tied = [t for t in feasible if sign * float(t.value) >= top - abs(top) * 1e-3]  # type: ignore[arg-type]
        return min(tied, key=self._tie_key(scenario)), True

    def _pick_front(
        self, front: list[FrozenTrial], complete: list[FrozenTrial], scenario: Scenario
    ) -> tuple[FrozenTrial, bool]:
        if not front:  # constrained and nothing feasible
            return min(complete, key=lambda t: (_violation(t), t.number)), False
        top = max(float(t.values[0]) for t in front)
        tied = [t for t in front if float(t.values[0]) >= top - abs(top) * 1e-3]
        return min(tied, key=self._tie_key(scenario)), True

    def _measurement_of(self, run: _Run, t: FrozenTrial, config: SpecConfig) -> Measurement:
        data = _info(t).get("measurement")
        if data is not None:
            try:
                return Measurement.from_dict(data)
            except (TypeError, ValueError, KeyError, PeagleError):
                pass
        return self._measure_outside(run, config)

    def _lookup_or_measure(self, run: _Run, complete: list[FrozenTrial], config: SpecConfig) -> Measurement:
        for t in complete:
            if _info(t).get("duplicate_of") is None and self._config_of(t) == config:
                return self._measurement_of(run, t, config)
        return self._measure_outside(run, config)

    def _measure_outside(self, run: _Run, config: SpecConfig) -> Measurement:
        fresh = (config, run.scenario) not in self._cache
        m = self.measure(config, run.scenario)
        run.measurements += int(fresh)
        return m

    def goodput(self, config: SpecConfig, workload: Workload | None = None) -> Callable[[int, int], float]:
        """tokens/s of `config`'s drafter at batch b and depth k (k=0: no speculation), from the backend."""

        def value(b: int, k: int) -> float:
            c = config.with_(max_num_seqs=max(b, 1))
            c = c.with_(num_speculative_tokens=k) if k else SpecConfig(max_num_seqs=c.max_num_seqs)
            scenario = Scenario(concurrency=b)
            m = self.measure(c, scenario) if workload is None else self.backend.measure(c, workload, scenario)
            return float(m.output_tokens_per_s or 0.0) if m.ok else 0.0

        return value

    def schedule(self, config: SpecConfig) -> list[ScheduleEntry]:
        """Best K per batch-size range for the chosen drafter, up to its max_num_seqs (predicted with the model
        backend; with a real engine it needs a profile, so it is left empty)."""
        if self.backend.name != "model":
            return []
        sizes = default_batch_sizes(max(config.max_num_seqs, 1))
        ks = [0, *range(self.space.k_min, self.space.k_max + 1)]
        best = best_depth_per_batch(self.goodput(config), sizes, ks)
        return merge_schedule(best, config.max_num_seqs)

    def class_policy(self, config: SpecConfig, scenario: Scenario) -> dict[str, dict[str, int]]:
        """Per-class K cap: the best K for each workload class alone at this scenario (model backend only)."""
        if self.backend.name != "model" or len(self.workload.classes) < 1:
            return {}
        ks = [0, *range(self.space.k_min, self.space.k_max + 1)]
        out: dict[str, dict[str, int]] = {}
        for cls, reqs in sorted(self.workload.classes.items()):
            sub = Workload(f"{self.workload.name}:{cls}", {cls: reqs}, self.workload.source)
            best = best_depth_per_batch(self.goodput(config, sub), [scenario.concurrency], ks)
            out[cls] = {"max_k": best[scenario.concurrency]}
        return out

    def recommend(self, result: ScenarioResult, environment: Mapping[str, Any]) -> int | None:
        """Store `result` as a recommendation and return its id; None (nothing stored) when no config met the SLOs."""
        if not result.feasible:
            return None
        best = result.best
        metrics: dict[str, Any] = {
            **measurement_metrics(best),
            "speedup_vs_no_spec": result.speedup_over(result.baseline),
            "speedup_vs_published_k": result.speedup_over(result.published),
            "published_k": result.published.config.k if result.published else None,
            "objective": self.objective.to_dict(),
            "rule": result.rule,
            "strategy": result.strategy,
            "n_trials": result.n_trials,
            "n_failed": result.n_failed,
            "n_pruned": result.n_pruned,
        }
        if result.constraints:
            metrics["constraints"] = result.constraints
        if result.hypothetical:
            metrics["hypothetical_drafter"] = True
            metrics["hypothetical_note"] = result.hypothetical
        rid = self.store.add_recommendation(
            model=self.model,
            gpu=self.device,
            vllm_version=environment.get("vllm_version"),
            workload_name=self.workload.name,
            workload_hash=self.workload.content_hash(),
            objective=self.objective.name,
            scenario=result.scenario.to_dict(),
            best_config=best.config.to_dict(),
            metrics=metrics,
            provenance=best.provenance.to_dict(),
            pareto=[p.to_dict() for p in result.pareto],
            schedule=[dataclasses.asdict(e) for e in result.schedule],
            class_policy=result.class_policy,
            study=result.study_name,
        )
        result.recommendation_id = rid
        return rid

