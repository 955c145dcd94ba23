"""Strategies: grid order, random, blackbox (baselines first, exhaustive when the grid fits, GP), duplicates never
re-measured, and the strategy plug-in point. (`test_search_strategy_contract.py` holds what every registered
strategy must do.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from test_search_strategy_contract import Counting

from autotune.backends.base import Backend
from autotune.backends.model import ModelBackend
from autotune.errors import UsageError
from autotune.measurement import Measurement
from autotune.search import (
    STRATEGIES,
    BlackboxStrategy,
    DrafterChoice,
    GridStrategy,
    Objective,
    RandomStrategy,
    Search,
    SearchEvent,
    SearchSpace,
    Strategy,
    StrategyContext,
    make_strategy,
    register_strategy,
)
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload
from store import Store

PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
SCENARIO = Scenario(concurrency=64)


def make(tmp_path: Path, space: SearchSpace, strategy: Strategy, backend: Backend | None = None, **kw: Any) -> Search:
    backend = backend or ModelBackend("gpt-oss-120b", "h200")
    return Search(
        store=Store(f"sqlite:///{tmp_path / 'peagle.db'}"),
        backend=backend,
        model="openai/gpt-oss-120b",
        device="NVIDIA H200",
        workload=load_workload("mt-bench"),
        space=space,
        strategy=strategy,
        study_prefix=kw.pop("study_prefix", "s"),
        **kw,
    )


def study_configs(search: Search, name: str) -> list[SpecConfig]:
    """Configs of the study's measured trials (not duplicates), in trial order."""
    study = optuna.load_study(study_name=name, storage=search.store.url)
    return [
        SpecConfig.from_dict(t.user_attrs["peagle"]["config"])
        for t in study.trials
        if t.user_attrs["peagle"].get("duplicate_of") is None
    ]


def test_grid_measures_every_config_in_order(tmp_path: Path) -> None:
    space = SearchSpace(drafters=(PEAGLE,), k_max=3, max_num_seqs=(32, 64))
    search = make(tmp_path, space, GridStrategy())
    assert search.target == len(space.grid()) == 14  # 2 x (1 + 2 x 3)
    result = search.run_scenario(SCENARIO)
    assert study_configs(search, result.study_name) == space.grid()
    assert result.n_trials == 14


def test_grid_with_fewer_trials_takes_the_first_configs(tmp_path: Path) -> None:
    space = SearchSpace(drafters=(PEAGLE,), k_max=3, max_num_seqs=(32, 64))
    result = (search := make(tmp_path, space, GridStrategy(), n_trials=5)).run_scenario(SCENARIO)
    assert study_configs(search, result.study_name) == space.grid()[:5]


def test_random_measures_distinct_configs_and_never_re_measures_a_duplicate(tmp_path: Path) -> None:
    # 17 configs, 12 trials: random draws repeat configs; each config is measured once.
    space = SearchSpace(drafters=(PEAGLE,), k_max=8, max_num_seqs=(64,))
    backend = Counting()
    search = make(tmp_path, space, RandomStrategy(), backend, n_trials=12, seed=3)
    result = search.run_scenario(SCENARIO)
    measured = study_configs(search, result.study_name)
    assert len(measured) == len(set(measured)) == 12
    in_study = [c for c in backend.calls if c in set(measured)]
    assert sorted(in_study, key=repr) == sorted(measured, key=repr)
    assert len(search.store.list_trials(study=result.study_name)) == 12


def test_blackbox_starts_with_the_baselines_when_the_grid_exceeds_the_budget(tmp_path: Path) -> None:
    space = SearchSpace(drafters=(PEAGLE,), k_max=8, max_num_seqs=(32, 64))  # 34 configs > 10 trials
    search = make(tmp_path, space, BlackboxStrategy(), n_trials=10)
    result = search.run_scenario(SCENARIO)
    measured = study_configs(search, result.study_name)
    assert measured[: len(space.baselines())] == space.baselines()
    assert len(set(measured)) == 10
    # The comparisons come from those baseline trials: no speculation and the publisher's K=5.
    assert result.baseline is not None and not result.baseline.config.speculative
    assert result.published is not None and result.published.config.k == 5


def test_blackbox_is_exhaustive_when_the_grid_fits(tmp_path: Path) -> None:
    space = SearchSpace(drafters=(PEAGLE,), k_max=4, max_num_seqs=(64,))  # 9 configs
    search = make(tmp_path, space, BlackboxStrategy(), n_trials=60)
    result = search.run_scenario(SCENARIO)
    assert sorted(study_configs(search, result.study_name), key=repr) == sorted(space.grid(), key=repr)


def test_gp_sampler_runs_the_same_loop(tmp_path: Path) -> None:
    space = SearchSpace(drafters=(PEAGLE,), k_max=8, max_num_seqs=(32, 64))
    search = make(tmp_path, space, make_strategy("blackbox", sampler="gp"), n_trials=12)
    result = search.run_scenario(SCENARIO)
    measured = study_configs(search, result.study_name)
    assert len(measured) == len(set(measured)) == 12
    assert result.best.config in measured


def test_events_report_states_and_reach_the_target(tmp_path: Path) -> None:
    space = SearchSpace(drafters=(PEAGLE,), k_max=3, max_num_seqs=(64,))
    events: list[SearchEvent] = []
    make(tmp_path, space, GridStrategy()).run_scenario(SCENARIO, events.append)
    assert [e.kind for e in events][0] == "start" and events[-1].kind == "end"
    trials = [e for e in events if e.kind == "trial"]
    assert [e.done for e in trials] == list(range(1, 8))
    assert events[-1].complete == events[-1].target == 7


class FirstThree(Strategy):
    """A strategy from outside the module: fixed initial configs, then stop (as model-guided will)."""

    name = "first-three"

    def __init__(self, **_: Any) -> None:
        self.seen: list[SpecConfig] = []

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        return list(reversed(ctx.space.grid()))[:3]

    def after_trial(self, ctx: StrategyContext, config: SpecConfig, measurement: Measurement) -> None:
        self.seen.append(config)

    def should_stop(self, ctx: StrategyContext) -> bool:
        return len(self.seen) >= 3


def test_registered_strategy_drives_the_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.search.registry.STRATEGIES", dict(STRATEGIES))
    register_strategy("first-three", FirstThree)
    strategy = make_strategy("first-three")
    space = SearchSpace(drafters=(PEAGLE,), k_max=4, max_num_seqs=(64,))
    result = make(tmp_path, space, strategy).run_scenario(SCENARIO)
    assert isinstance(strategy, FirstThree) and strategy.seen == list(reversed(space.grid()))[:3]
    assert result.n_trials == 3


def test_strategy_option_errors_say_what_to_use() -> None:
    with pytest.raises(UsageError, match="--sampler gp applies to --strategy blackbox only"):
        make_strategy("random", sampler="gp")
    with pytest.raises(UsageError, match="--strategy must be one of"):
        make_strategy("annealing")
