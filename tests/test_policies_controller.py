"""Depth controller: K=0 when speculation does not pay, caps/floors/opt-out, optimality, hysteresis, reaction to an
acceptance drop, exploration, fallback, and the promise that the core imports no vLLM/torch."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from policies import (
    AcceptanceEstimator,
    AcceptanceProfile,
    DepthController,
    RequestView,
    StepCostModel,
    TrackedBatch,
    benchmark_decision_time,
)

# T = 10 ms + 1 ms per verified token, no drafter cost: T(B, K) = 10 + B (K + 1).
LINEAR = StepCostModel({"base": 10.0, "per_verified_token": 1.0})
# The worked example: survival [0.8, 0.6, 0.3] -> AL = [1, 1.8, 2.4, 2.7].
CHAT = AcceptanceProfile(100, (80, 60, 30))


def _estimator(profiles: dict[str, AcceptanceProfile], max_k: int = 3) -> AcceptanceEstimator:
    # A very strong prior pins the estimates to the profiles (shrinkage/floor move them by ~1e-6).
    return AcceptanceEstimator.from_profiles(profiles, max_k=max_k, prior_strength=1e6)


def _controller(
    cost: StepCostModel = LINEAR, profiles: dict | None = None, max_k: int = 3, **options: Any
) -> DepthController:
    options.setdefault("explore_every", 0)
    options.setdefault("drafter_always_runs", False)
    estimator = _estimator(profiles or {"chat": CHAT}, max_k)
    cost = StepCostModel.from_dict(cost.to_dict())  # a copy: learning must not change the shared module constant
    return DepthController(cost, estimator, max_k=max_k, static_k=min(2, max_k), **options)


def _batch(n: int, cls: str = "chat", start: int = 0) -> list[RequestView]:
    return [RequestView(f"r{i}", cls) for i in range(start, start + n)]


def test_large_batch_turns_speculation_off_small_batch_speculates() -> None:
    # B=1: AL/T = 1/11, 1.8/12, 2.4/13, 2.7/14 = .091, .150, .185, .193 -> K=3.
    d = _controller().decide(_batch(1))
    assert d.batch_depth == 3 and d.depths == {"r0": 3}
    assert d.predicted_goodput == pytest.approx(1000 * 2.7 / 14, rel=1e-4)  # tokens/s, predicted
    # B=100: 100/110 = .909 tokens/ms beats 180/210 = .857 and every deeper K: speculation does not pay -> K=0.
    d = _controller().decide(_batch(100))
    assert d.batch_depth == 0 and set(d.depths.values()) == {0}


def test_caps_floors_and_opt_out_are_honoured() -> None:
    special = [
        RequestView("free", "chat"),
        RequestView("capped", "chat", max_k=1),
        RequestView("floored", "chat", min_k=3),
        RequestView("opted-out", "chat", speculate=False),
    ]
    # Small batch. Base (floors): N = 1 + 1 + 2.7 + 1 = 5.7 tokens, V = 7. Adding position 0 for free+capped:
    # 7.3/19 = .384 > 5.7/17 = .335; position 1 for free: 7.9/20 = .395; position 2: 8.2/21 = .390 -> class K=2.
    d = _controller().decide(special)
    assert d.depths == {"free": 2, "capped": 1, "floored": 3, "opted-out": 0}
    assert d.batch_depth == 3
    # Large batch: speculation does not pay (previous test), yet the floor still holds and opt-out stays 0.
    d = _controller().decide(special + _batch(100, start=100))
    assert d.plan["chat"] == 0
    assert [d.depth_for(v) for v in special] == [0, 0, 3, 0]
    assert d.batch_depth == 3


def test_high_acceptance_class_gets_the_deeper_depth() -> None:
    profiles = {
        "code": AcceptanceProfile.from_survival([0.95, 0.9, 0.85, 0.8]),
        "chat": AcceptanceProfile.from_survival([0.5, 0.2, 0.05, 0.01]),
    }
    batch = _batch(10, "code") + _batch(10, "chat", start=10)
    # Sorted gains x 10 requests: code .95, .9, .85, .8, then chat .5. Goodput per prefix (tokens/ms):
    # 20/30 = .667, 29.5/40 = .738, 38.5/50 = .770, 47/60 = .783, 55/70 = .786, + chat: 60/80 = .750.
    d = _controller(profiles=profiles, max_k=4).decide(batch)
    assert d.plan == {"code": 4, "chat": 0}


@pytest.mark.parametrize("always_runs", [False, True])
@pytest.mark.parametrize("sequential", [False, True])
def test_chosen_depths_maximise_predicted_goodput(sequential: bool, always_runs: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(15):
        k_max = int(rng.integers(1, 5))
        coefs = {
            "base": rng.uniform(1, 10),
            "per_request": rng.uniform(0, 0.1),
            "per_verified_token": rng.uniform(0, 0.4),
            "drafter_fixed": rng.uniform(0, 3),
            "drafter_per_request": rng.uniform(0, 0.05),
        }
        if sequential:
            coefs |= {"drafter_per_pass": rng.uniform(0, 2), "drafter_per_pass_req": rng.uniform(0, 0.02)}
        cost = StepCostModel(coefs, sequential=sequential)
        profiles = {
            c: AcceptanceProfile.from_survival(np.cumprod(rng.uniform(0.2, 0.95, k_max)).tolist()) for c in "abc"
        }
        ctl = _controller(cost, profiles, max_k=k_max, drafter_always_runs=always_runs)
        batch = [
            RequestView(
                f"r{i}",
                "abc"[int(rng.integers(3))],
                max_k=int(rng.integers(0, k_max + 1)) if rng.random() < 0.3 else None,
                min_k=int(rng.integers(0, k_max + 1)) if rng.random() < 0.2 else 0,
                speculate=bool(rng.random() > 0.1),
            )
            for i in range(int(rng.integers(1, 40)))
        ]
        decision = ctl.decide(batch)
        classes = sorted({v.cls for v in batch})
        plans = [dict(zip(classes, ks, strict=True)) for ks in itertools.product(range(k_max + 1), repeat=len(classes))]
        best = max(_plan_goodput(ctl, batch, plan) for plan in plans)
        assert decision.predicted_goodput == pytest.approx(_plan_goodput(ctl, batch, dict(decision.plan)), rel=1e-9)
        assert decision.predicted_goodput == pytest.approx(best, rel=1e-9)


def _plan_goodput(ctl: DepthController, batch: list[RequestView], plan: dict[str, int]) -> float:
    """Independent re-implementation of the objective from the public pieces: tokens/s of a per-class plan."""
    k_max = ctl.max_k
    always_runs = ctl.settings.drafter_always_runs
    depths = []
    for v in batch:
        cap = k_max if v.max_k is None else min(v.max_k, k_max)
        depths.append(max(min(v.min_k, cap), min(plan[v.cls], cap)) if v.speculate else 0)
    tokens = sum(ctl.estimator.acceptance_length(v.cls, k) for v, k in zip(batch, depths, strict=True))
    deepest = max(depths)
    ms = ctl.cost_model.predict_tokens(
        len(batch), sum(k + 1 for k in depths), always_runs or deepest > 0, k_max if always_runs else deepest
    )
    return 1000 * tokens / ms


class _NoisyEstimator(AcceptanceEstimator):
    """Returns the given AL tables in turn, one per call: a stand-in for estimation noise."""

    def __init__(self, tables: list[list[float]], max_k: int) -> None:
        super().__init__(max_k)
        self._tables = itertools.cycle(tables)
        self._first: list[float] | None = tables[0]

    def classes(self) -> list[str]:
        return ["chat"]

    def acceptance_length_tables(self, classes: Iterable[str], max_k: int | None = None) -> dict[str, list[float]]:
        return {cls: list(next(self._tables)) for cls in classes}


# Survival [0.8, 0.6, s2] at B=1 with T = 11 + K ms: K=3 beats K=2 iff (2.4 + s2)/14 > 2.4/13, i.e. s2 > 0.1846.
# s2 = 0.195: K=3 wins by 0.40%; s2 = 0.175: K=2 wins by 0.37%. Both far below the 3% hysteresis.
LOW = [1.0, 1.8, 2.4, 2.575]
HIGH = [1.0, 1.8, 2.4, 2.595]


def _run(estimator: AcceptanceEstimator, steps: int, **options) -> tuple[list[int], DepthController]:
    ctl = DepthController(
        LINEAR, estimator, max_k=3, static_k=2, refresh_every=1, explore_every=0, drafter_always_runs=False,
        **options,
    )
    return [ctl.decide(_batch(1)).batch_depth for _ in range(steps)], ctl


def test_hysteresis_prevents_flapping_on_noise() -> None:
    depths, ctl = _run(_NoisyEstimator([LOW, HIGH], 3), 50, hysteresis=0.03, patience=1000)
    assert set(depths) == {2} and ctl.switches == 0
    # Without hysteresis the same noise flips the depth at every step after the first: 49 switches.
    depths, ctl = _run(_NoisyEstimator([LOW, HIGH], 3), 50, hysteresis=0.0, patience=1000)
    assert depths[:4] == [2, 3, 2, 3] and ctl.switches == 49


def test_a_small_persistent_gain_is_taken_after_patience_steps() -> None:
    # First refresh sees LOW (K=2 adopted), then HIGH forever: a 0.4% gain. The same candidate is preferred at
    # decisions 2, 3, 4, 5, 6 -> streak reaches patience=5 at decision 6.
    depths, ctl = _run(_NoisyEstimator([LOW] + [HIGH] * 100, 3), 10, hysteresis=0.03, patience=5)
    assert depths == [2, 2, 2, 2, 2, 3, 3, 3, 3, 3] and ctl.switches == 1


def _simulate(ctl: DepthController, batch: list[RequestView], accept_all: bool) -> int:
    """One engine step: decide, then every request accepts all (or none) of its verified drafts."""
    d = ctl.decide(batch)
    ctl.observe_step([(v.request_id, v.cls, d.depth_for(v), d.depth_for(v) if accept_all else 0) for v in batch])
    return d.batch_depth


def _drop_controller(explore_every: int = 0) -> DepthController:
    cost = StepCostModel({"base": 10.0, "per_verified_token": 0.1, "drafter_fixed": 2.0})
    return DepthController(
        cost, AcceptanceEstimator(4, decay=0.8), max_k=4, static_k=4, hysteresis=0.0, refresh_every=1,
        explore_every=explore_every, drafter_always_runs=False, learn_step_cost=False,
    )


def test_acceptance_drop_moves_depth_down_within_the_forgetting_bound() -> None:
    ctl = _drop_controller()
    batch = _batch(10)
    depths = [_simulate(ctl, batch, accept_all=True) for _ in range(60)]
    # Everything accepted: K=4 gives 10*5/(10 + 5 + 2) = 2.94 tokens/ms vs 10/11 = 0.91 at K=0.
    assert depths[-1] == 4
    # Now every draft is rejected at position 0. Steady state before: 10/(1-0.8) = 50 trials, read as 40 after the
    # step's decay; after t rejection steps the position-0 rate is 40*0.8^t / 40 = 0.8^t (the other positions get no
    # new trials and stay ~1). With T(K) = 13 + K ms and T(0) = 11 ms (no drafter), K=4 pays iff
    # (1 + 4r)/17 > 1/11, i.e. r > 6/44 = 0.136; 0.8^t < 0.136 first holds at t = ln(0.136)/ln(0.8) = 8.9 -> t = 9.
    # (Shrinkage and the 1-trial floor shift r by < 0.01, which moves the crossing by less than one step.)
    after = [_simulate(ctl, batch, accept_all=False) for _ in range(12)]
    first_zero = after.index(0)
    assert 8 <= first_zero <= 10
    assert after[:first_zero] == [4] * first_zero


def test_exploration_keeps_measuring_positions_the_plan_skips() -> None:
    def recovery_steps(explore_every: int) -> int:
        ctl = _drop_controller(explore_every)
        batch = _batch(10)
        for _ in range(60):
            _simulate(ctl, batch, accept_all=True)
        for _ in range(20):
            _simulate(ctl, batch, accept_all=False)
        # Acceptance is back to 100%: count steps until speculation resumes at full depth.
        for step in range(1, 200):
            if _simulate(ctl, batch, accept_all=True) == 4:
                return step
        return 200

    with_exploration = recovery_steps(explore_every=4)
    without = recovery_steps(explore_every=0)
    # Without exploration no draft is verified at K=0, so only the slow drift of the decayed evidence back to the
    # uninformative prior brings speculation back; an explorer every 4 steps measures the recovery directly.
    assert with_exploration < without


def test_explorers_verify_at_their_cap() -> None:
    # explore_budget: the drafter is off at plan 0, and an exploration (3 verified tokens = 3 ms) may use half the
    # 112 ms step here, so every decision may explore (the default 2% would allow one every 1.3 decisions).
    ctl = _controller(explore_every=1, explore_budget=0.5)
    batch = [RequestView("a", "chat"), RequestView("b", "chat", max_k=2), *_batch(100, start=10)]
    d = ctl.decide(batch)
    # Large batch -> plan 0; one request per class below its cap verifies at its cap this step.
    assert d.plan["chat"] == 0 and len(d.explore) == 1
    (explorer,) = d.explore
    view = next(v for v in batch if v.request_id == explorer)
    assert d.depth_for(view) == (view.max_k if view.max_k is not None else 3)
    assert d.batch_depth == d.depth_for(view)


class _BrokenEstimator(AcceptanceEstimator):
    def acceptance_length_tables(self, classes: Iterable[str], max_k: int | None = None) -> dict[str, list[float]]:
        raise RuntimeError("estimator exploded")


def test_internal_errors_are_catchable_and_fallback_uses_static_k() -> None:
    ctl = DepthController(LINEAR, _BrokenEstimator(3), max_k=3, static_k=2)
    batch = [RequestView("a", "chat"), RequestView("b", "chat", max_k=1), RequestView("c", "chat", speculate=False)]
    with pytest.raises(RuntimeError, match="exploded"):
        ctl.decide(batch)
    d = ctl.decide_or_fallback(batch)
    assert d.fallback and "exploded" in d.reason and ctl.fallback_depth == 2
    assert d.depths == {"a": 2, "b": 1, "c": 0} and d.batch_depth == 2


def test_tracked_batch_gives_the_same_decision_as_a_list() -> None:
    views = [RequestView("free", "chat"), RequestView("capped", "chat", max_k=1), *_batch(3, start=5)]
    tracked = TrackedBatch(views)
    assert _controller().decide(tracked).depths == _controller().decide(views).depths
    tracked.remove("capped")
    tracked.add(RequestView("new", "chat", min_k=3))
    assert len(tracked) == 5 and "new" in tracked and "capped" not in tracked
    same_views = [v for v in views if v.request_id != "capped"] + [RequestView("new", "chat", min_k=3)]
    expected = _controller().decide(same_views)
    assert _controller().decide(tracked).depths == expected.depths


def test_uniform_mode_gives_every_class_the_same_depth() -> None:
    profiles = {
        "code": AcceptanceProfile.from_survival([0.95, 0.9, 0.85, 0.8]),
        "chat": AcceptanceProfile.from_survival([0.5, 0.2, 0.05, 0.01]),
    }
    batch = _batch(10, "code") + _batch(10, "chat", start=10)
    # One K for all 20: AL sums 20, 34.5, 45.5, 54, 61 over T = 30, 50, 70, 90, 110 ms -> .667, .690, .650, ... -> K=1.
    d = _controller(profiles=profiles, max_k=4, per_request=False).decide(batch)
    assert d.plan == {"code": 1, "chat": 1}


def test_observe_step_feeds_the_estimator_and_the_cost_model() -> None:
    ctl = _controller(learn_step_cost=True)
    before = ctl.cost_model.predict(2, 3)
    for _ in range(30):
        ctl.observe_step([("a", "math", 3, 3), ("b", "math", 3, 0)], step_ms=50.0)
    assert "math" in ctl.estimator.classes()
    # Half the drafts accept nothing at position 0: the estimate heads to 0.5 (from the 1e6-strong chat prior it
    # shares only through the global pool, which "math" shrinks towards with 2 pseudo-trials).
    assert ctl.estimator.conditional("math")[0] < 0.7
    # Two requests verifying 4 tokens each took 50 ms instead of the predicted 18 ms: the model moves towards 50
    # once the pooled step times reach it (at the next table refresh, when the controller reads it anyway).
    assert before == pytest.approx(18.0)
    ctl.refresh()
    assert ctl.cost_model.predict_tokens(2, 8, drafter_ran=True, draft_depth=3) > 30.0


def test_benchmark_helper_reports_microseconds() -> None:
    assert benchmark_decision_time(batch_size=8, repeats=20) > 0.0


def test_policies_core_imports_no_vllm_or_torch() -> None:
    code = (
        "import sys, policies; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'transformers')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_class_absent_for_a_long_phase_returns_at_its_learnt_depth() -> None:
    """docs/benchmarks/runtime.md: after a long predictable phase, entropic requests were verified at depth 4 for
    hundreds of drafts, because every engine step aged the entropic estimate back to the all-class one. Only the
    classes in a step age now, so entropic comes back at the depth it had earned."""
    ctl = _controller(profiles={"chat": CHAT}, max_k=3, refresh_every=1)
    # Entropic accepts position 0 once in 10 drafts: at B=4, K=0 gives 4 tokens in 10 + 4 = 14 ms (.286/ms) and
    # K=1 gives 4 * 1.1 = 4.4 tokens in 10 + 8 = 18 ms (.244/ms): depth 0.
    for _ in range(300):
        ctl.observe_step([(f"e{i}", "entropic", 3, 1 if i == 0 else 0) for i in range(10)])
    entropic = _batch(4, "entropic")
    before = ctl.decide(entropic).plan["entropic"]
    for _ in range(3000):  # a long phase without entropic requests: predictable accepts everything
        ctl.observe_step([(f"p{i}", "predictable", 3, 3) for i in range(4)])
    assert ctl.decide(_batch(4, "predictable")).plan["predictable"] == 3
    assert before == 0 and ctl.decide(entropic).plan["entropic"] == before


# The quiet runtime benchmark (docs/benchmarks/runtime.md, plugin statistics step_costs), batch 1, drafter width live:
# median ms by (verified tokens V, drafter ran in the step).
BENCH_STEP_MS = {(1, False): 3.70, (1, True): 6.31, (5, False): 4.45, (5, True): 6.27}
# The step-cost model and class profiles the benchmark's plugin config carried (fit on the offline profile).
BENCH_COST = StepCostModel({
    "base": 3.0624, "per_request": 0.0608, "per_verified_token": 0.1519, "drafter_fixed": 2.2772,
    "drafter_per_request": 0.2662,
})
BENCH_PROFILES = {
    "entropic": AcceptanceProfile(1562, (361, 0, 0, 0)),  # AL(4) = 1.23
    "predictable": AcceptanceProfile(551, (546, 507, 500, 489)),  # AL(4) = 4.71
}


def _bench_controller(**options: Any) -> DepthController:
    estimator = AcceptanceEstimator.from_profiles(BENCH_PROFILES, max_k=4, prior_strength=20.0, decay=0.98)
    cost = StepCostModel.from_dict(BENCH_COST.to_dict())
    return DepthController(cost, estimator, max_k=4, static_k=4, drafter_always_runs=False, **options)


def _serve_alone(ctl: DepthController, view: RequestView, steps: int, accept: int) -> list[int]:
    """One request served alone for ``steps`` decode steps, as the plugin drives the controller: the depth decided at
    step n is drafted at n (so it decides whether the drafter runs at n) and verified at n + 1. Returns the depths."""
    batch = TrackedBatch([view])
    verified, depths = 0, []
    for _ in range(steps):
        drafting = ctl.decide(batch).depth_for(view)
        ms = BENCH_STEP_MS[(1 if verified == 0 else 5, drafting > 0)]
        ctl.observe_step([(view.request_id, view.cls, verified, min(accept, verified))], ms)
        depths.append(drafting)
        verified = drafting
    return depths


def test_a_long_single_shape_stretch_does_not_make_the_drafter_look_free_at_c1() -> None:
    """Benchmark replay (issue 10, c=1): after 12 predictable requests at depth 4, the next entropic request was
    verified at depth 4 for its first 13+ steps. The step-cost model's online fit, fed one shape for ~150 steps (and
    steps labelled by the depth verified rather than the drafter's width), predicted an off-step at 6.7 ms where
    3.7 ms were measured. Entropic at depth 4 yields 1.23 tokens in 6.27 ms (0.196/ms) against 1 token in 3.70 ms
    (0.270/ms) with the drafter off, so only explorations (every 16 steps) may verify it."""
    ctl = _bench_controller()
    for i in range(12):
        depths = _serve_alone(ctl, RequestView(f"p{i}", "predictable"), 12, accept=4)
        assert depths[1:] == [4] * 11
    depths = _serve_alone(ctl, RequestView("e0", "entropic"), 48, accept=0)
    assert sum(d > 0 for d in depths) <= 3  # 48 steps, one exploration per 16
    # The model still prices the measured shapes: off-step and depth-4 step at batch 1.
    assert ctl.cost_model.predict_tokens(1, 1, False) == pytest.approx(3.70, rel=0.05)
    assert ctl.cost_model.predict_tokens(1, 5, True, 4) == pytest.approx(6.27, rel=0.05)


def test_step_times_are_labelled_by_the_drafters_width_not_the_verified_depth() -> None:
    """A step that verifies 4 drafts but drafts none (the last step before an off stretch) ran without the drafter:
    4.45 ms measured. Labelled by its verified depth it would teach the model a 4.45 ms drafter step."""
    ctl = _bench_controller(refresh_every=1, explore_every=0)
    for _ in range(200):
        ctl.observe_step([("a", "predictable", 4, 4)], step_ms=4.45, drafting_depth=0)
        ctl.observe_step([("a", "predictable", 0, 0)], step_ms=6.31, drafting_depth=4)
    ctl.refresh()
    assert ctl.cost_model.predict_tokens(1, 5, False) == pytest.approx(4.45, rel=0.02)
    assert ctl.cost_model.predict_tokens(1, 1, True, 4) == pytest.approx(6.31, rel=0.02)
    # Without drafting_depth, the drafter's width is the controller's own last decision (synchronous scheduling:
    # decide at schedule(n), observe after step n): entropic alone is decided at depth 0, so its steps are off-steps.
    ctl = _bench_controller(refresh_every=1, explore_every=0)
    batch = [RequestView("b", "entropic")]
    for _ in range(200):
        assert ctl.decide(batch).batch_depth == 0
        ctl.observe_step([("b", "entropic", 4, 0)], step_ms=4.45)
    ctl.refresh()
    assert ctl.cost_model.predict_tokens(1, 5, False) == pytest.approx(4.45, rel=0.02)


# Drafter-width control (drafter_always_runs=False), max_k=1, B=1: T(off) = 10 + 1 = 11 ms; T(K=1) = 10 + 2 + 4 (one
# drafter pass) = 16 ms. Turning the idle drafter on costs one more drafter pass (4 ms) spread over a drafting run.
SWITCH = StepCostModel({"base": 10.0, "per_verified_token": 1.0, "drafter_fixed": 4.0})


def _switch_decisions(al1: float, **options: Any) -> list[int]:
    """Off first (AL(1) = 1.0), then the estimate moves to AL(1) = al1: depths of 20 decisions at B=1."""
    estimator = _NoisyEstimator([[1.0, 1.0]] + [[1.0, al1]] * 100, max_k=1)
    ctl = DepthController(SWITCH, estimator, max_k=1, static_k=1, refresh_every=1, explore_every=0,
                          drafter_always_runs=False, learn_step_cost=False, patience=1000, **options)
    return [ctl.decide(_batch(1)).batch_depth for _ in range(20)]


def test_turning_the_drafter_on_must_also_pay_its_catch_up_pass() -> None:
    # Gain of K=1 over off: (al1 / 16) / (1 / 11) - 1. Needed: hysteresis 3% + 4 ms / (run_steps 16 * 16 ms) = 4.56%.
    al_4pct = 1.04 * 16 / 11  # a 4% gain: above the hysteresis, below hysteresis + catch-up
    assert set(_switch_decisions(al_4pct)) == {0}
    al_10pct = 1.10 * 16 / 11
    assert _switch_decisions(al_10pct)[1:] == [1] * 19
    # With long drafting runs the catch-up pass costs next to nothing per step: the 4% gain is taken.
    assert _switch_decisions(al_4pct, run_steps=1e6)[1:] == [1] * 19


def test_exploring_while_the_drafter_is_off_stays_within_its_budget() -> None:
    def explorations(**options: Any) -> int:
        ctl = DepthController(SWITCH, _estimator({"chat": AcceptanceProfile(100, (0,))}, max_k=1), max_k=1,
                              static_k=1, refresh_every=1, drafter_always_runs=False, learn_step_cost=False,
                              explore_every=4, **options)
        return sum(bool(ctl.decide(_batch(1)).explore) for _ in range(100))

    # An exploration while off costs two drafter passes + 1 verified token = 9 ms; 2% of the 11 ms off-step allows
    # one every 9 / 0.22 = 40.9 decisions: at decisions 41 and 82 (explore_every=4 alone would give 25).
    assert explorations() == 2
    assert explorations(explore_budget=0.0) == 0
    assert explorations(explore_budget=0.5) == 25  # a generous budget: explore_every is the floor


def test_steps_far_slower_than_predicted_are_not_learnt_unless_they_are_the_majority() -> None:
    # LINEAR predicts 10 + 8 = 18 ms for 2 requests verifying 4 tokens each. Warm-up-like steps take 20x that.
    def learnt(slow_steps: int, normal_steps: int) -> float:
        ctl = _controller(learn_step_cost=True)
        ctl.decide(_batch(1))  # as in the engine, the first decision comes before any observed step
        for _ in range(slow_steps):
            ctl.observe_step([("a", "chat", 3, 3), ("b", "chat", 3, 0)], step_ms=360.0)
        for _ in range(normal_steps):
            ctl.observe_step([("a", "chat", 3, 3)], step_ms=14.0)  # 1 request, 4 tokens: 10 + 4 = 14 ms, as predicted
        ctl.refresh()
        # The steps are labelled with the last decision's drafting width (K=3 at B=1 with LINEAR: the drafter ran).
        return ctl.cost_model.predict_tokens(2, 8, drafter_ran=True, draft_depth=3)

    assert learnt(5, 30) == pytest.approx(18.0, rel=0.01)  # a minority of outliers: left out
    # Every pooled step that slow: the model is what is wrong, and it learns them (relative errors weigh a step 20x
    # slower than predicted 1/400 as much, so one refresh moves it only part of the way).
    assert learnt(30, 0) > 1.5 * 18.0


def test_a_profiled_class_without_evidence_returns_to_its_profile_not_to_the_pool() -> None:
    # "bad" accepts 10% at position 0 (profile), "good" 90%; "bad" then goes unmeasured (depth 0) while "good"
    # keeps feeding the pooled estimate. Its evidence decays, but the anchor keeps it near its profile.
    est = AcceptanceEstimator.from_profiles(
        {"bad": AcceptanceProfile(100, (10, 0)), "good": AcceptanceProfile(100, (90, 81))}, prior_strength=20,
        decay=0.9)
    for _ in range(200):
        est.observe_many("good", [2] * 8, [2] * 8)
        est.advance(present={"bad", "good"})
    # The anchor: 5 trials at 0.1 against 2 pseudo-trials of shrinkage towards the pooled ~0.99: (0.5 + 2 g) / 7.
    assert est.conditional("bad")[0] == pytest.approx((0.5 + 2 * est.global_conditional()[0]) / 7, abs=0.01)
    assert est.conditional("bad")[0] < 0.4  # without the anchor it would be the pooled ~0.99


def test_the_measured_catch_up_of_an_exploration_sets_how_often_it_explores() -> None:
    # The prior prices an exploration while off at 9 ms (see above): one every 40.9 decisions. The engine measures
    # the step that turned the drafter on at 35 ms where a drafting step of its shape is predicted at 15 ms (B=1,
    # 1 verified token, one drafter pass): 20 ms of catch-up for one request. An exploration then costs a drafter
    # pass (4) + 20 + 1 verified token = 25 ms, one every 25 / 0.22 = 113.6 decisions: at 41, 155 and 269.
    ctl = DepthController(SWITCH, _estimator({"chat": AcceptanceProfile(100, (0,))}, max_k=1), max_k=1,
                          static_k=1, refresh_every=1, drafter_always_runs=False, learn_step_cost=False,
                          explore_every=4)
    explored = []
    for i in range(1, 301):
        d = ctl.decide(_batch(1))
        if d.explore:
            explored.append(i)
        ctl.observe_step([("r0", "chat", 0, 0)], step_ms=35.0 if d.batch_depth else 11.0,
                         drafting_depth=d.batch_depth)
    assert ctl.catch_up_ms == pytest.approx(20.0)
    assert explored == [41, 155, 269]


def test_a_churning_batch_gets_the_decisions_of_a_controller_that_always_reoptimises() -> None:
    # The controller reuses its last optimum while the batch's cohorts, the tables and the settings are unchanged;
    # reuse must never change a decision. Replacements keep or change the composition at random, and learning
    # (every step observed, tables refreshed every 4 decisions, acceptance flipping between classes) changes the
    # tables in between.
    class AlwaysReoptimises(DepthController):
        def _optimum(self, t: Any, counts: Any, size: int) -> dict[str, int]:
            return self._best_per_request(t, counts, size)

    profiles = {"chat": CHAT, "code": AcceptanceProfile(100, (95, 90, 85)), "math": AcceptanceProfile(100, (30, 5, 1))}

    def build(cls: type[DepthController]) -> DepthController:
        estimator = AcceptanceEstimator.from_profiles(profiles, max_k=3, prior_strength=20.0)
        cost = StepCostModel.from_dict(LINEAR.to_dict())
        return cls(cost, estimator, max_k=3, static_k=2, refresh_every=4, explore_every=0, drafter_always_runs=False)

    rng = np.random.default_rng(5)
    controllers = [build(DepthController), build(AlwaysReoptimises)]
    batches = [TrackedBatch(), TrackedBatch()]
    live: list[RequestView] = []
    kinds = [("chat", None), ("code", None), ("code", 1), ("math", None)]
    for step in range(400):
        if not live or rng.random() < 0.4:
            if live and rng.random() < 0.8:
                gone = live.pop(int(rng.integers(len(live))))
                for b in batches:
                    b.remove(gone.request_id)
            while len(live) < 6:
                cls, cap = kinds[int(rng.integers(len(kinds)))]
                view = RequestView(f"s{step}-{len(live)}", cls, max_k=cap)
                live.append(view)
                for b in batches:
                    b.add(view)
        decisions = [c.decide(b) for c, b in zip(controllers, batches, strict=True)]
        assert decisions[0].depths == decisions[1].depths, step
        assert dict(decisions[0].plan) == dict(decisions[1].plan), step
        good = "code" if step < 200 else "math"  # acceptance flips half-way: the tables (and the optimum) move
        results = [(v.request_id, v.cls, d, d if v.cls == good else int(rng.integers(d + 1) // 2)) for v, d in
                   ((v, decisions[0].depth_for(v)) for v in live)]
        step_ms = 10.0 + sum(d + 1 for _r, _c, d, _a in results) * float(rng.uniform(0.9, 1.1))
        for c in controllers:
            c.observe_step(results, step_ms=step_ms)
    assert controllers[0].switches == controllers[1].switches > 0
