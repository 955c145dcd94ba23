"""Search: an Optuna study per scenario over the space, trials measured (or predicted) by a backend.

The study lives in the project's database, so `--study NAME` resumes after a crash with no completed trial lost and
several workers can share it. Every trial is also written to our own trials table with its provenance.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna

from autotune.backends.base import Backend
from autotune.config import Measurement, Scenario, SpecConfig
from autotune.exceptions import UsageError
from autotune.schedule import ScheduleEntry, best_depth_per_batch, default_batch_sizes, merge_schedule
from autotune.space import SearchSpace
from autotune.workloads import Workload
from store import Store

log = logging.getLogger(__name__)

Objective = Literal["throughput", "latency"]
OBJECTIVES: tuple[str, ...] = ("throughput", "latency")
TrialCallback = Callable[[int, int, Measurement | None], None]


class _TrialFailed(Exception):
    """Raised inside an Optuna objective so the trial is marked FAIL with the backend's reason."""


@dataclass
class ScenarioResult:
    """The outcome of searching one scenario."""

    scenario: Scenario
    study_name: str
    best: Measurement
    baseline: Measurement | None
    """No speculation at the best config's max_num_seqs."""
    published: Measurement | None
    """The best config's drafter at its publisher's K."""
    n_trials: int
    n_failed: int
    schedule: list[ScheduleEntry] = field(default_factory=list)
    class_policy: dict[str, dict[str, int]] = field(default_factory=dict)
    recommendation_id: int | None = None

    def speedup_over(self, other: Measurement | None) -> float | None:
        if other is None or not other.ok or not other.output_tokens_per_s or not self.best.output_tokens_per_s:
            return None
        return self.best.output_tokens_per_s / other.output_tokens_per_s


def objective_value(objective: str, m: Measurement) -> float:
    """The number Optuna optimises: output tokens/s (maximise) or TPOT p50 in ms (minimise)."""
    value = m.output_tokens_per_s if objective == "throughput" else m.tpot_ms_p50
    if value is None or not math.isfinite(value):
        raise _TrialFailed(f"the backend returned no {objective} figure")
    return float(value)


def study_name_for(prefix: str, scenario: Scenario) -> str:
    return f"{prefix}-c{scenario.concurrency}"


def default_study_prefix(model: str, device: str, workload: str, objective: str) -> str:
    slug = lambda s: re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-").lower()  # noqa: E731
    return f"{slug(model.split('/')[-1])}-{slug(device)}-{slug(workload)}-{objective}"


@dataclass
class Search:
    """One search: a model on a device, a workload, a space, an objective, scenarios."""

    store: Store
    backend: Backend
    model: str
    device: str
    workload: Workload
    space: SearchSpace
    objective: str = "throughput"
    n_trials: int = 60
    seed: int = 0
    study_prefix: str | None = None
    _cache: dict[tuple[SpecConfig, Scenario], Measurement] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, but got {self.objective!r}.")
        if self.n_trials < 1:
            raise UsageError(f"--trials must be >= 1, but got {self.n_trials}.")
        if self.study_prefix is None:
            self.study_prefix = default_study_prefix(self.model, self.device, self.workload.name, self.objective)

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        return "maximize" if self.objective == "throughput" else "minimize"

    def measure(self, config: SpecConfig, scenario: Scenario) -> Measurement:
        """Measure once per (config, scenario) within this search; predictions and measurements are reused."""
        key = (config, scenario)
        if key not in self._cache:
            self._cache[key] = self.backend.measure(config, self.workload, scenario)
        return self._cache[key]

    def run_scenario(self, scenario: Scenario, on_trial: TrialCallback | None = None) -> ScenarioResult:
        study_name = study_name_for(str(self.study_prefix), scenario)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():
            # heartbeat (stale RUNNING trials of a killed worker become FAIL) and grouped multivariate TPE
            # (conditional space) are stable in practice but flagged experimental.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(self.store.url, heartbeat_interval=60, grace_period=120)
            sampler = optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=True)
        study = optuna.create_study(
            study_name=study_name, storage=storage, sampler=sampler, direction=self.direction, load_if_exists=True
        )
        done = [t for t in study.trials if t.state.is_finished()]
        remaining = max(self.n_trials - len(done), 0)
        if not done:
            grid = self.space.grid()
            # A grid no larger than the budget is searched exhaustively; otherwise the baselines go first
            # so every recommendation is compared against them on real trials.
            for config in grid if len(grid) <= self.n_trials else self.space.baselines():
                study.enqueue_trial(self.space.params_of(config), skip_if_exists=True)
            if len(grid) <= self.n_trials:
                remaining = len(grid)

        counter = {"n": len(done)}

        def objective(trial: optuna.trial.Trial) -> float:
            config = self.space.suggest(trial)
            m = self.measure(config, scenario)
            trial.set_user_attr("config", config.to_dict())
            trial.set_user_attr("provenance", m.provenance.to_dict())
            status = "complete" if m.ok else "failed"
            values: dict[str, float] = {}
            if m.ok:
                try:
                    values[self.objective] = objective_value(self.objective, m)
                except _TrialFailed as exc:
                    status, m.failure_reason = "failed", str(exc)
            self.store.add_trial(
                study=study_name,
                number=trial.number,
                model=self.model,
                config=config.to_dict(),
                scenario=scenario.to_dict(),
                values=values,
                metrics=_metrics(m),
                status=status,
                failure_reason=m.failure_reason,
                backend=m.provenance.backend,
                provenance=m.provenance.to_dict(),
            )
            counter["n"] += 1
            if on_trial:
                on_trial(counter["n"], len(done) + remaining, m)
            if status == "failed":
                trial.set_user_attr("failure", f"{m.failure_kind}: {m.failure_reason}")
                raise _TrialFailed(f"{config.label()}: {m.failure_kind}: {m.failure_reason}")
            return values[self.objective]

        if remaining:
            study.optimize(objective, n_trials=remaining, catch=(_TrialFailed,))

        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
        if not complete:
            reasons = sorted({str(t.user_attrs.get("failure", "unknown")) for t in failed})
            raise UsageError(
                f"Every trial of study {study_name!r} failed ({len(failed)} trials): {'; '.join(reasons)[:500]}. "
                "Fix the cause above (see `peagle-tune show --trials " + study_name + "`) and run again."
            )
        best_config = self._pick_best(complete, scenario)
        best = self.measure(best_config, scenario)
        baseline = self.measure(SpecConfig(max_num_seqs=best_config.max_num_seqs), scenario)
        published = self._published(best_config, scenario)
        result = ScenarioResult(
            scenario=scenario,
            study_name=study_name,
            best=best,
            baseline=baseline,
            published=published,
            n_trials=len(study.trials),
            n_failed=len(failed),
        )
        if best_config.speculative:
            result.schedule = self.schedule(best_config)
            result.class_policy = self.class_policy(best_config, scenario)
        return result

    def _pick_best(self, complete: list[optuna.trial.FrozenTrial], scenario: Scenario) -> SpecConfig:
        """The best trial; among ties (within 0.1%) the smallest K, then max_num_seqs closest to the concurrency,
        which serve the same with less verification work and memory."""
        sign = 1.0 if self.direction == "maximize" else -1.0
        top = max(sign * float(t.value) for t in complete if t.value is not None)
        tied = [
            SpecConfig.from_dict(t.user_attrs["config"])
            for t in complete
            if t.value is not None and sign * float(t.value) >= top - abs(top) * 1e-3
        ]
        return min(tied, key=lambda c: (c.k, abs(c.max_num_seqs - scenario.concurrency), c.max_num_seqs))

    def _published(self, best: SpecConfig, scenario: Scenario) -> Measurement | None:
        if not best.speculative or best.drafter not in self.space.names:
            return None
        d = self.space.names[best.drafter]
        if not d.recommended_k:
            return None
        return self.measure(best.with_(num_speculative_tokens=d.recommended_k), scenario)

    def goodput(self, config: SpecConfig, workload: Workload | None = None) -> Callable[[int, int], float]:
        """tokens/s of `config`'s drafter at batch b and depth k (k=0: no speculation), from the backend."""

        def value(b: int, k: int) -> float:
            c = config.with_(max_num_seqs=max(b, 1))
            c = c.with_(num_speculative_tokens=k) if k else SpecConfig(max_num_seqs=c.max_num_seqs)
            scenario = Scenario(concurrency=b)
            m = (
                self.measure(c, scenario)
                if workload is None
                else self.backend.measure(c, workload, scenario)
            )
            return float(m.output_tokens_per_s or 0.0) if m.ok else 0.0

        return value

    def schedule(self, config: SpecConfig) -> list[ScheduleEntry]:
        """Best K per batch-size range for the chosen drafter, up to its max_num_seqs (cheap with the model
        backend; with a real engine it needs a profile, so it is left empty)."""
        if self.backend.name != "model":
            return []
        sizes = default_batch_sizes(max(config.max_num_seqs, 1))
        ks = [0, *range(self.space.k_min, self.space.k_max + 1)]
        best = best_depth_per_batch(self.goodput(config), sizes, ks)
        return merge_schedule(best, config.max_num_seqs)

    def class_policy(self, config: SpecConfig, scenario: Scenario) -> dict[str, dict[str, int]]:
        """Per-class K cap: the best K for each workload class alone at this scenario."""
        if self.backend.name != "model" or len(self.workload.classes) < 1:
            return {}
        ks = [0, *range(self.space.k_min, self.space.k_max + 1)]
        out: dict[str, dict[str, int]] = {}
        for cls, reqs in sorted(self.workload.classes.items()):
            sub = Workload(f"{self.workload.name}:{cls}", {cls: reqs}, self.workload.source)
            best = best_depth_per_batch(self.goodput(config, sub), [scenario.concurrency], ks)
            out[cls] = {"max_k": best[scenario.concurrency]}
        return out

    def recommend(self, result: ScenarioResult, environment: dict[str, Any]) -> int:
        """Store the result as a recommendation; returns its id."""
        best = result.best
        rid = self.store.add_recommendation(
            model=self.model,
            gpu=self.device,
            vllm_version=environment.get("vllm_version"),
            workload_name=self.workload.name,
            workload_hash=self.workload.content_hash(),
            objective=self.objective,
            scenario=result.scenario.to_dict(),
            best_config=best.config.to_dict(),
            metrics={
                **_metrics(best),
                "speedup_vs_no_spec": result.speedup_over(result.baseline),
                "speedup_vs_published_k": result.speedup_over(result.published),
                "published_k": result.published.config.k if result.published else None,
                "n_trials": result.n_trials,
                "n_failed": result.n_failed,
            },
            provenance=best.provenance.to_dict(),
            pareto=[],
            schedule=[e.__dict__ for e in result.schedule],
            class_policy=result.class_policy,
            study=result.study_name,
        )
        result.recommendation_id = rid
        return rid

    def run(self, scenarios: Sequence[Scenario], on_trial: TrialCallback | None = None) -> list[ScenarioResult]:
        return [self.run_scenario(s, on_trial) for s in scenarios]


def _metrics(m: Measurement) -> dict[str, Any]:
    out: dict[str, Any] = {
        "output_tokens_per_s": m.output_tokens_per_s,
        "tpot_ms_p50": m.tpot_ms_p50,
        "tpot_ms_p99": m.tpot_ms_p99,
        "ttft_ms_p50": m.ttft_ms_p50,
        "ttft_ms_p99": m.ttft_ms_p99,
    }
    if m.spec is not None:
        out["acceptance_length"] = m.spec.mean_acceptance_length
    if "acceptance_length" in m.extra:
        out["acceptance_length"] = m.extra["acceptance_length"]
    return out
