"""The step-cost model's plain-float solvers agree with numpy's eigendecomposition and scipy's NNLS."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from policies._small_linalg import nonnegative_minimiser, residual_sum_of_squares


def _design(rng: np.random.Generator, rows: int, collinear: bool) -> np.ndarray:
    """Step-cost-like feature rows (1, B, V, ran, ran*B), optionally at one batch size (B = 8 * the constant column,
    the drafter always on: a rank-2 design, as an engine at a fixed concurrency produces)."""
    b = np.full(rows, 8.0) if collinear else rng.integers(1, 65, rows).astype(float)
    v = b * rng.integers(1, 6, rows)
    ran = np.ones(rows) if collinear else rng.integers(0, 2, rows).astype(float)
    return np.stack([np.ones(rows), b, v, ran, ran * b], axis=1)


def _reference_rss(x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    theta, _res, rank, _sv = np.linalg.lstsq(x, y, rcond=None)
    return float(np.sum((x @ theta - y) ** 2)), int(rank)


@pytest.mark.parametrize("collinear", [False, True])
def test_residual_sum_of_squares_is_the_least_squares_residual_on_the_spanned_directions(collinear: bool) -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = _design(rng, 30, collinear)
        y = x @ rng.uniform(0, 1, 5) + rng.normal(0, 0.5, 30)
        rss, rank = residual_sum_of_squares((x.T @ x).tolist(), (x.T @ y).tolist(), float(y @ y))
        want_rss, want_rank = _reference_rss(x, y)
        assert rank == want_rank == (2 if collinear else 5)
        assert rss == pytest.approx(want_rss, rel=1e-6)


def test_a_feature_never_excited_is_not_spanned() -> None:
    x = np.array([[1.0, 2.0, 0.0], [1.0, 3.0, 0.0], [1.0, 5.0, 0.0], [1.0, 4.0, 0.0]])
    y = np.array([1.0, 2.0, 2.5, 2.0])
    rss, rank = residual_sum_of_squares((x.T @ x).tolist(), (x.T @ y).tolist(), float(y @ y))
    assert rank == 2
    assert rss == pytest.approx(_reference_rss(x[:, :2], y)[0])


def test_nonnegative_minimiser_equals_scipy_nnls_with_and_without_a_warm_start() -> None:
    rng = np.random.default_rng(5)
    active = 0
    for _ in range(200):
        x = _design(rng, 12, collinear=False) / rng.uniform(1, 10, (12, 1))
        y = x @ rng.normal(0.5, 1.0, 5) + rng.normal(0, 0.3, 12)  # some true coefficients negative: bounds bind
        want, _ = optimize.nnls(x, y)
        a, b = (x.T @ x).tolist(), (x.T @ y).tolist()
        got = nonnegative_minimiser(a, b)
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9)
        assert all(v >= 0 for v in got)
        active += int(np.sum(want == 0) > 0)
        # A warm start from any guess of the support gives the same (unique) minimiser.
        for start in ([0, 1, 2, 3, 4], [int(i) for i in np.flatnonzero(want > 0)], [3]):
            assert nonnegative_minimiser(a, b, start) == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert active > 50  # the cases exercised the bounds, not only interior solutions
