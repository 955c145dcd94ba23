"""The sampler-driven strategies: blackbox (Optuna's TPE or GP), random, and grid (every config in order)."""

from __future__ import annotations

import warnings

import optuna

from autotune.errors import UsageError
from autotune.search.objective import Objective
from autotune.search.space import SearchSpace
from autotune.search.strategy import Strategy, StrategyContext
from autotune.spec import SpecConfig

SAMPLERS: tuple[str, ...] = ("tpe", "gp")


class BlackboxStrategy(Strategy):
    """Optuna's TPE (or GP) over real measurements, baselines first.

    When the whole grid fits in the trial budget it is measured exhaustively instead.
    """

    name = "blackbox"

    def __init__(self, sampler: str = "tpe") -> None:
        if sampler not in SAMPLERS:
            raise UsageError(f"--sampler must be tpe or gp, but got {sampler!r}.")
        self.sampler_name = sampler

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

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        grid = ctx.space.grid()
        return grid if len(grid) <= ctx.target else ctx.space.baselines()[: ctx.target]


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
        return ctx.space.grid()[: ctx.target]
