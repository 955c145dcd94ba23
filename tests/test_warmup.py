"""Warm before measuring: the warm-up runs every shape a launch measures, and a slow first phase is reported."""

from __future__ import annotations

from typing import Any

from autotune.profiling import first_phase_outliers, outlier_warning, plan_warmup, shape_warmup, warmup_cost
from autotune.workloads import WorkloadRequest
from policies.plugin import DepthPlan

POOL = [("code", WorkloadRequest(prompt="def f():", max_tokens=200)), ("chat", WorkloadRequest(prompt="hi"))]


def test_shape_warmup_runs_each_depth_at_each_concurrency_for_two_decode_steps() -> None:
    phases = shape_warmup(POOL, [4, 1, 4], [2, 0])
    shapes = [(p["concurrency"], p["max_k"], len(p["requests"])) for p in phases]
    # Every (B, K) once; B requests in flight make the batch shape; K 0 (no speculation) carries no cap.
    assert shapes == [(1, None, 1), (1, 2, 1), (4, None, 4), (4, 2, 4)]
    # K + 3 tokens: 1 from the prefill, then at most K + 1 per decode step, so at least 2 decode steps at width K.
    assert [{r["max_tokens"] for r in p["requests"]} for p in phases] == [{3}, {5}, {3}, {5}]
    # The requests are the workload's own (repeated when it has fewer than B), classes kept for the plugin.
    assert [r["class"] for r in phases[3]["requests"]] == ["code", "chat", "code", "chat"]
    assert phases[3]["requests"][0]["prompt"] == "def f():"
    assert warmup_cost(phases) == "4 shapes, 10 requests x 3 to 5 tokens (40 tokens)"  # 1x3 + 1x5 + 4x3 + 4x5


def test_plan_warmup_outlasts_one_plan_cycle_at_every_concurrency() -> None:
    plan = DepthPlan.sweep(3, block_steps=4)  # depths 3, 0, 3, 1, 3, 2: 24 steps a cycle
    phases = plan_warmup(POOL, [2, 1], plan)
    assert [(p["concurrency"], len(p["requests"]), p.get("max_k")) for p in phases] == [(1, 1, None), (2, 2, None)]
    # One cycle emits at most 4 x ((3+1) + (0+1) + (3+1) + (1+1) + (3+1) + (2+1)) = 72 tokens: with the prefill's
    # token and one to spare a request is still decoding when the cycle ends, whatever the acceptance.
    assert {r["max_tokens"] for p in phases for r in p["requests"]} == {74}


def _phase(name: str, c: int, step_ms: float, iqr: float = 1.0, max_k: int | None = None) -> dict[str, Any]:
    return {"name": name, "concurrency": c, "max_k": max_k, "step_ms": step_ms, "step_ms_iqr": iqr}


def test_a_first_phase_slower_than_the_later_ones_of_its_shape_is_reported() -> None:
    phases = [
        _phase("c1", 1, 30.0), _phase("c4", 4, 40.0),  # c1: a first use in it; c4: as later
        _phase("c1", 1, 10.0), _phase("c4", 4, 41.0),
        _phase("c1", 1, 11.0), _phase("c4", 4, 39.0),
    ]
    (outlier,) = first_phase_outliers(phases)
    # Later c1 phases: median 10.5, range 1.0, single-step IQR 1.0 -> spread 1.0; 30 > 11.5.
    assert (outlier["index"], outlier["concurrency"], outlier["later_phases"]) == (0, 1, 2)
    assert outlier["later_median_ms"] == 10.5 and outlier["spread_ms"] == 1.0
    line = outlier_warning(outlier)
    assert "concurrency 1" in line and "30.0 ms" in line and "10.5 ms" in line and "\n" not in line


def test_a_gap_within_the_spread_of_single_steps_and_a_shape_measured_once_are_not_outliers() -> None:
    # One later phase: no range of means, so the spread is its steps' IQR (5 ms): 14 < 10 + 5.
    assert first_phase_outliers([_phase("k2", 1, 14.0, max_k=2), _phase("k2", 1, 10.0, iqr=5.0, max_k=2)]) == []
    # Different depths are different shapes, each measured once: nothing to judge.
    assert first_phase_outliers([_phase("k1", 1, 50.0, max_k=1), _phase("k2", 1, 10.0, max_k=2)]) == []
