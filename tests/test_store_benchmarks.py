"""The benchmarks table (`peagle-tune bench`): measured figures stored beside the recommendation they check, and
the 0001 -> 0002 upgrade that adds it to a database a search already filled."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command

import store._migrate as migrate
from store import InvalidRecordError, RowNotFoundError, StaleSchemaError, Store, upgrade
from store._engine import create_store_engine

FIGURES = {"output_tokens_per_s": 41.5, "tpot_ms_p50": 22.0}
PROVENANCE = {"kind": "measured", "backend": "vllm bench serve", "device": "cpu", "vllm_version": "0.32.0"}


def _recommendation(store: Store) -> int:
    return store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"max_num_seqs": 4},
                                    scenario={"concurrency": 4}, metrics={"output_tokens_per_s": 40.0})


def test_a_benchmark_is_stored_beside_its_recommendation_newest_first(tmp_path: Path) -> None:
    with Store(str(tmp_path / "p.db")) as store:
        rid = _recommendation(store)
        other = _recommendation(store)
        first = store.add_benchmark(rid, mode="static", concurrency=4, num_prompts=8, figures=FIGURES,
                                    provenance=PROVENANCE, commands={"serve": ["vllm", "serve", "m"]})
        second = store.add_benchmark(rid, mode="adaptive", concurrency=4, num_prompts=8, figures=FIGURES,
                                     provenance=PROVENANCE)
        store.add_benchmark(other, mode="static", concurrency=4, num_prompts=8, figures=FIGURES, provenance=PROVENANCE)
        mine = store.list_benchmarks(rid)
        assert [b.id for b in mine] == [second, first]
        assert mine[1].figures == FIGURES and mine[1].commands == {"serve": ["vllm", "serve", "m"]}
        assert mine[1].to_dict()["provenance"]["backend"] == "vllm bench serve"
        assert len(store.list_benchmarks()) == 3


def test_a_benchmark_needs_a_stored_recommendation_and_a_known_mode(tmp_path: Path) -> None:
    with Store(str(tmp_path / "p.db")) as store:
        with pytest.raises(RowNotFoundError, match="No recommendation with id 7"):
            store.add_benchmark(7, mode="static", concurrency=1, num_prompts=1, figures={}, provenance={})
        rid = _recommendation(store)
        with pytest.raises(InvalidRecordError, match="mode"):
            store.add_benchmark(rid, mode="fast", concurrency=1, num_prompts=1, figures={}, provenance={})


def test_upgrading_a_0001_database_keeps_its_recommendations_and_adds_benchmarks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_store_engine(url)
    try:
        with engine.begin() as connection:  # the database a search wrote before `bench` existed
            command.upgrade(migrate.alembic_config(connection=connection), "0001")
            connection.exec_driver_sql(
                "INSERT INTO peagle_recommendations (model, gpu, objective, scenario, best_config, metrics, "
                "provenance, pareto, schedule, class_policy, created_at) VALUES ('m', 'cpu', 'throughput', '{}', "
                "'{}', '{}', '{}', '[]', '[]', '{}', '2026-12-01 00:00:00')")
    finally:
        engine.dispose()
    with pytest.raises(StaleSchemaError, match="peagle-tune db upgrade"):
        Store(url)
    assert upgrade(url) == "0002"
    with Store(url) as store:
        assert store.add_benchmark(1, mode="static", concurrency=1, num_prompts=1, figures=FIGURES,
                                   provenance=PROVENANCE) == 1
        assert [r.id for r in store.list_recommendations()] == [1]
