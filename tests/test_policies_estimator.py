"""Live acceptance estimator: what one observation means, forgetting, priors from profiles and the global fallback."""

from __future__ import annotations

import numpy as np
import pytest

from policies import AcceptanceEstimator, AcceptanceProfile


def test_observations_estimate_conditional_rates_per_position() -> None:
    est = AcceptanceEstimator(3, decay=1.0)  # no forgetting
    # 1000 requests drafted K=3: 600 accepted all 3, 200 accepted 1, 200 accepted 0.
    for _ in range(600):
        est.observe("code", 3, 3)
    for _ in range(200):
        est.observe("code", 3, 1)
    for _ in range(200):
        est.observe("code", 3, 0)
    # Position 0: 1000 trials, 800 accepted -> 0.8. Position 1: reached by 800, accepted by 600 -> 0.75.
    # Position 2: reached by 600, all accepted -> 1.0. The shrinkage/floor pseudo-counts (2 + 1 trials) move these
    # by at most 3/600 = 0.005.
    assert est.conditional("code").tolist() == pytest.approx([0.8, 0.75, 1.0], abs=0.005)
    # survival = running product: 0.8, 0.6, 0.6 -> AL(3) = 1 + 2.0 = 3.0.
    assert est.survival("code").tolist() == pytest.approx([0.8, 0.6, 0.6], abs=0.01)
    assert est.acceptance_length("code", 3) == pytest.approx(3.0, abs=0.02)


def test_a_rejection_judges_only_positions_up_to_the_first_failure() -> None:
    est = AcceptanceEstimator(4, decay=1.0)
    for _ in range(500):
        est.observe("c", 4, 1)  # position 0 accepted, position 1 rejected, positions 2-3 never judged
    rates = est.conditional("c")
    assert rates[0] == pytest.approx(1.0, abs=0.005)
    assert rates[1] == pytest.approx(0.0, abs=0.005)
    # Unjudged positions carry no data: they sit at the uninformative 0.5 of the global floor (scaled by the class's
    # ratio to the global rate at position 0: (500 + 2 g0) / 502 / g0 with g0 = 500.5 / 501, i.e. 1.001).
    assert rates[2:].tolist() == pytest.approx([0.5, 0.5], abs=0.001)


def test_a_class_that_rarely_accepts_is_not_lifted_by_the_pooled_rate_where_it_has_no_trials() -> None:
    # The runtime benchmark's classes: predictable accepts ~0.95 at every position; entropic 0.25 at position 0 and
    # never beyond, so only a quarter of its drafts ever reach position 1 and none reach position 2.
    est = AcceptanceEstimator(4, decay=1.0)
    est.observe_many("predictable", [4] * 400, [4] * 400)
    est.observe_many("entropic", [4] * 40, [1] * 10 + [0] * 30)
    g = est.global_conditional()
    rates = est.conditional("entropic")
    # Position 0: (10 + 2 g0) / 42 with g0 = (410 + 0.5) / 441 = 0.931 -> 0.282; position 1: 10 trials, 0 accepted.
    assert rates[0] == pytest.approx((10 + 2 * g[0]) / 42)
    assert rates[1] < 0.1
    # Positions 2-3: no trials. Shrunk towards the pooled rate (~1.0) they would read 0.999 (and position 1, with 2
    # pseudo-trials at 0.974 against 10 failures, 0.162): AL(4) = 1.42. Scaled by the class's own ratio at position 0
    # (0.282 / 0.931 = 0.30), they read 0.30 (position 1: 0.049) and AL(4) = 1.30, next to the measured 1.25.
    assert rates[2:].tolist() == pytest.approx((g[2:] * rates[0] / g[0]).tolist())
    assert max(rates[2:]) < 0.31
    assert est.acceptance_length("entropic", 4) == pytest.approx(1.30, abs=0.01)


def test_vectorised_observe_many_equals_repeated_observe() -> None:
    rng = np.random.default_rng(0)
    drafted = rng.integers(0, 6, 400)
    accepted = np.array([rng.integers(0, d + 1) for d in drafted])
    one, many = AcceptanceEstimator(5), AcceptanceEstimator(5)
    for d, a in zip(drafted, accepted, strict=True):
        one.observe("x", int(d), int(a))
    many.observe_many("x", drafted, accepted)
    np.testing.assert_allclose(one.conditional("x"), many.conditional("x"), rtol=1e-12)


def test_forgetting_weighs_old_steps_by_decay_per_step() -> None:
    est = AcceptanceEstimator(1, decay=0.5)
    for _ in range(100):
        est.observe("c", 1, 1)
    est.advance()  # one step later the 100 successes weigh 0.5 -> 50 trials, 50 successes
    for _ in range(100):
        est.observe("c", 1, 0)
    # 50 successes out of 150 trials = 1/3 (shrinkage towards the global estimate, which is the same class, keeps it).
    assert est.conditional("c")[0] == pytest.approx(1 / 3, abs=0.005)
    # Uniform decay weakens the evidence without moving the estimate, as long as the decayed counts stay large next to
    # the fixed 1-trial floor: two steps later 37.5 trials remain, global = (12.5 + 0.5) / 38.5 = 0.338,
    # class = (12.5 + 2 * 0.338) / 39.5 = 0.334.
    est.advance(2)
    assert est.effective_trials("c") == pytest.approx(150 * 0.5**2)
    assert est.conditional("c")[0] == pytest.approx(1 / 3, abs=0.005)


def test_unseen_class_falls_back_to_the_global_estimate() -> None:
    est = AcceptanceEstimator(2, decay=1.0)
    est.observe_many("code", [2] * 300, [2] * 300)
    est.observe_many("chat", [2] * 100, [0] * 100)
    # Pooled position 0: 300 of 400 accepted = 0.75.
    assert est.global_conditional()[0] == pytest.approx(0.75, abs=0.005)
    np.testing.assert_array_equal(est.conditional("never-seen"), est.global_conditional())
    assert est.effective_trials("never-seen") == 0.0
    # A class seen once leans on the global estimate (2 pseudo-trials of shrinkage vs 1 real one): (1 + 2*0.75) / 3.
    est.observe("rare", 2, 2)
    assert est.conditional("rare")[0] == pytest.approx((1 + 2 * est.global_conditional()[0]) / 3)


def test_profiles_seed_the_prior_and_data_take_over() -> None:
    code = AcceptanceProfile(100, (80, 60, 30))  # conditional rates 0.8, 0.75, 0.5
    est = AcceptanceEstimator.from_profiles({"code": code}, prior_strength=20, decay=0.9)
    # Before any data: class = (20 a + 2 g) / 22 with g = (20 a + 0.5) / 21 (global = the same prior + floor).
    # For a = 0.8: g = 16.5/21 = 0.786, class = (16 + 1.571) / 22 = 0.799.
    assert est.conditional("code").tolist() == pytest.approx([0.8, 0.75, 0.5], abs=0.01)
    assert est.acceptance_length("code", 3) == pytest.approx(code.acceptance_length(3), abs=0.03)
    # Then 50 steps of 20 requests that accept nothing: the decaying prior is gone (0.9^50 ~ 0.005) and the data
    # hold 20 * (1 - 0.9^50) / 0.1 = 199 trials; the anchor (a quarter of the prior: 5 trials at 0.8) stays:
    # (4 + 2 g) / (199 + 5 + 2) with a global rate g near 0 (it pools the same data) -> ~0.02.
    for _ in range(50):
        est.observe_many("code", [3] * 20, [0] * 20)
        est.advance()
    assert est.conditional("code")[0] == pytest.approx(4 / (199 + 5 + 2), abs=0.005)


def test_invalid_observations_are_rejected() -> None:
    est = AcceptanceEstimator(4)
    with pytest.raises(ValueError, match=r"num_accepted must be in \[0, num_drafted=2\]"):
        est.observe("c", 2, 3)
    with pytest.raises(ValueError, match="max_k >= the drafter's K"):
        est.observe("c", 5, 0)
    with pytest.raises(ValueError, match="num_drafted must be in"):
        est.observe_many("c", [1, 6], [0, 0])
    with pytest.raises(ValueError, match="decay must be in"):
        AcceptanceEstimator(4, decay=1.5)


def test_per_step_counts_weigh_exactly_as_immediate_observations() -> None:
    """`observe_counts` (what the plugin feeds once per step and class) defers the work to the next read; the
    weights must come out as if every request had been observed at once and aged step by step."""
    rng = np.random.default_rng(1)
    eager, deferred = AcceptanceEstimator(4, decay=0.9), AcceptanceEstimator(4, decay=0.9)
    for step in range(150):  # longer than the deferral bound (64 steps), so the forced add runs too
        outcomes: dict[tuple[int, int], int] = {}
        for _ in range(int(rng.integers(1, 9))):
            d = int(rng.integers(0, 5))
            a = int(rng.integers(0, d + 1))
            eager.observe("x", d, a)
            outcomes[(d, a)] = outcomes.get((d, a), 0) + 1
        deferred.observe_counts("x", outcomes)
        eager.advance()
        deferred.advance(present=["x"])
        if step % 37 == 0:  # a read in between adds what is pending
            np.testing.assert_allclose(deferred.conditional("x"), eager.conditional("x"), rtol=1e-9)
    np.testing.assert_allclose(deferred.conditional("x"), eager.conditional("x"), rtol=1e-9)
    assert deferred.effective_trials("x") == pytest.approx(eager.effective_trials("x"), rel=1e-9)


def test_a_class_absent_from_the_steps_keeps_its_estimate() -> None:
    """docs/benchmarks/runtime.md: after a long phase of other classes, a class came back at the all-class estimate
    (every engine step aged it). Ageing only the classes present keeps what was learnt about it."""
    est = AcceptanceEstimator(2, decay=0.98)
    for _ in range(200):
        est.observe_counts("entropic", {(2, 0): 8})  # position 0 almost never accepted
        est.advance(present=["entropic"])
    learnt = est.conditional("entropic")[0]
    assert learnt < 0.05
    for _ in range(2000):  # a long predictable phase: entropic is absent from every step
        est.observe_counts("predictable", {(2, 2): 8})
        est.advance(present=["predictable"])
    assert est.conditional("entropic")[0] == pytest.approx(learnt, abs=0.01)  # unchanged (the global pool moved)
    assert est.global_conditional()[0] > 0.9
    # Ageing every class (advance() without present) forgets it: 0.98^2000 ~ 3e-18 of its counts remain, so it
    # falls back to the global estimate (itself aged to its 0.5 floor).
    est.advance(2000)
    assert est.conditional("entropic")[0] == pytest.approx(est.global_conditional()[0]) == pytest.approx(0.5)
