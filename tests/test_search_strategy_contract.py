"""Contract of `autotune.search.Strategy`, run on every registered strategy (like the store contract suite runs on
every database): what the study loop relies on, whatever the strategy.

Each search predicts with the model backend (gpt-oss-120b on an H200, mt-bench) over a 10-config space; model-guided
gets its drafter profile from a provider (published acceptance, a linear step cost), so no engine is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.backends.base import Backend
from autotune.backends.model import ModelBackend
from autotune.measurement import Measurement
from autotune.search import (
    STRATEGIES,
    DrafterChoice,
    DrafterProfile,
    Objective,
    Search,
    SearchSpace,
    Strategy,
    StrategyContext,
    make_strategy,
)
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload
from store import Store

NAMES = sorted(STRATEGIES)
PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
# 2 max_num_seqs x (1 baseline + 4 parallel K) = 10 configs.
SPACE = SearchSpace(drafters=(PEAGLE,), k_max=4, max_num_seqs=(32, 64), parallel_drafting="on")
SCENARIO = Scenario(concurrency=64)
TRIALS = 6


class LinearCost:
    """T(B, K) = 10 + 0.02 * B * (K + 1) ms: the step cost of the contract's drafter profile."""

    def predict(self, batch_size: int, depth: int, drafter_ran: bool | None = None) -> float:
        return 10.0 + 0.02 * batch_size * (depth + 1)


def provide(ctx: StrategyContext, drafter: DrafterChoice) -> DrafterProfile:
    return DrafterProfile(drafter.name, {}, LinearCost(), "contract profile", None, 0)


class Counting(Backend):
    """The model backend's figures, remembering every config asked for. It declares no capability, so the search asks
    it for nothing beyond the trials and the two comparisons (no predicted schedule or per-class caps)."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = ModelBackend("gpt-oss-120b", "h200")
        self.calls: list[SpecConfig] = []

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        self.calls.append(config)
        return self.inner.measure(config, workload, scenario)


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def search(tmp_path: Path, strategy: Strategy, backend: Counting, objective: Objective | None = None,
           prefix: str = "contract") -> Search:
    return Search(
        store=Store(f"sqlite:///{tmp_path / 'peagle.db'}"), backend=backend, model="openai/gpt-oss-120b",
        device=backend.inner.device, workload=load_workload("mt-bench"), space=SPACE,
        objective=objective or Objective(), strategy=strategy, n_trials=TRIALS, study_prefix=prefix, profiles=provide,
    )


def measured(s: Search, study: str) -> dict[int, SpecConfig]:
    """Trial number -> config of the study's trials that measured something (not duplicates told from an earlier
    trial: a sampler proposing a measured config is told its result instead)."""
    trials = optuna.load_study(study_name=study, storage=s.store.url).trials
    return {t.number: SpecConfig.from_dict(t.user_attrs["peagle"]["config"]) for t in trials
            if t.user_attrs["peagle"].get("duplicate_of") is None}


def test_the_registry_makes_it_under_its_name(name: str) -> None:
    strategy = make_strategy(name)
    assert isinstance(strategy, Strategy) and strategy.name == name
    assert strategy.label.startswith(name)  # default study names carry it
    assert strategy.default_trials(SPACE) >= 1


@pytest.mark.parametrize("objective", [Objective(), Objective("pareto")], ids=["single", "pareto"])
def test_its_sampler_is_an_optuna_sampler(name: str, objective: Objective) -> None:
    for deterministic in (True, False):
        sampler = make_strategy(name).sampler(objective, 0, deterministic=deterministic)
        assert isinstance(sampler, optuna.samplers.BaseSampler)


def test_a_search_measures_distinct_configs_of_the_space_within_the_budget(tmp_path: Path, name: str) -> None:
    backend = Counting()
    s = search(tmp_path, make_strategy(name), backend)
    result = s.run_scenario(SCENARIO)
    trials = measured(s, result.study_name)
    configs = list(trials.values())
    assert configs and all(SPACE.contains(c) for c in configs)
    assert len(configs) == len(set(configs)) <= TRIALS  # never the same config twice, never over the budget
    assert result.n_trials == len(configs) and result.n_failed == 0
    assert result.best.config in configs
    # Each measured trial is in our store too, under its study number.
    assert {t.number for t in s.store.list_trials(study=result.study_name)} == set(trials)
    # The backend measured the trials and at most the two comparisons (no speculation, the publisher's K).
    assert set(configs) <= set(backend.calls) and len(backend.calls) <= len(configs) + 2
    json.dumps(result.strategy_report)  # a report goes into the JSON output and the store as it is
    assert int(result.strategy_report.get("profile_launches", 0)) == result.profile_launches == 0


def test_its_initial_configs_are_distinct_configs_of_the_space(tmp_path: Path, name: str) -> None:
    strategy = make_strategy(name)
    s = search(tmp_path, strategy, Counting())
    ctx = StrategyContext(optuna.create_study(), SCENARIO, TRIALS, SPACE, Objective(), s.workload, s.model, provide)
    configs = strategy.initial_configs(ctx)
    assert all(SPACE.contains(c) for c in configs) and len(configs) == len(set(configs))


@pytest.mark.slow
def test_the_first_run_is_reproducible(tmp_path: Path, name: str) -> None:
    runs = []
    for i in range(2):
        backend = Counting()
        (tmp_path / str(i)).mkdir()
        search(tmp_path / str(i), make_strategy(name), backend).run_scenario(SCENARIO)
        runs.append(backend.calls)
    assert runs[0] == runs[1]


@pytest.mark.slow
def test_a_finished_study_resumes_without_measuring_again(tmp_path: Path, name: str) -> None:
    first = search(tmp_path, make_strategy(name), Counting()).run_scenario(SCENARIO)
    backend = Counting()
    again = search(tmp_path, make_strategy(name), backend).run_scenario(SCENARIO)
    assert len(measured(search(tmp_path, make_strategy(name), Counting()), first.study_name)) == first.n_trials
    assert again.n_trials == first.n_trials and again.best.config == first.best.config
    # Nothing of the space is measured again: only a comparison outside it (here the publisher's K=5 > k_max=4).
    assert not [c for c in backend.calls if SPACE.contains(c)]


def test_pareto_searches_keep_a_front_of_measured_configs(tmp_path: Path, name: str) -> None:
    s = search(tmp_path, make_strategy(name), Counting(), Objective("pareto"), prefix="pareto")
    result = s.run_scenario(SCENARIO)
    configs = set(measured(s, result.study_name).values())
    assert result.pareto and all(p.config in configs for p in result.pareto)
    assert result.best.config in {p.config for p in result.pareto}
