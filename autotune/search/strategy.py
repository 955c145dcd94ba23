"""The strategy interface: how a search chooses configs, and the narrow view of the search its hooks get.

A strategy is small on purpose, like Optuna's samplers: a sampler, the configs to try first, and hooks after each
trial. It sees one scenario's study through a `StrategyContext` (what is searched, the study, two services), not
the whole search: it cannot measure, store or launch anything itself. Built-in strategies: `strategies`
(blackbox, random, grid) and `model_guided`; `registry.register_strategy` adds more.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import UsageError
from autotune.measurement import Measurement
from autotune.search.objective import Objective
from autotune.search.space import DrafterChoice, SearchSpace
from autotune.search.trials import trial_config
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload

if TYPE_CHECKING:
    from autotune.search.profiles import DrafterProfile

#: (context, drafter) -> its measured profile. The search's default reuses a stored profile or makes one
#: (`autotune.search.profiles.store_or_profile`); tests and benchmarks pass their own to `Search(profiles=...)`.
ProfileProvider = Callable[["StrategyContext", DrafterChoice], "DrafterProfile"]


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy's hooks see of one scenario's search."""

    study: optuna.Study
    """The scenario's study (shared by every worker): read its trials, enqueue configs (`enqueue`)."""
    scenario: Scenario
    target: int
    """Trials the study should finish (shared by every worker)."""
    space: SearchSpace
    objective: Objective
    workload: Workload
    model: str
    """The target model as a predictor resolves it: the directory the backend loads, else the search's model name."""
    profiles: ProfileProvider | None = None
    """Where `profile` gets drafter profiles (None: nowhere)."""

    def config_of(self, trial: FrozenTrial) -> SpecConfig | None:
        """The config a trial of the study measures (None: not a config of the space)."""
        return trial_config(self.space, trial)

    def enqueue(self, config: SpecConfig) -> None:
        """Ask the study to measure `config` next (after configs already queued)."""
        self.study.enqueue_trial(self.space.params_of(config))

    def queued(self) -> set[SpecConfig]:
        """Configs waiting in the study's queue or being measured by a worker."""
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
        return {c for c in map(self.config_of, trials) if c is not None}

    def profile(self, drafter: DrafterChoice) -> DrafterProfile:
        """The measured profile of `drafter` for this search's model, device and workload (stored, or made with one
        engine launch). Raises UsageError when there is none and none can be made."""
        if self.profiles is None:
            raise UsageError(f"No profile source: drafter {drafter.name} cannot be predicted. Use --strategy blackbox.")
        return self.profiles(self, drafter)


class Strategy(abc.ABC):
    """How a search chooses configs: a sampler, the configs to try first, and hooks after each trial.

    `ModelGuidedStrategy` uses every hook: `initial_configs` returns the top predicted configs for
    ``ctx.scenario`` (and the baselines); `after_trial` recalibrates the predictor from each measurement and
    enqueues the next candidate (``ctx.enqueue(config)``); `should_stop` ends the search once the best is confirmed
    within the measurement noise; `report` adds its profiling launches. Register a strategy with
    `register_strategy` (its factory receives ``sampler=`` when --sampler is given).
    """

    name: ClassVar[str] = "base"

    @property
    def label(self) -> str:
        """Name with options, for default study names (e.g. ``blackbox-gp``)."""
        return self.name

    @abc.abstractmethod
    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        """The Optuna sampler; `deterministic` is True when the backend predicts (same config, same value)."""

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
