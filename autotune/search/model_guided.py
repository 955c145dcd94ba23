"""Model-guided search: predict every config from measured profiles, verify the best predictions with real trials,
recalibrate after each, and stop once the best measured config is confirmed within the measurement noise."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.errors import PeagleError, UsageError
from autotune.measurement import Measurement
from autotune.search.calibration import calibration_scales
from autotune.search.objective import Objective, measurement_metrics
from autotune.search.profiles import DrafterProfile
from autotune.search.space import DrafterChoice, SearchSpace
from autotune.search.strategies import BlackboxStrategy
from autotune.search.strategy import Strategy, StrategyContext
from autotune.search.trials import counted, trial_measurement
from autotune.spec import SpecConfig

#: Relative measurement noise of tokens/s assumed when confirming the best (3%: repeated launches of the same config
#: on the 2-core CPU box of the benchmark differ by 1-3%; GPUs are steadier). Override with ``noise=``.
DEFAULT_NOISE = 0.03
#: Relative error assumed for a calibrated prediction until two speculative configs have been measured.
DEFAULT_PREDICTION_ERROR = 0.10


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

    1. Profiles: ``ctx.profile(drafter)`` for each real drafter: the search reuses a stored profile for the same
       model, device and workload, or profiles the drafter with one engine launch (`profile_launches` counts them).
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
        self, sampler: str = "tpe", *, initial_top: int = 1, noise: float = DEFAULT_NOISE, min_trials: int = 3
    ) -> None:
        if not 0 <= noise < 1:
            raise UsageError(f"The measurement noise must be in [0, 1) (a fraction, e.g. 0.03), but got {noise}.")
        if initial_top < 1 or min_trials < 1:
            raise UsageError(f"initial_top and min_trials must be >= 1, but got {initial_top} and {min_trials}.")
        self._fallback = BlackboxStrategy(sampler)
        self.initial_top = initial_top
        self.noise = noise
        self.min_trials = min_trials
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
            if guide.stop or ctx.queued() or not remaining:
                return []
            return [self._pick(guide, remaining, guide.calibrated()[0])]
        ranked = self._ranked(guide, guide.predicted)
        if not ranked:
            return []
        first = self._pick(guide, ranked, guide.predicted)
        ranked.remove(first)
        base = ctx.space.baselines([first.max_num_seqs])
        out = [first, *base, *ranked[:self.initial_top - 1]]
        return list(dict.fromkeys(out))

    def after_trial(self, ctx: StrategyContext, config: SpecConfig, measurement: Measurement) -> None:
        guide = self._guide(ctx)
        guide.measured[config] = ctx.objective.score(measurement)
        self._sync(ctx, guide)
        remaining = self._decide(ctx, guide, config)
        if not guide.stop and remaining and not ctx.queued():
            calibrated, _ = guide.calibrated()
            ctx.enqueue(self._pick(guide, remaining, calibrated))

    def should_stop(self, ctx: StrategyContext) -> bool:
        return self._guide(ctx).stop

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
        _, error = guide.calibrated()
        top = self._ranked(guide, guide.predicted)[:1]
        return {
            "profile_launches": launches,
            "profiles": {d: p.label for d, p in self.profiles.items()},
            "stop_reason": guide.reason or "trial budget reached",
            "predicted_best": top[0].label() if top else None,
            "prediction_error": None if math.isnan(error) else error,
            "noise": self.noise,
            "trace": guide.trace,
        }

    # ---- the stop rule -------------------------------------------------------------------------------------------

    def _decide(self, ctx: StrategyContext, guide: _Guide, config: SpecConfig | None = None) -> list[SpecConfig]:
        """Recalibrate, apply the stop rule (sets ``guide.stop``), and return the unmeasured, unqueued candidates
        by calibrated prediction."""
        calibrated, error = guide.calibrated()
        guide.error = error
        feasible = [s for s in guide.measured.values() if s is not None]
        best = max(feasible) if feasible else None
        remaining = self._ranked(guide, calibrated, exclude=set(guide.measured) | ctx.queued())
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
        if not remaining and not ctx.queued() and feasible:
            guide.stop = True
            guide.reason = "every predicted config was measured"
        return remaining

    # ---- predictions ---------------------------------------------------------------------------------------------

    def _guide(self, ctx: StrategyContext) -> _Guide:
        key = ctx.study.study_name
        if key not in self._guides:
            predicted, feasible = self._predict(ctx)
            self._guides[key] = guide = _Guide(predicted, feasible)
            self._sync(ctx, guide)
        return self._guides[key]

    def _profile(self, ctx: StrategyContext, drafter: DrafterChoice) -> DrafterProfile:
        if drafter.name not in self.profiles:
            self.profiles[drafter.name] = ctx.profile(drafter)
        return self.profiles[drafter.name]

    def _predict(self, ctx: StrategyContext) -> tuple[dict[SpecConfig, float], dict[SpecConfig, bool]]:
        from autotune.backends.model import ModelBackend
        from autotune.catalogs import get_drafter, resolve_model

        real = [d for d in ctx.space.drafters if not d.hypothetical]
        profiles = {d.name: self._profile(ctx, d) for d in real}
        target = resolve_model(ctx.model)
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
        for config in ctx.space.grid():
            backend = backends.get(str(config.drafter)) if config.speculative else next(iter(backends.values()), None)
            if backend is None:
                continue
            m = backend.measure(config, ctx.workload, ctx.scenario)
            score = ctx.objective.score(m, check_slos=False)
            if score is not None:
                predicted[config] = score
                feasible[config] = ctx.objective.feasible(measurement_metrics(m))
        if not predicted:
            raise UsageError(
                "--strategy model-guided could not predict any config of the space from the profiles "
                f"({', '.join(p.label for p in profiles.values()) or 'none'}). Use --strategy blackbox."
            )
        return predicted, feasible

    # ---- ranking -------------------------------------------------------------------------------------------------

    @staticmethod
    def _ranked(
        guide: _Guide, scores: Mapping[SpecConfig, float], exclude: set[SpecConfig] | None = None
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

    @staticmethod
    def _sync(ctx: StrategyContext, guide: _Guide) -> None:
        """Take in trials finished by other workers (or an earlier run of a resumed study)."""
        for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            if not counted(t) or not t.state.is_finished():
                continue
            config = ctx.config_of(t)
            if config is None or config in guide.measured:
                continue
            m = trial_measurement(t) if t.state == TrialState.COMPLETE else None
            guide.measured[config] = None if m is None else ctx.objective.score(m)
