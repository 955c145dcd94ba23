"""CUDA-graph modes priced: which steps replay FULL graphs, the PIECEWISE penalty in the step-cost model (prior,
fit, online), and a controller that lowers depth only where the saving beats it. Pure: plain numbers."""

from __future__ import annotations

import pytest

from policies import AcceptanceEstimator, AcceptanceProfile, DepthController, RequestView, StepCostModel, StepSample
from policies._graphs import PIECEWISE_PENALTY_SHARE, full_graph_depth, piecewise_penalty_ms, step_graph_mode

# T = 10 ms + 1 ms per verified token (as tests/test_policies_controller.py), AL = [1, 1.8, 2.4, 2.7].
CHAT = AcceptanceProfile(100, (80, 60, 30))


def test_only_the_uniform_step_at_the_launch_depth_replays_full_graphs() -> None:
    assert full_graph_depth("FULL_AND_PIECEWISE", 4) == 4
    assert full_graph_depth("FULL_AND_PIECEWISE", 0) == 0  # a plain engine: one-token decode steps are uniform
    assert full_graph_depth("FULL_AND_PIECEWISE", 4, schedule=True) is None  # vLLM forces PIECEWISE
    assert full_graph_depth("NONE", 4) is None and full_graph_depth(None, 4) is None
    # 8 requests at K=4 verify 8 * 5 = 40 tokens: FULL; one of them at K=2: 38 tokens, PIECEWISE.
    assert step_graph_mode("FULL_AND_PIECEWISE", 4, 8, 40) == "FULL"
    assert step_graph_mode("FULL_AND_PIECEWISE", 4, 8, 38) == "PIECEWISE"
    assert step_graph_mode("FULL_AND_PIECEWISE", 4, 8, 8) == "PIECEWISE"  # an off-step of a speculative launch
    assert step_graph_mode("FULL_AND_PIECEWISE", 4, 8, 40, prompt_tokens=100) == "PIECEWISE"
    assert step_graph_mode("FULL_AND_PIECEWISE", None, 8, 40) == "PIECEWISE"
    assert step_graph_mode("NONE", 4, 8, 40) == "NONE"


def test_the_penalty_prior_is_the_published_downgrade() -> None:
    # vLLM #49548: 59.6 tok/s FULL against 50.0 PIECEWISE, single stream -> a PIECEWISE step is 1.192x the FULL one.
    assert PIECEWISE_PENALTY_SHARE == pytest.approx(0.192, abs=5e-4)
    assert piecewise_penalty_ms(6.65) == pytest.approx(6.65 * 0.192, rel=2e-3)
    with pytest.raises(ValueError):
        piecewise_penalty_ms(0.0)


def test_a_launch_with_full_graphs_prices_every_other_step_piecewise() -> None:
    model = StepCostModel({"base": 10.0, "per_verified_token": 1.0, "piecewise": 2.0}, full_graph_depth=3)
    assert model.predict(1, 3) == pytest.approx(14.0)  # uniform at K=3: FULL, 10 + 4
    assert model.predict(1, 2) == pytest.approx(15.0)  # 10 + 3 + 2 (PIECEWISE)
    assert model.predict(1, 2, piecewise=False) == pytest.approx(13.0)  # a fresh launch at static K=2
    assert model.predict_tokens(2, 7, True, 3) == pytest.approx(19.0)  # depths 3 and 2: 10 + 7 + 2
    cpu = StepCostModel({"base": 10.0, "per_verified_token": 1.0, "piecewise": 2.0})
    assert cpu.predict(1, 2) == pytest.approx(13.0)  # no graphs: no step pays it
    again = StepCostModel.from_dict(model.to_dict())
    assert again.full_graph_depth == 3 and again.predict(1, 2) == pytest.approx(15.0)


def test_a_fit_without_piecewise_steps_takes_the_prior_and_one_with_them_measures_it() -> None:
    truth = {"base": 5.0, "per_request": 0.5, "per_verified_token": 0.25, "drafter_fixed": 1.0}
    static = [StepSample(b, k, 5.0 + 0.5 * b + 0.25 * b * (k + 1) + (1.0 if k else 0.0), piecewise=False)
              for b in (1, 4, 16) for k in (0, 1, 2, 4)]
    prior = StepCostModel.fit(static, full_graph_depth=4)
    # The single-stream FULL step at K=4: 5 + 0.5 + 0.25 * 5 + 1 = 7.75 ms -> 0.192 * 7.75 = 1.49 ms.
    assert prior.coefficients["piecewise"] == pytest.approx(PIECEWISE_PENALTY_SHARE * 7.75, rel=1e-3)
    # An in-launch profile on a GPU: K=4 steps FULL, lower depths PIECEWISE (3 ms more), derived from the launch.
    # The drafter runs in every step of the launch (depth applied by trimming), so drafter_fixed is paid at K=0 too.
    launch = [StepSample(b, k, 5.0 + 0.5 * b + 0.25 * b * (k + 1) + 1.0 + (0.0 if k == 4 else 3.0), drafter_ran=True)
              for b in (1, 4, 16) for k in (0, 1, 2, 4)]
    baseline = [StepSample(b, 0, 5.0 + 0.5 * b + 0.25 * b, piecewise=False) for b in (1, 4, 16)]
    fitted = StepCostModel.fit(launch + baseline, full_graph_depth=4)
    assert fitted.coefficients["piecewise"] == pytest.approx(3.0, rel=1e-6)
    for name, value in truth.items():
        assert fitted.coefficients[name] == pytest.approx(value, rel=1e-6)
    # A CPU fit (no graphs) keeps the feature at 0.
    assert StepCostModel.fit(static).coefficients["piecewise"] == 0.0
    assert fitted.with_graphs(None).predict(1, 2) == pytest.approx(fitted.predict(1, 2, piecewise=False))
    assert prior.with_graphs(2).coefficients["piecewise"] == prior.coefficients["piecewise"]  # kept, not re-primed


def test_the_plugin_learns_the_penalty_online() -> None:
    # Prior 1 ms; the GPU's PIECEWISE steps take 4 ms more than FULL ones: updates move the coefficient to it.
    model = StepCostModel({"base": 10.0, "per_verified_token": 1.0, "piecewise": 1.0}, full_graph_depth=3)
    for _ in range(30):
        for b in (1, 4, 8):
            model.update(StepSample(b, 3, 10.0 + 4 * b, n=10))  # FULL
            model.update(StepSample(b, 1, 10.0 + 2 * b + 4.0, n=10, drafter_ran=True))  # PIECEWISE
    assert model.coefficients["piecewise"] == pytest.approx(4.0, rel=0.05)


def _decide(piecewise_ms: float, per_request: bool, size: int) -> int:
    cost = StepCostModel({"base": 10.0, "per_verified_token": 1.0, "piecewise": piecewise_ms}, full_graph_depth=3)
    estimator = AcceptanceEstimator.from_profiles({"chat": CHAT}, max_k=3, prior_strength=1e6)
    controller = DepthController(cost, estimator, max_k=3, static_k=2, explore_every=0, drafter_always_runs=False,
                                 per_request=per_request)
    return controller.decide([RequestView(f"r{i}", "chat") for i in range(size)]).plan["chat"]


@pytest.mark.parametrize("per_request", [True, False])
def test_the_controller_lowers_depth_only_where_the_saving_beats_the_penalty(per_request: bool) -> None:
    # B = 100, T = 10 + V (+ p when not all at K=3). Goodput N/T, N = 100 AL(K), V = 100 (K + 1):
    #   K=3 (FULL): 270/410 = .659. Without a penalty K=0 wins: 100/110 = .909.
    #   p = 50: K=0 100/160 = .625, K=1 180/260 = .692, K=2 240/360 = .667 -> K=1, the saving still beats it.
    #   p = 100: K=0 .476, K=1 180/310 = .581, K=2 240/410 = .585 -> K=3 keeps the FULL graphs.
    assert _decide(0.0, per_request, 100) == 0
    assert _decide(50.0, per_request, 100) == 1
    assert _decide(100.0, per_request, 100) == 3
    # B = 1: K=3 is best anyway (2.7/14 = .193 against 2.4/13 = .185 with no penalty).
    assert _decide(100.0, per_request, 1) == 3
