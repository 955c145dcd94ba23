"""Step-cost sources: the roofline adapter agrees with the model backend on every uniform step (so it follows any
recalibration), and prices mixed, trimmed and prefill steps consistently."""

from __future__ import annotations

import pytest

from autotune.backends.model import Calibration, ModelBackend
from autotune.errors import UsageError
from autotune.simulate import Adaptive, FittedStepCost, RooflineStepCost, StepShape, controller_cost_model, gpu_setup
from autotune.simulate._requests import Phase, SimRequest
from autotune.spec import SpecConfig
from policies import StepCostModel

DRAFTER = "amazon/gpt-oss-120b-p-eagle"
CONTEXT = 1280  # a multiple of the adapter's 64-token context bucket, so no rounding


def _config(k: int = 8) -> SpecConfig:
    return SpecConfig(method="eagle3", drafter=DRAFTER, num_speculative_tokens=k, parallel_drafting=True)


@pytest.mark.parametrize("calibration", [None, Calibration(1.4, 2.0, 0.3)])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_uniform_steps_equal_the_model_backend(batch: int, calibration: Calibration | None) -> None:
    backend = ModelBackend("gpt-oss-120b", "h200", calibration=calibration)
    source = RooflineStepCost(backend, _config())
    for k in range(0, 9):
        expected = backend.predict_step_ms(_config(k) if k else SpecConfig(), batch, CONTEXT)
        got = source.step_ms(StepShape(batch, batch * (k + 1), k, CONTEXT))
        assert got == pytest.approx(expected, rel=1e-12), k


def test_mixed_trimmed_and_prefill_steps() -> None:
    backend = ModelBackend("gpt-oss-120b", "b200")
    source = RooflineStepCost(backend, _config())
    b = 8
    k2 = source.step_ms(StepShape(b, b * 3, 8, CONTEXT))
    k3 = source.step_ms(StepShape(b, b * 4, 8, CONTEXT))
    half = source.step_ms(StepShape(b, b * 3 + b // 2, 8, CONTEXT))  # half the requests at 2, half at 3
    assert k2 < half < k3
    # Trimming to depth 0 keeps the drafter and the rejection sampler: dearer than plain decoding.
    trimmed = source.step_ms(StepShape(b, b, 8, CONTEXT))
    plain = source.step_ms(StepShape(b, b, 0, CONTEXT))
    assert trimmed > plain
    # Prompt tokens in the same pass cost something, but less than a separate pass would.
    mixed = source.step_ms(StepShape(b, b * 3, 8, CONTEXT, prefill_tokens=200, prefill_requests=1))
    alone = source.step_ms(StepShape(0, 0, 0, CONTEXT, prefill_tokens=200, prefill_requests=1))
    assert k2 < mixed < k2 + alone


def test_no_speculation_source_never_drafts() -> None:
    backend = ModelBackend("gpt-oss-120b", "h200")
    source = RooflineStepCost(backend, None)
    assert source.step_ms(StepShape(4, 4, 5, CONTEXT)) == source.step_ms(StepShape(4, 4, 0, CONTEXT))


def test_fitted_source_prices_prompt_tokens_like_verified_ones() -> None:
    model = StepCostModel({"base": 2.0, "per_request": 0.5, "per_verified_token": 0.1, "drafter_fixed": 1.0})
    source = FittedStepCost(model, step_overhead_ms=0.25)
    # 3 decoding requests verifying 9 tokens + 1 prefilling request of 20 prompt tokens, drafter ran:
    # 2 + 0.5 * 4 + 0.1 * 29 + 1 = 7.9 ms, plus 0.25 ms host time.
    assert source.step_ms(StepShape(3, 9, 2, 100.0, 20, 1)) == pytest.approx(8.15)
    assert "0.25 ms/step" in source.label


def test_controller_cost_model_fits_the_source_grid() -> None:
    source = FittedStepCost(StepCostModel({"base": 3.0, "per_request": 0.2, "per_verified_token": 0.05,
                                           "drafter_fixed": 1.5, "drafter_per_request": 0.02}))
    fit = controller_cost_model(source, 4, [1, 2, 4, 8], 100.0)
    # The source is itself linear in the model's features, so the fit recovers it.
    assert fit.fit_error()["max_rel_error"] < 1e-6
    assert fit.predict(8, 3, drafter_ran=True) == pytest.approx(source.step_ms(StepShape(8, 32, 4, 100.0)))


def test_gpu_setup_uses_the_catalog_drafter_and_published_acceptance() -> None:
    phases = [Phase("p", (SimRequest(0, "chat", 100, 256), SimRequest(1, "code", 100, 256)))]
    setup = gpu_setup("gpt-oss-120b", "h200", {"w": phases})
    assert setup.drafter == DRAFTER
    assert setup.max_k == 8
    assert "H200" in setup.device
    # Published AL at K=5 is reproduced by the class profiles (MT-Bench 2.68, HumanEval 3.15).
    assert setup.acceptance.acceptance_length("chat", 5) == pytest.approx(2.68, abs=0.01)
    assert setup.acceptance.acceptance_length("code", 5) == pytest.approx(3.15, abs=0.01)
    assert "published" in setup.acceptance.describe()
    # An EAGLE-3 head cannot replay skipped steps: the plugin's workers run a one-slot sync pass, and so does the
    # simulated drafter-width config (policies.plugin.drafter_width, off_steps="sync_pass").
    assert setup.off_steps == "sync_pass"
    (width,) = setup.configs(8, {"chat": 1.0, "code": 1.0}, kinds=["adaptive-width"])
    assert isinstance(width, Adaptive) and width.off_steps == "sync_pass" and not width.skips_drafter
    assert width.start().summary()["off_steps"] == "sync_pass"  # stored with each predicted row (its notes)


def test_a_measured_prompt_price_replaces_the_fits_slope_for_prompt_tokens_only() -> None:
    model = StepCostModel({"base": 2.0, "per_request": 0.5, "per_verified_token": 0.1, "drafter_fixed": 1.0})
    source = FittedStepCost(model, prompt_token_ms=0.04, drafter_token_ms=0.01, idle_drafter_ms=0.3)
    # The step above: 2 + 0.5 * 4 + 0.1 * 9 + 1 = 5.9 ms, its 20 prompt tokens at 0.04 (target) + 0.01 (the drafter
    # reads them) = 1.0 ms.
    assert source.step_ms(StepShape(3, 9, 2, 100.0, 20, 1)) == pytest.approx(6.9)
    # 15 of them deferred by the running drafter (left to a replay): it reads 5.
    assert source.step_ms(StepShape(3, 9, 2, 100.0, 20, 1, deferred_prompt_tokens=15)) == pytest.approx(6.75)
    # Drafter skipped (off-step, prompt left to the replay): 2 + 0.5 * 4 + 0.1 * 3 + 0.04 * 20 + 0.3 = 5.4 ms.
    skipped = StepShape(3, 3, 0, 100.0, 20, 1, drafter_idle=True, drafter_skips_prompt=True)
    assert source.step_ms(skipped) == pytest.approx(5.4)
    # No speculation: 2 + 0.5 * 4 + 0.1 * 3 + 0.04 * 20.
    assert source.step_ms(StepShape(3, 3, 0, 100.0, 20, 1)) == pytest.approx(5.1)
    assert "0.04 ms per prompt token" in source.label
    with pytest.raises(UsageError):
        FittedStepCost(model, prompt_token_ms=-1.0)
