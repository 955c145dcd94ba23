"""benchmarks/model_error.py: model-backend predictions from a profile vs measured runs, on a synthetic bundle."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from policies import StepCostModel

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "models"


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"benchmarks.{name}")


COST = StepCostModel({"base": 4.0, "per_request": 0.3, "per_verified_token": 0.12, "drafter_fixed": 2.5,
                      "drafter_per_request": 0.2})
PROFILE = {
    "id": 1, "model": str(FIXTURES / "target"), "drafter": str(FIXTURES / "drafter-2l"), "method": "draft_model",
    "max_k": 4, "parallel_drafting": True,
    "acceptance": {"predictable": {"num_drafts": 1000, "accepted_per_position": [984, 909, 898, 878]},
                   "entropic": {"num_drafts": 1000, "accepted_per_position": [247, 0, 0, 0]}},
    "cost_model": COST.to_dict(),
    "baseline_samples": [{"batch_size": 8, "depth": 0, "step_ms": 6.4, "n": 10}],
}
WORKLOADS = {"stationary": [[{"class": "predictable", "prompt": "def f(x):\n    return x", "max_tokens": 48},
                             {"class": "entropic", "prompt": "Tell me a story.", "max_tokens": 48}]]}


def _round(tok_s: float) -> dict[str, Any]:
    """One measured round that produced `tok_s` output tokens/s (480 tokens over two phases)."""
    return {"c8:stationary": [{"wall_s": 240.0 / tok_s, "output_tokens": 240},
                              {"wall_s": 240.0 / tok_s, "output_tokens": 240}]}


def _bundle(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    configs = {"no speculation": {"kind": "none"}, "static K=2": {"kind": "static", "k": 2},
               "adaptive (peagle)": {"kind": "adaptive", "policy": {}}}
    return {"date": "synthetic", "load_average": {"before": [0.05, 0.1, 0.2], "after": [0.3, 0.2, 0.2]},
            "concurrencies": [8], "c1_requests": 1, "max_k": 4, "profile": PROFILE, "traces": [],
            "workloads": WORKLOADS, "configs": configs, "runs": runs}


def test_comparison_reports_median_min_max_error_and_median_absolute_error() -> None:
    me = _module("model_error")
    runs = {
        # three rounds each; a round that did not run the workload does not count
        "no speculation": [_round(1000.0), _round(950.0), _round(1100.0)],
        "static K=2": [_round(1250.0), _round(1200.0), {}, _round(1300.0)],
        "adaptive (peagle)": [_round(1400.0)],
    }
    predicted = {(8, "no speculation", "stationary"): 1050.0, (8, "static K=2", "stationary"): 1125.0,
                 (8, "adaptive (peagle)", "stationary"): None}
    lines, rows = me.compare(_bundle(runs), predicted)
    by = {r.config: r for r in rows}
    # medians 1000 and 1250 -> errors +5% and -10%; adaptive is measured but not a model-backend config
    assert by["no speculation"].median == pytest.approx(1000.0)
    assert by["no speculation"].error == pytest.approx(0.05)
    assert by["static K=2"].measured == pytest.approx([1250.0, 1200.0, 1300.0])
    assert by["static K=2"].error == pytest.approx(-0.10)
    assert "adaptive (peagle)" not in by  # measured, but not a model-backend config: listed as not predicted
    text = "\n".join(lines)
    assert "| 8 | no speculation | stationary | 1050.0 | 1000.0 (950.0-1100.0) | +5.0% |" in text
    assert "| 8 | static K=2 | stationary | 1125.0 | 1250.0 (1200.0-1300.0) | -10.0% |" in text
    assert "not predicted): adaptive (peagle)." in text
    assert "[0.05, 0.1, 0.2]" in text  # the load average is reported
    # median of |+5%| and |-10%| = 7.5%: within the 10% goal
    assert "Median absolute error over 2 predictions: 7.5%" in lines[-1] and "met" in lines[-1]


def test_predictions_come_from_the_profile_alone() -> None:
    me = _module("model_error")
    predicted = me.predict(_bundle({}))
    # No speculation at concurrency 8: 8 tokens per step of the profile's fitted T(8, 0), plus the prompts: each of
    # the 8 requests is replaced once per 48 output tokens (48 steps), and a newcomer's prompt (mean of 22 and 16
    # characters = 19 tokens with the fixtures' byte-level tokenizer) costs 19 x 0.12 ms in a step: 8/48 of that
    # per step.
    prompt_per_step = 19 * 0.12 * 8 / 48
    assert predicted[(8, "no speculation", "stationary")] == pytest.approx(
        8 / (COST.predict(8, 0) + prompt_per_step) * 1000.0)
    # K=2 is priced from the profile's acceptance (AL > 1) and T(8, 2): between 1x and (K+1)x of 8 / T(8, 2).
    k2 = predicted[(8, "static K=2", "stationary")]
    assert k2 is not None
    per_step = 8 / COST.predict(8, 2) * 1000.0
    assert per_step < k2 < 3 * per_step
    assert predicted[(8, "adaptive (peagle)", "stationary")] is None
