"""A predicted search runs its study in memory and writes it back at the end (`autotune.search.private`): what it
stores is what the shared, trial-by-trial path stores for the same seed, read back through Optuna's public API; a
killed one stores nothing and runs again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.backends.model import ModelBackend
from autotune.search import BlackboxStrategy, DrafterChoice, Search, SearchSpace
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload
from store import Store
from store.testing import database_url

PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
SPACE = SearchSpace(drafters=(PEAGLE,), k_max=8, max_num_seqs=(16, 32, 64))


def make(db: str, prefix: str = "p", **kw: Any) -> Search:
    return Search(
        store=Store(db), backend=ModelBackend("gpt-oss-120b", "h200"), model="openai/gpt-oss-120b",
        device="NVIDIA H200", workload=load_workload("mt-bench"), space=SPACE, study_prefix=prefix,
        strategy=BlackboxStrategy(), **kw,
    )


def optuna_trials(db: str, prefix: str = "p") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=f"{prefix}-c64", storage=db).trials


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path, "the private search's write-back")


def undated(value: Any) -> Any:
    """`value` without the provenance's "date" (when each prediction was made: the two runs differ by seconds)."""
    if isinstance(value, dict):
        return {k: undated(v) for k, v in value.items() if k != "date"}
    return value


def stored_as(t: optuna.trial.FrozenTrial) -> tuple[Any, ...]:
    return (t.number, t.state, t.params, t.distributions, t.values, undated(t.user_attrs), t.system_attrs,
            t.intermediate_values)


def test_a_private_search_stores_what_the_shared_search_stores(db_url: str, tmp_path: Path) -> None:
    # 30 trials of 51 configs: TPE proposes, repeats some (told as duplicates) and the rest is the same sampler's
    # choice on both paths only if the private study holds exactly what the shared one does at every step. The
    # private study in the database under test, the shared one in a SQLite file, under one name (the name seeds
    # the random configs a search enqueues; PostgreSQL keeps Optuna's tables between tests, so it is new each run).
    prefix = f"p{uuid.uuid4().hex[:8]}"
    shared_db = f"sqlite:///{tmp_path / 'shared.db'}"
    private = make(db_url, prefix, n_trials=30).run_scenario(Scenario(64))
    shared = make(shared_db, prefix, n_trials=30, private=False).run_scenario(Scenario(64))

    both = [optuna_trials(db, prefix) for db in (db_url, shared_db)]
    assert [stored_as(t) for t in both[0]] == [stored_as(t) for t in both[1]]
    assert any(t.user_attrs["peagle"].get("duplicate_of") is not None for t in both[0])
    ours = [[(t.number, t.config, t.values, t.metrics, t.status)
             for t in Store(db).list_trials(study=f"{prefix}-c64")] for db in (db_url, shared_db)]
    assert ours[0] == ours[1] and len(ours[0]) == 30
    assert private.best.config == shared.best.config
    assert private.best.output_tokens_per_s == shared.best.output_tokens_per_s
    assert [p.config for p in private.pareto] == [p.config for p in shared.pareto]


def test_a_killed_private_search_stores_nothing_and_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    search = make(db, n_trials=10)
    real = search.backend.measure
    calls = {"n": 0}

    def interrupt_fifth(config: SpecConfig, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(config, *args, **kwargs)

    monkeypatch.setattr(search.backend, "measure", interrupt_fifth)
    with pytest.raises(KeyboardInterrupt):
        search.run_scenario(Scenario(64))
    assert optuna_trials(db) == [] and Store(db).list_trials(study="p-c64") == []

    result = make(db, n_trials=10).run_scenario(Scenario(64))
    assert result.n_trials == 10
    assert len(Store(db).list_trials(study="p-c64")) == 10


def test_a_finished_private_study_run_again_adds_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    first = make(db, n_trials=12).run_scenario(Scenario(64))
    before = [stored_as(t) for t in optuna_trials(db)]
    again = make(db, n_trials=12).run_scenario(Scenario(64))
    assert [stored_as(t) for t in optuna_trials(db)] == before
    assert again.best.config == first.best.config
