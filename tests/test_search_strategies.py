"""Strategies: grid order, random, blackbox (baselines first, exhaustive when the grid fits, GP), pruning of clearly
worse trials through a backend's warm-up report, duplicates never re-measured, and the strategy plug-in point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.backends.base import Backend
from autotune.backends.model import ModelBackend
from autotune.errors import UsageError
from autotune.measurement import Measurement
from autotune.search import (
    STRATEGIES,
    BlackboxStrategy,
    GridStrategy,
    Objective,
    ProgressCallback,
    RandomStrategy,
    RelativeToBestPruner,
    Search,
    SearchEvent,
    Strategy,
    StrategyContext,
    make_strategy,
    register_strategy,
)
from autotune.space import DrafterChoice, SearchSpace
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload
from store import Store

PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
SCENARIO = Scenario(concurrency=64)


class Counting(Backend):
    """The model backend, counting calls and optionally reporting its prediction as the warm-up figure."""

    def __init__(self, name: str = "counting", report_progress: bool = False) -> None:
        self.inner = ModelBackend("gpt-oss-120b", "h200")
        self.name = name
        self.report_progress = report_progress
        self.calls: list[SpecConfig] = []
        self.stopped: list[SpecConfig] = []

    def measure(
        self, config: SpecConfig, workload: Workload, scenario: Scenario, on_progress: ProgressCallback | None = None
    ) -> Measurement:
        self.calls.append(config)
        m = self.inner.measure(config, workload, scenario)
        # A deterministic predictor's "warm-up" figure equals its final one.
        if self.report_progress and on_progress is not None and m.ok and not on_progress(m):
            self.stopped.append(config)
        return m


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


class PrunedGrid(GridStrategy):
    """The grid in order, pruning like blackbox does but after 2 trials with a 20% margin."""

    def pruner(self, objective: Objective) -> optuna.pruners.BasePruner:
        return RelativeToBestPruner(margin=0.2, n_startup_trials=2)


def test_clearly_worse_trials_are_pruned_after_warm_up(tmp_path: Path) -> None:
    # max_num_seqs 64 first, then 16: at concurrency 64 a 16-request batch serves far fewer tokens/s.
    space = SearchSpace(drafters=(PEAGLE,), k_max=4, max_num_seqs=(64, 16), parallel_drafting="on")
    backend = Counting(report_progress=True)
    search = make(tmp_path, space, PrunedGrid(), backend)
    result = search.run_scenario(SCENARIO)

    # Replay the pruning rule over the grid in order with the same predictions: after 2 complete trials, a trial
    # whose warm-up tokens/s is below 0.8 x the best complete value so far is pruned.
    workload = load_workload("mt-bench")
    complete: list[float] = []
    expected_pruned = []
    for config in space.grid():
        value = float(backend.inner.measure(config, workload, SCENARIO).output_tokens_per_s or 0)
        if len(complete) >= 2 and value < 0.8 * max(complete):
            expected_pruned.append(config)
        else:
            complete.append(value)
    assert expected_pruned, "the space must contain clearly worse configs for this test to mean anything"

    study = optuna.load_study(study_name=result.study_name, storage=search.store.url)
    pruned = [SpecConfig.from_dict(t.user_attrs["peagle"]["config"]) for t in study.trials if t.state.name == "PRUNED"]
    assert pruned == expected_pruned
    assert backend.stopped == expected_pruned  # the backend was told to stop each of them
    stored = {t.number: t.status for t in search.store.list_trials(study=result.study_name)}
    assert sorted(stored.values()).count("pruned") == len(expected_pruned)
    assert result.n_pruned == len(expected_pruned)
    assert result.best.config.max_num_seqs == 64


def test_multi_objective_searches_never_prune(tmp_path: Path) -> None:
    space = SearchSpace(drafters=(PEAGLE,), k_max=4, max_num_seqs=(64, 16), parallel_drafting="on")
    backend = Counting(report_progress=True)
    result = make(tmp_path, space, PrunedGrid(), backend, objective=Objective("pareto")).run_scenario(SCENARIO)
    assert backend.stopped == [] and result.n_pruned == 0


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
        return list(reversed(ctx.search.space.grid()))[:3]

    def after_trial(self, ctx: StrategyContext, config: SpecConfig, measurement: Measurement) -> None:
        self.seen.append(config)

    def should_stop(self, ctx: StrategyContext) -> bool:
        return len(self.seen) >= 3


def test_registered_strategy_drives_the_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.search.STRATEGIES", dict(STRATEGIES))
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
