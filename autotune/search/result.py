"""What a scenario's search returns, and the rules that pick its recommendation from the finished trials.

Picking: the best feasible trial (highest tokens/s, or lowest TPOT p50 for latency; the Pareto front's
highest-throughput point for pareto); ties within 0.1% (for predicted figures: within the prediction's spread,
`tie_margin`, so a predicted win inside the model's noise goes to the simpler config) go to a max_num_seqs no larger
than the concurrency (more sequences than clients only pays when it beats every such config by more than the
margin), then the smallest K, then max_num_seqs closest to the concurrency, which serve the same with less
verification work and memory. A pick above
the concurrency is also compared with the same config at the concurrency (measured if no trial tried it), which it
must beat by more than 0.1%. When no trial meets the SLOs the one closest to them (smallest total violation) is
shown and marked infeasible: it is never recommended.

Hypothetical drafters (unreleased layer variants, predicted only) take part in the search so the comparison can
answer "would a 2-layer head be faster?", but a recommendation is something vLLM can load: it is picked among
released drafters whenever one of them meets the SLOs, and falls to a hypothetical one only when none does (or
the space holds nothing else). `ScenarioResult.per_drafter` keeps every variant's best config either way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import UsageError
from autotune.measurement import Measurement
from autotune.safe_text import shell_word
from autotune.search.compare import (
    TIE,
    DrafterBest,
    TrialOutcome,
    per_drafter,
    pick_tied,
    tie_key,
    tie_margin,
    tie_note,
)
from autotune.search.objective import MissingFigureError, Objective, measurement_metrics, speedup_range
from autotune.search.schedule import ScheduleEntry
from autotune.search.space import SearchSpace
from autotune.search.trials import counted, feasible, trial_config, trial_info, trial_measurement, violation
from autotune.spec import Scenario, SpecConfig

ConfigOf = Callable[[FrozenTrial], "SpecConfig | None"]
Measure = Callable[[SpecConfig], Measurement]


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
    """Pruned trials: 0 unless the study holds trials an older peagle-tune pruned (searches no longer prune: no
    shipped backend reported a partial result). Kept in every output so their formats stay as they were."""
    n_running: int = 0
    """Trials other workers were still measuring when this worker finished."""
    n_excluded: int = 0
    """Finished trials whose figures are not finite (NaN or infinite): left out of picking and of the comparisons
    (counted among complete or failed as they finished; `rule` says how many)."""
    n_measurements: int = 0
    """backend.measure calls made by this worker for the study and comparisons (engine launches with vLLM)."""
    profile_launches: int = 0
    """Engine launches the strategy spent outside the trials for this scenario (model-guided: profiling; a profile
    shared by several scenarios is counted for the first)."""
    launches: int | None = None
    """Engine launches this worker's measurements of the scenario made, from a backend that counts them (in-launch
    measurement: a drafter's launch serves every config and scenario, counted for the first); None: one launch per
    measurement (`n_measurements`)."""
    confirmation: dict[str, Any] | None = None
    """The fresh launch that confirmed an in-launch best config: its figure beside the in-launch one, and what was
    recommended (`Search` fills it; None: no confirmation was needed)."""
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
    per_drafter: list[DrafterBest] = field(default_factory=list)
    """The best config of every drafter variant searched (drafter, layers, parallel drafting, hypothetical), fastest
    first, with speedups over no speculation and over the best plain EAGLE-3 head (`autotune.search.compare`)."""
    launch_k: int | None = None
    """The K of the fastest trial of the recommended config's drafter and drafting mode at its max_num_seqs, no
    ties (`fastest_k`): where a GPU replays FULL CUDA graphs only at the launch's K and the adaptive controller goes
    below it, never above, `peagle-tune serve` launches there and falls back to the recommended K. None: no
    speculation, or not feasible."""
    tie: str | None = None
    """When several K tie with the recommendation (within the tie margin): which, and why its K was chosen
    (`autotune.search.compare.tie_note`); None when one K stands out."""
    stored_before: bool = False
    """The recommendation was already stored by an earlier run of the same study with the same result, so this run
    reported that one (`recommendation_id`) instead of storing a duplicate."""

    @property
    def n_complete(self) -> int:
        return self.n_trials - self.n_failed - self.n_pruned

    @property
    def engine_launches(self) -> int:
        """Engine launches this worker used for the scenario: its measurements plus the strategy's profiling (with
        the vllm backend every measurement is one launch; with the model backend nothing is launched)."""
        return (self.n_measurements if self.launches is None else self.launches) + self.profile_launches

    def speedup_over(self, other: Measurement | None) -> float | None:
        """Best tokens/s over `other`'s; None when either is missing, zero or not finite (NaN/inf)."""
        if other is None or not other.ok or not _positive(other.output_tokens_per_s) \
                or not _positive(self.best.output_tokens_per_s):
            return None
        return self.best.output_tokens_per_s / other.output_tokens_per_s  # type: ignore[operator]

    def recommendation_metrics(self) -> dict[str, Any]:
        """The metrics a stored recommendation keeps: the best's figures, speedups, the rule and trial counts."""
        metrics: dict[str, Any] = {
            **measurement_metrics(self.best),
            "speedup_vs_no_spec": self.speedup_over(self.baseline),
            "speedup_vs_published_k": self.speedup_over(self.published),
            "published_k": self.published.config.k if self.published else None,
            "objective": self.objective.to_dict(),
            "rule": self.rule,
            "strategy": self.strategy,
            "n_trials": self.n_trials,
            "n_failed": self.n_failed,
            "n_pruned": self.n_pruned,
            "n_excluded": self.n_excluded,
        }
        speedup = metrics["speedup_vs_no_spec"]
        if "speedup_range" in metrics:  # around the speedup over the baseline trial, the one shown
            sigma = float(metrics["prediction_log_sigma"])
            metrics["speedup_range"] = None if speedup is None else speedup_range(speedup, sigma)
        if self.constraints:
            metrics["constraints"] = self.constraints
        if self.hypothetical:
            metrics["hypothetical_drafter"] = True
            metrics["hypothetical_note"] = self.hypothetical
        if self.tie:
            metrics["tie_note"] = self.tie
        if self.launch_k is not None:
            metrics["launch_k"] = self.launch_k
        if self.per_drafter:
            metrics["per_drafter"] = [r.to_dict() for r in self.per_drafter]
        if self.confirmation is not None:
            metrics["confirmation"] = self.confirmation
        return metrics

    @property
    def faster_hypothetical(self) -> DrafterBest | None:
        """A hypothetical variant predicted faster than the recommended config (which had to be a released drafter),
        or None: faster by more than the figures' spread (`tie_margin`; within it they tie). Shown as a what-if: no
        checkpoint exists to serve it."""
        if self.hypothetical or not self.feasible or not self.best.output_tokens_per_s:
            return None
        sigma = (self.best.extra or {}).get("prediction_log_sigma")
        margin = tie_margin(float(sigma) if isinstance(sigma, int | float) and math.isfinite(sigma) else 0.0)
        bar = self.best.output_tokens_per_s / (1 - margin)  # the best ties with anything below: best >= h x (1 - m)
        faster = [r for r in self.per_drafter if r.hypothetical and r.output_tokens_per_s > bar]
        return faster[0] if faster else None


def rule(objective: Objective, feasible: bool, margin: float = TIE) -> str:
    """How the recommendation was picked, in words (shown with every result); ``margin``: the tie margin the pick
    used (`tie_margin`: wider than 0.1% for predicted figures)."""
    slos = objective.describe_slos()
    if not feasible:
        return (
            f"no config met {slos}; shown is the config closest to them (smallest total violation), which is NOT "
            "recommended"
        )
    meeting = f" among configs meeting {slos}" if slos else ""
    within = f"{margin:.1%}" + (" (the prediction's spread)" if margin > TIE else "")
    tie = (f"; ties within {within} go to max_num_seqs <= the concurrency, then the smallest K, then max_num_seqs "
           "closest to the concurrency")
    if objective.multi:
        return f"the Pareto front's highest-throughput point{meeting}{tie}"
    what = "lowest TPOT p50" if objective.name == "latency" else "highest output tokens/s"
    return f"{what}{meeting}{tie}"


def pareto_front(study: optuna.Study, config_of: ConfigOf, concurrency: int | None = None) -> list[FrozenTrial]:
    """study.best_trials (feasible-only when SLOs are set), one trial per point (identical figures: the config
    `tie_key` at `concurrency` puts first), by throughput."""
    seen: dict[tuple[float, ...], FrozenTrial] = {}
    for t in sorted(study.best_trials, key=lambda t: (-float(t.values[0]), t.number)):
        config = config_of(t)
        if trial_info(t).get("duplicate_of") is not None or config is None:
            continue
        # One point per position: configs with identical figures (max_num_seqs 64 and 128 at concurrency 64, or
        # the same config tried twice) are one point, the config the tie order puts first (`tie_key`).
        values = tuple(float(v) for v in t.values)
        kept = seen.get(values)
        if kept is None or tie_key(config, concurrency) < tie_key(config_of(kept) or config, concurrency):
            seen[values] = t
    return list(seen.values())


def pick(
    objective: Objective,
    complete: Sequence[FrozenTrial],
    front: Sequence[FrozenTrial],
    scenario: Scenario,
    config_of: ConfigOf,
) -> tuple[FrozenTrial, bool]:
    """The trial to recommend among `complete` (the Pareto `front` for pareto), and whether it meets the SLOs."""
    if objective.multi:
        if not front:  # constrained and nothing feasible
            return _closest(complete), False
        near, _margin = front_top_ties(objective, complete, front)
        return min(near, key=lambda t: (*_tie_key(scenario, config_of)(t), -float(t.values[0]))), True
    meeting = [t for t in complete if feasible(t) and t.value is not None]
    if not meeting:
        return _closest(complete), False
    sign = 1.0 if objective.directions[0] == "maximize" else -1.0
    best = max(meeting, key=lambda t: sign * float(t.value))  # type: ignore[arg-type]
    # Configs the tie key cannot tell apart (another drafter at the same K and max_num_seqs): the better figure.
    return pick_tied(meeting, lambda t: sign * float(t.value),  # type: ignore[arg-type]
                     tie_margin(prediction_log_sigma(best)), _tie_key(scenario, config_of))[0], True


def front_top_ties(
    objective: Objective, complete: Sequence[FrozenTrial], front: Sequence[FrozenTrial]
) -> tuple[list[FrozenTrial], float]:
    """The trials that tie with the Pareto front's highest-throughput point: feasible ones no worse than it by
    more than the tie margin (`tie_margin` of its predicted spread) on any objective, and that margin. The pick
    among them follows `tie_key`, as for one objective: a front point that wins inside the noise of the
    prediction does not outrank a smaller K."""
    top = max(front, key=lambda t: float(t.values[0]))
    margin = tie_margin(prediction_log_sigma(top))
    signs = [1.0 if d == "maximize" else -1.0 for d in objective.directions]

    def near(t: FrozenTrial) -> bool:
        return t.values is not None and all(
            s * float(v) >= s * float(b) - abs(float(b)) * margin for s, v, b in zip(signs, t.values, top.values,
                                                                                    strict=True))

    return [top, *(t for t in complete if t is not top and feasible(t) and near(t))], margin


def prediction_log_sigma(t: FrozenTrial) -> float:
    """The spread (one sigma, log scale) of a PREDICTED trial's figures (`ModelBackend`: the calibration's
    residuals); 0 for a measured trial or one that says nothing."""
    m = trial_measurement(t)
    value = (m.extra or {}).get("prediction_log_sigma") if m is not None else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0


def pick_released(
    objective: Objective,
    complete: Sequence[FrozenTrial],
    front: Sequence[FrozenTrial],
    scenario: Scenario,
    space: SearchSpace,
    config_of: ConfigOf,
) -> tuple[FrozenTrial, bool]:
    """`pick`, preferring released drafters: when the space mixes released and hypothetical drafters, the best trial
    whose drafter has a checkpoint (or that does not speculate) if one meets the SLOs; otherwise `pick` over every
    trial (a hypothetical drafter then comes labelled)."""

    def released(t: FrozenTrial) -> bool:
        config = config_of(t)
        return config is not None and space.hypothetical(config) is None

    def released_drafter(t: FrozenTrial) -> bool:
        config = config_of(t)
        return config is not None and config.speculative and space.hypothetical(config) is None

    pool = [t for t in complete if released(t)]
    # Only a choice between drafters: a space of hypothetical drafters alone is searched for them, not for no-spec.
    if len(pool) < len(complete) and any(released_drafter(t) for t in pool):
        pool_front = [t for t in front if released(t)]
        if objective.multi and not pool_front:
            pool_front = _nondominated([t for t in pool if feasible(t) and t.values is not None], objective)
        chosen, ok = pick(objective, pool, pool_front, scenario, config_of)
        if ok:
            return chosen, ok
    return pick(objective, complete, front, scenario, config_of)


def _nondominated(trials: Sequence[FrozenTrial], objective: Objective) -> list[FrozenTrial]:
    """The trials no other trial beats on every objective value (the Pareto front of `trials`)."""
    signs = [1.0 if d == "maximize" else -1.0 for d in objective.directions]

    def vec(t: FrozenTrial) -> list[float]:
        return [s * float(v) for s, v in zip(signs, t.values, strict=False)]

    out = []
    for t in trials:
        mine = vec(t)
        if not any(
            all(a >= b for a, b in zip(vec(u), mine, strict=True)) and vec(u) != mine for u in trials if u is not t
        ):
            out.append(t)
    return out


def drafter_comparison(
    objective: Objective, complete: Sequence[FrozenTrial], space: SearchSpace, config_of: ConfigOf,
    concurrency: int | None = None,
) -> list[DrafterBest]:
    """Every drafter variant's best config among `complete` (`autotune.search.compare.per_drafter`), ranked by the
    objective: lowest TPOT p50 for latency, else highest tokens/s; trials meeting the SLOs first."""
    outcomes = []
    for t in complete:
        info = trial_info(t)
        config = config_of(t)
        if info.get("duplicate_of") is not None or config is None:
            continue
        outcomes.append(
            TrialOutcome.from_metrics(
                config, info.get("metrics") or {}, hypothetical=space.hypothetical(config) is not None,
                feasible=feasible(t), log_sigma=prediction_log_sigma(t),
            )
        )
    if objective.name == "latency":
        return per_drafter(outcomes, score=lambda o: -(o.tpot_ms if o.tpot_ms is not None else float("inf")),
                           concurrency=concurrency)
    return per_drafter(outcomes, concurrency=concurrency)


def _closest(complete: Sequence[FrozenTrial]) -> FrozenTrial:
    return min(complete, key=lambda t: (violation(t), t.number))


def _tie_key(scenario: Scenario, config_of: ConfigOf) -> Callable[[FrozenTrial], tuple[bool, int, int, int]]:
    """Among tied trials: `autotune.search.compare.tie_key` of their configs at the scenario's concurrency."""

    def key(t: FrozenTrial) -> tuple[bool, int, int, int]:
        c = config_of(t)
        assert c is not None
        return tie_key(c, scenario.concurrency)

    return key


def summarize(
    study: optuna.Study,
    trials: Sequence[FrozenTrial],
    scenario: Scenario,
    objective: Objective,
    space: SearchSpace,
    strategy: str,
    measure: Measure,
) -> ScenarioResult:
    """The result of a finished study: the picked trial's measurement, compared with no speculation (at its
    max_num_seqs) and with its drafter at the publisher's K, taken from the study's trials where it measured them,
    else from `measure` (which may launch an engine). Raises UsageError when no trial completed."""

    def config_of(t: FrozenTrial) -> SpecConfig | None:
        return trial_config(space, t)

    def lookup(config: SpecConfig) -> Measurement | None:
        """The measurement of `config` (the study's, else `measure`'s), or None when its figures are not finite."""
        for t in complete:
            if trial_info(t).get("duplicate_of") is None and config_of(t) == config:
                return _finite(trial_measurement(t) or measure(config))
        return _finite(measure(config))

    mine = [t for t in trials if counted(t)]
    finished, failed, pruned, running = (
        [t for t in mine if t.state == state]
        for state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED, TrialState.RUNNING)
    )
    # A NaN or infinite figure would win (or poison) every comparison: such trials take no part in picking.
    excluded = [t for t in (*finished, *failed) if not finite_trial(t)]
    complete = [t for t in finished if finite_trial(t)]
    if finished and not complete:
        raise UsageError(
            f"No trial of study {study.study_name!r} completed with finite figures: all {len(finished)} complete "
            f"trials have NaN or infinite figures (see `peagle-tune show --trials {shell_word(study.study_name)}`). "
            "Check the backend's measurements and run again."
        )
    if not complete:
        reasons = sorted({str(trial_info(t).get("failure", "unknown")) for t in failed})
        raise UsageError(
            f"No trial of study {study.study_name!r} completed ({len(failed)} failed, {len(pruned)} pruned, "
            f"{len(running)} running elsewhere): {'; '.join(reasons)[:500]}. Fix the cause above "
            f"(see `peagle-tune show --trials {shell_word(study.study_name)}`) and run again."
        )
    front = [t for t in pareto_front(study, config_of, scenario.concurrency) if finite_trial(t)] \
        if objective.multi else []
    chosen, ok = pick_released(objective, complete, front, scenario, space, config_of)
    config = config_of(chosen)
    assert config is not None
    best = trial_measurement(chosen) or measure(config)  # the chosen trial's figures are finite
    constraints = dict(chosen.constraints)
    per_variant = drafter_comparison(objective, complete, space, config_of, scenario.concurrency)
    twin = _within_concurrency(config, scenario, space)
    if ok and twin is not None:  # the sampler may never have tried the same config at the concurrency
        candidate = lookup(twin)
        if candidate is not None and _no_worse(objective, candidate, best):
            per_variant = [_moved(row, twin, candidate) if row.best_config == config else row for row in per_variant]
            best, config = candidate, twin
            constraints = objective.constraints(measurement_metrics(candidate))
    if ok:  # the recommended variant's row shows the recommended config (a Pareto pick may be slower than its best)
        per_variant = [_moved(row, config, best) if _variant_of(row.best_config) == _variant_of(config)
                       and row.best_config != config else row for row in per_variant]
    points = [_point(space, t) for t in front]
    if ok and objective.multi and points and all(p.config != config for p in points):
        # The pick ties with the front's top point (`front_top_ties`) or moved within the concurrency: it stands on
        # the front in the place of the point it ties with.
        at = next((i for i, p in enumerate(points) if p.trial == chosen.number),
                  max(range(len(points)), key=lambda i: float(points[i].metrics.get("output_tokens_per_s") or 0)))
        points[at] = dataclasses.replace(points[at], config=config, metrics=measurement_metrics(best),
                                         trial=chosen.number)
    seqs, mnbt = config.max_num_seqs, config.max_num_batched_tokens
    baseline = lookup(space.no_spec(seqs, mnbt))
    choice = space.names.get(str(config.drafter)) if config.speculative else None
    published = lookup(config.with_(num_speculative_tokens=choice.recommended_k)) if choice and choice.recommended_k \
        else None
    hypo = space.hypothetical(config)
    return ScenarioResult(
        scenario=scenario,
        study_name=study.study_name,
        objective=objective,
        strategy=strategy,
        best=best,
        baseline=baseline,
        published=published,
        n_trials=len(finished) + len(failed) + len(pruned),
        n_failed=len(failed),
        n_pruned=len(pruned),
        n_running=len(running),
        n_excluded=len(excluded),
        feasible=ok,
        rule=rule(objective, ok, tie_margin(prediction_log_sigma(chosen))) + (
            f"; {len(excluded)} trial{'s' if len(excluded) != 1 else ''} with NaN or infinite figures left out"
            if excluded else ""
        ),
        pareto=points,
        hypothetical=(
            f"{hypo.name} is HYPOTHETICAL ({hypo.note or 'an unreleased variant'}): no checkpoint exists, so vLLM "
            "cannot serve it" if hypo else None
        ),
        constraints=constraints,
        per_drafter=per_variant,
        tie=_tie(objective, complete, front, chosen, config, space, config_of) if ok else None,
        launch_k=fastest_k(complete, config, config_of) if ok and config.speculative else None,
    )


def fastest_k(complete: Sequence[FrozenTrial], config: SpecConfig, config_of: ConfigOf) -> int:
    """The K of the highest-throughput finished trial whose config is `config` but for K (same drafter, drafting
    mode, max_num_seqs, ...): the adaptive engine's launch K (`ScenarioResult.launch_k`); `config`'s own K when no
    such trial has a figure."""
    best_k, best = config.k, -math.inf
    for t in complete:
        c = config_of(t)
        if c is None or not c.speculative or c.with_(num_speculative_tokens=config.k) != config:
            continue
        m = trial_measurement(t)
        value = m.output_tokens_per_s if m is not None and m.ok else None
        if value is not None and math.isfinite(value) and value > best:
            best_k, best = c.k, value
    return best_k


def _tie(
    objective: Objective,
    complete: Sequence[FrozenTrial],
    front: Sequence[FrozenTrial],
    chosen: FrozenTrial,
    config: SpecConfig,
    space: SearchSpace,
    config_of: ConfigOf,
) -> str | None:
    """`tie_note` of the pick: the K of every config that tied with the best in the pool `pick` chose from (the
    Pareto front for pareto; released drafters when the pick is one), within the same margin."""
    chosen_config = config_of(chosen)
    released = chosen_config is not None and space.hypothetical(chosen_config) is None

    def in_pool(t: FrozenTrial) -> bool:
        c = config_of(t)
        return c is not None and c.speculative and (not released or space.hypothetical(c) is None)

    sign = 1.0 if objective.directions[0] == "maximize" else -1.0

    def score(t: FrozenTrial) -> float:
        return sign * float(t.values[0])

    if objective.multi:
        front_pool = [t for t in front if in_pool(t)]
        if not front_pool or not config.speculative:
            return None
        tied, margin = front_top_ties(objective, [t for t in complete if in_pool(t)], front_pool)
    else:
        pool = [t for t in complete if feasible(t) and t.value is not None and in_pool(t)]
        if not pool or not config.speculative:
            return None
        margin = tie_margin(prediction_log_sigma(max(pool, key=score)))
        tied = pick_tied(pool, score, margin, lambda t: 0)[1]
    return tie_note([c.k for t in tied if (c := config_of(t)) is not None], config.k, margin)


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _non_finite(value: Any) -> bool:
    """Does `value` (a number, or a dict/list of them) hold a NaN or infinite float?"""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    return False


def finite_trial(t: FrozenTrial) -> bool:
    """Are `t`'s objective values and measured figures all finite? (An infinite constraint value is a missing
    figure's SLO violation, not a measured number: it only makes the trial infeasible.)"""
    metrics = {k: v for k, v in (trial_info(t).get("metrics") or {}).items() if k != "constraints"}
    constraints = [v for v in t.constraints.values() if math.isnan(v)]
    return not (_non_finite(list(t.values or [])) or _non_finite(metrics) or constraints)


def _finite(m: Measurement | None) -> Measurement | None:
    """`m`, or None when any of its figures is NaN or infinite (it cannot be compared with)."""
    if m is None:
        return None
    figures = (m.output_tokens_per_s, m.tpot_ms_p50, m.tpot_ms_p99, m.ttft_ms_p50, m.ttft_ms_p99, m.speedup_vs_no_spec)
    return None if _non_finite([f for f in figures if f is not None]) else m


def _variant_of(c: SpecConfig) -> tuple[Any, ...]:
    return (c.drafter, c.drafter_layers, c.parallel_drafting)


def _moved(row: DrafterBest, config: SpecConfig, m: Measurement) -> DrafterBest:
    """A variant's best `row` at `config` (the same config within the concurrency), with `m`'s figures."""
    tps = m.output_tokens_per_s
    if not tps or not row.output_tokens_per_s:
        return dataclasses.replace(row, best_config=config)
    ratio = tps / row.output_tokens_per_s
    return dataclasses.replace(
        row, best_config=config, output_tokens_per_s=tps,
        speedup_vs_no_spec=None if row.speedup_vs_no_spec is None else row.speedup_vs_no_spec * ratio,
        speedup_vs_eagle3=None if row.speedup_vs_eagle3 is None or row.is_eagle3_reference
        else row.speedup_vs_eagle3 * ratio,
    )


def _within_concurrency(config: SpecConfig, scenario: Scenario, space: SearchSpace) -> SpecConfig | None:
    """`config` at the largest max_num_seqs of the space within the concurrency, when `config` runs more sequences
    than the concurrency ever puts in flight; None otherwise (or when the space has no such max_num_seqs)."""
    if config.max_num_seqs <= scenario.concurrency:
        return None
    fits = [s for s in space.max_num_seqs if s <= scenario.concurrency]
    return config.with_(max_num_seqs=max(fits)) if fits else None


def _no_worse(objective: Objective, candidate: Measurement, best: Measurement) -> bool:
    """Does `candidate` meet the SLOs and come within the tie margin of `best` on every objective value?"""
    if not candidate.ok:
        return False
    ours, theirs = measurement_metrics(candidate), measurement_metrics(best)
    if not objective.feasible(ours):
        return False
    try:
        mine, top = objective.values(ours), objective.values(theirs)
    except MissingFigureError:
        return False
    signs = [1.0 if d == "maximize" else -1.0 for d in objective.directions]
    return all(s * a >= s * b - abs(b) * TIE for s, a, b in zip(signs, mine, top, strict=True))


def _point(space: SearchSpace, t: FrozenTrial) -> ParetoPoint:
    config = trial_config(space, t)
    assert config is not None
    return ParetoPoint(config, dict(trial_info(t).get("metrics", {})), t.number, space.hypothetical(config) is not None)
