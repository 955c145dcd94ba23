"""Strategies by name: what ``--strategy NAME`` can choose, and the plug-in point for more."""

from __future__ import annotations

from collections.abc import Callable

from autotune.errors import UsageError
from autotune.search.model_guided import ModelGuidedStrategy
from autotune.search.strategies import BlackboxStrategy, GridStrategy, RandomStrategy
from autotune.search.strategy import Strategy

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
