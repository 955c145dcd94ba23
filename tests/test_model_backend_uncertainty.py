"""Issue 34: the step-time breakdown, the predicted speedup's range, the tie rule that uses it, and the shape of
P-EAGLE's lead over EAGLE-3 with concurrency (GPT-OSS 20B on B200, as the vLLM P-EAGLE blog published it)."""

from __future__ import annotations

import math

import pytest
from _scripts import load_script

from autotune.backends import ModelBackend, RooflineParams, speedup_log_sigma
from autotune.search.result import tie_margin
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest

calibrate = load_script("benchmarks/calibrate_model.py")


def mt_bench() -> Workload:
    # The calibration's setup: 150-token prompts, 2048 output tokens.
    return Workload("mt-bench", {"mt-bench": (WorkloadRequest(prompt="x" * 600, max_tokens=2048),) * 4})


def p_eagle(k: int, c: int) -> SpecConfig:
    return SpecConfig(method="eagle3", drafter="amazon/GPT-OSS-20B-P-EAGLE", num_speculative_tokens=k,
                      parallel_drafting=True, max_num_seqs=c)


def test_breakdown_sums_to_the_step_time() -> None:
    backend = ModelBackend("gpt-oss-20b", "b200")
    for c in (1, 8, 64):
        m = backend.measure(p_eagle(7, c), mt_bench(), Scenario(concurrency=c))
        parts = m.extra["step_breakdown_ms"]
        assert set(parts) == {"weights", "experts", "attention_kv", "drafter", "fixed_overhead"}
        assert all(v >= 0 for v in parts.values())
        assert sum(parts.values()) == pytest.approx(m.extra["step_ms"])
        assert m.extra["bound"] in ("memory", "compute")


def test_range_contains_the_estimate_and_is_the_residual_spread() -> None:
    sigma = speedup_log_sigma()
    assert 0.0 < sigma < 0.2
    m = ModelBackend("gpt-oss-20b", "b200").measure(p_eagle(7, 8), mt_bench(), Scenario(concurrency=8))
    low, high = m.extra["speedup_range"]
    s = m.speedup_vs_no_spec
    assert low < s < high
    assert high / s == pytest.approx(math.exp(sigma)) and s / low == pytest.approx(math.exp(sigma))


def test_spread_widens_with_the_residuals() -> None:
    # Residuals of 0.05 and 0.10 on the log scale (against a published figure of 1.0): RMS 0.079; doubling them
    # doubles the spread.
    data = {"points": [{"id": "a", "metric": "ratio"}]}
    small = [calibrate.Prediction("a", "w", 1, math.exp(e), 1.0) for e in (0.05, -0.10)]
    large = [calibrate.Prediction("a", "w", 1, math.exp(2 * e), 1.0) for e in (0.05, -0.10)]
    assert calibrate.speedup_sigma(data, small) == pytest.approx(math.sqrt((0.05**2 + 0.10**2) / 2))
    assert calibrate.speedup_sigma(data, large) == pytest.approx(2 * calibrate.speedup_sigma(data, small))


def test_a_win_inside_the_spread_is_a_tie() -> None:
    # A measured trial (no spread) ties only within 0.1%; a predicted one within its one-sigma spread:
    # exp(-0.05) = 0.951, so a config 4% behind the best is tied (the smaller K wins), one 6% behind is not.
    assert tie_margin(0.0) == pytest.approx(1e-3)
    margin = tie_margin(0.05)
    assert margin == pytest.approx(1 - math.exp(-0.05))
    assert 0.04 < margin < 0.06
    assert tie_margin(0.10) > margin


def test_p_eagle_lead_over_eagle3_falls_with_concurrency() -> None:
    # vLLM P-EAGLE blog, GPT-OSS 20B on 1x B200, each head at its best K in {3, 5, 7}: 1.55-1.69x at concurrency 1,
    # 1.05-1.25x at 64, falling in between. Predicted on MT-Bench and HumanEval: never rising by more than 0.01
    # from one concurrency to the next, and down by more than 0.3 from 1 to 64.
    evaluator = calibrate.Evaluator(calibrate.load(), RooflineParams())
    point = {"id": "shape", "model": "gpt-oss-20b", "gpu": "b200"}
    for wl in ("mt-bench", "humaneval"):
        ratios = []
        for c in (1, 2, 4, 8, 16, 32, 64):
            pe, _ = evaluator.best(point, {"drafter": "amazon/GPT-OSS-20B-P-EAGLE", "parallel": True,
                                           "k_choices": [3, 5, 7]}, wl, c)
            e3, _ = evaluator.best(point, {"drafter": "RedHatAI/gpt-oss-20b-speculator.eagle3", "parallel": False,
                                           "k_choices": [3, 5, 7]}, wl, c)
            ratios.append(pe / e3)
        assert all(b <= a + 0.01 for a, b in zip(ratios, ratios[1:], strict=False)), (wl, ratios)
        assert ratios[0] - ratios[-1] > 0.3, (wl, ratios)
