"""Objectives: SLO constraints exclude violating configs, Pareto fronts are non-dominated, latency minimises TPOT.

Every run predicts with the model backend (gpt-oss-120b on an H200, mt-bench) over a grid the test also predicts
directly, so expected winners are derived from the same predictions rather than hard-coded.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.backends import speedup_log_sigma
from autotune.backends.model import ModelBackend
from autotune.errors import UsageError
from autotune.search import (
    DrafterChoice,
    GridStrategy,
    Objective,
    ScenarioResult,
    Search,
    SearchSpace,
    measurement_metrics,
)
from autotune.search.compare import tie_key
from autotune.search.result import tie_margin
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload
from store import Store

PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
SCENARIO = Scenario(concurrency=64)
# 2 x (1 baseline + 8 parallel + 8 sequential K) = 34 configs; max_num_seqs=32 < concurrency trades throughput for
# a smaller batch (lower TPOT) and queueing (higher TTFT), which is what makes the SLOs bite.
SPACE = SearchSpace(drafters=(PEAGLE,), k_max=8, max_num_seqs=(32, 64))


@pytest.fixture(scope="module")
def backend() -> ModelBackend:
    return ModelBackend("gpt-oss-120b", "h200")


@pytest.fixture(scope="module")
def predicted(backend: ModelBackend) -> dict[SpecConfig, dict[str, float]]:
    """The model backend's metrics for every config of the grid."""
    workload = load_workload("mt-bench")
    return {c: measurement_metrics(backend.measure(c, workload, SCENARIO)) for c in SPACE.grid()}


def run(tmp_path: Path, backend: ModelBackend, objective: Objective, name: str) -> tuple[ScenarioResult, Search]:
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    search = Search(
        store=store,
        backend=backend,
        model="openai/gpt-oss-120b",
        device=backend.device,
        workload=load_workload("mt-bench"),
        space=SPACE,
        objective=objective,
        strategy=GridStrategy(),
        study_prefix=name,
    )
    return search.run_scenario(SCENARIO), search


def rule_pick(configs: list, value: dict, maximize: bool = True) -> SpecConfig:
    """The search's rule on predicted figures: configs within the prediction's spread of the best tie, and the tie
    goes to the smallest K (`tie_key`; every config here runs max_num_seqs 64 at concurrency 64)."""
    margin = tie_margin(speedup_log_sigma())
    if maximize:
        top = max(value[c] for c in configs)
        band = [c for c in configs if value[c] >= top * (1 - margin)]
    else:
        top = min(value[c] for c in configs)
        band = [c for c in configs if value[c] <= top * (1 + margin)]
    return min(band, key=lambda c: tie_key(c, 64))


def test_goodput_slo_excludes_the_unconstrained_best(tmp_path: Path, backend: ModelBackend, predicted: dict) -> None:
    best_free = max(predicted, key=lambda c: predicted[c]["output_tokens_per_s"])
    # An SLO halfway between the lowest TPOT p99 in the grid and the unconstrained best's: the best violates it
    # and at least the lowest-TPOT config meets it.
    lowest = min(m["tpot_ms_p99"] for m in predicted.values())
    slo = (lowest + predicted[best_free]["tpot_ms_p99"]) / 2
    assert predicted[best_free]["tpot_ms_p99"] > slo
    meeting = [c for c in predicted if predicted[c]["tpot_ms_p99"] <= slo]
    fastest = max(meeting, key=lambda c: predicted[c]["output_tokens_per_s"])
    expected = rule_pick(meeting, {c: predicted[c]["output_tokens_per_s"] for c in meeting})

    result, search = run(tmp_path, backend, Objective("goodput", slo_tpot_p99_ms=slo), "goodput")

    assert result.feasible
    assert result.best.config == expected
    assert result.best.config != best_free
    assert measurement_metrics(result.best)["tpot_ms_p99"] <= slo
    assert result.constraints["tpot_ms_p99"] <= 0
    # Violating trials stay stored with their constraint values, marked infeasible.
    trials = search.store.list_trials(study=result.study_name)
    assert len(trials) == len(SPACE.grid())
    for t in trials:
        over = predicted[SpecConfig.from_dict(t.config)]["tpot_ms_p99"] - slo
        assert t.metrics["constraints"]["tpot_ms_p99"] == pytest.approx(over)
        assert t.metrics["feasible"] is (over <= 0)
    # Optuna knows the constraints too: its best trial is the fastest feasible config (the tie rule is ours).
    study = optuna.load_study(study_name=result.study_name, storage=search.store.url)
    assert SpecConfig.from_dict(study.best_trial.user_attrs["peagle"]["config"]) == fastest


def test_ttft_slo_and_recommendation_store_only_feasible(
    tmp_path: Path, backend: ModelBackend, predicted: dict
) -> None:
    # max_num_seqs=32 at concurrency 64 queues half the requests: their TTFT p99 is seconds, the others' tens of ms.
    slo = 100.0
    meeting = [c for c in predicted if predicted[c]["ttft_ms_p99"] <= slo]
    assert meeting and all(c.max_num_seqs == 64 for c in meeting)
    expected = rule_pick(meeting, {c: predicted[c]["output_tokens_per_s"] for c in meeting})

    result, search = run(tmp_path, backend, Objective("goodput", slo_ttft_p99_ms=slo), "ttft")

    assert result.best.config == expected
    rid = search.recommend(result, {"vllm_version": None})
    assert rid is not None
    assert search.store.get_recommendation(rid).metrics["constraints"]["ttft_ms_p99"] <= 0


def test_no_config_meeting_the_slo_is_not_recommended(tmp_path: Path, backend: ModelBackend, predicted: dict) -> None:
    slo = min(m["tpot_ms_p99"] for m in predicted.values()) * 0.5  # half the lowest TPOT: nothing meets it
    result, search = run(tmp_path, backend, Objective("goodput", slo_tpot_p99_ms=slo), "impossible")
    assert not result.feasible
    assert "NOT recommended" in result.rule
    assert search.recommend(result, {}) is None
    assert search.store.list_recommendations() == []


def test_pareto_front_is_non_dominated_and_recommends_its_fastest_point(
    tmp_path: Path, backend: ModelBackend, predicted: dict
) -> None:
    result, _ = run(tmp_path, backend, Objective("pareto"), "pareto")

    def point(metrics: dict) -> tuple[float, float]:
        return metrics["output_tokens_per_s"], metrics["tpot_ms_p99"]

    def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] >= b[0] and a[1] <= b[1] and a != b

    margin = tie_margin(speedup_log_sigma())

    def within(a: tuple[float, float], b: tuple[float, float]) -> bool:
        """`a` is no worse than `b` by more than the prediction's spread on either objective."""
        return a[0] >= b[0] * (1 - margin) and a[1] <= b[1] * (1 + margin)

    front = [point(p.metrics) for p in result.pareto]
    assert len(front) >= 2  # max_num_seqs 64 wins throughput, 32 wins TPOT: a real trade-off
    assert len(set(front)) == len(front)  # one point per position
    assert not any(dominates(a, b) for a in front for b in front)
    # Every config of the grid is on the front, or dominated by a front point, or ties with one within the spread
    # (the pick stands on the front in the place of the fastest point it ties with).
    for config, metrics in predicted.items():
        p = point(metrics)
        assert p in front or any(dominates(f, p) or within(p, f) for f in front), config.label()
    # The recommended point is on the front: of the configs tying with the fastest point on both objectives, the
    # one the tie order puts first (`tie_key`: the smallest K).
    fastest = max(predicted.values(), key=lambda m: m["output_tokens_per_s"])
    tied = [c for c, m in predicted.items() if within(point(m), point(fastest))]
    assert result.best.config == min(tied, key=lambda c: tie_key(c, 64))
    assert result.best.config in [q.config for q in result.pareto]
    assert "Pareto front's highest-throughput point" in result.rule


def test_pareto_with_an_slo_recommends_the_fastest_point_that_meets_it(
    tmp_path: Path, backend: ModelBackend, predicted: dict
) -> None:
    fastest = max(predicted, key=lambda c: predicted[c]["output_tokens_per_s"])
    lowest = min(m["tpot_ms_p99"] for m in predicted.values())
    slo = (lowest + predicted[fastest]["tpot_ms_p99"]) / 2
    meeting = [c for c in predicted if predicted[c]["tpot_ms_p99"] <= slo]
    fastest = max(meeting, key=lambda c: predicted[c]["output_tokens_per_s"])
    margin = tie_margin(speedup_log_sigma())
    # Of the configs meeting the SLO and tying with the fastest of them on both objectives: the smallest K.
    expected = min((c for c in meeting
                    if predicted[c]["output_tokens_per_s"] >= predicted[fastest]["output_tokens_per_s"] * (1 - margin)
                    and predicted[c]["tpot_ms_p99"] <= predicted[fastest]["tpot_ms_p99"] * (1 + margin)),
                   key=lambda c: tie_key(c, 64))
    result, _ = run(tmp_path, backend, Objective("pareto", slo_tpot_p99_ms=slo), "pareto-slo")
    assert result.best.config == expected
    assert all(p.metrics["tpot_ms_p99"] <= slo for p in result.pareto)


def test_latency_objective_minimises_tpot_p50(tmp_path: Path, backend: ModelBackend, predicted: dict) -> None:
    result, _ = run(tmp_path, backend, Objective("latency"), "latency")
    tpot = {c: m["tpot_ms_p50"] for c, m in predicted.items()}
    assert result.best.config == rule_pick(list(tpot), tpot, maximize=False)
    # The pick is within the prediction's spread of the lowest TPOT, not necessarily the lowest itself.
    lowest = min(tpot.values())
    assert lowest <= measurement_metrics(result.best)["tpot_ms_p50"] <= lowest * (1 + tie_margin(speedup_log_sigma()))


def test_goodput_needs_an_slo() -> None:
    with pytest.raises(UsageError, match="--slo-tpot-p99"):
        Objective("goodput")


def test_missing_tail_latency_is_taken_from_p50_and_says_so(backend: ModelBackend) -> None:
    m = backend.measure(SpecConfig(max_num_seqs=8), load_workload("mt-bench"), Scenario(8))
    assert m.tpot_ms_p99 is None  # the model backend predicts one steady-state value
    metrics = measurement_metrics(m)
    assert metrics["tpot_ms_p99"] == metrics["tpot_ms_p50"]
    assert "tpot_ms_p99" in metrics["p99_from_p50"]
