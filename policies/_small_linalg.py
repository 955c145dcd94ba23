"""Least squares on a handful of unknowns in plain floats: what the step-cost model solves at each controller refresh.

The step-cost model has 5 features (7 for sequential drafting). At that size numpy's and scipy's per-call overhead is
most of the time: inside a vLLM engine, where the caches are cold from the step between two refreshes, the model's
solve took ~180 us with ``np.linalg.eigh``, a Cholesky factor and ``scipy.optimize.nnls`` (about a dozen array
calls; 75 us warm), and it runs every 16 engine steps. The same arithmetic on Python floats has no per-call cost.
Both functions work on the normal equations of a weighted least-squares problem (``info = X'X``, ``rhs = X'y``),
which is what the model keeps.

- `residual_sum_of_squares`: the RSS of the unconstrained best fit and the rank of the data, by Cholesky with
  diagonal pivoting (directions whose pivot falls below ``rel_tol`` of the largest diagonal, on unit-scaled columns,
  are not spanned);
- `nonnegative_minimiser`: ``argmin t'At - 2b't`` over ``t >= 0`` for a positive definite A, by the Lawson-Hanson
  active-set method on the normal equations (exact after finitely many steps; at most a few for 5 unknowns).

Tests check both against numpy's eigendecomposition and scipy's NNLS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["Matrix", "nonnegative_minimiser", "residual_sum_of_squares"]

Matrix = Sequence[Sequence[float]]
"""A square matrix as rows of floats."""


def residual_sum_of_squares(info: Matrix, rhs: Sequence[float], yy: float, rel_tol: float = 1e-9) -> tuple[float, int]:
    """(RSS, rank) of the least-squares fit with normal equations ``info t = rhs`` and ``yy = y'y``.

    ``RSS = yy - rhs' info^+ rhs`` on the directions the data span. Columns are scaled to unit norm first (a
    feature never excited has a zero column and is not spanned); then Cholesky with diagonal pivoting takes the
    largest remaining pivot while it is above ``rel_tol`` (relative to the scaled diagonal, which is 1).
    The RSS is clipped at 0 (rounding)."""
    n = len(rhs)
    scale = [math.sqrt(info[i][i]) if info[i][i] > 0 else 0.0 for i in range(n)]
    inv = [1.0 / s if s > 0 else 0.0 for s in scale]
    a = [[info[i][j] * inv[i] * inv[j] for j in range(n)] for i in range(n)]
    z = [rhs[i] * inv[i] for i in range(n)]
    remaining = [i for i in range(n) if scale[i] > 0]
    explained = 0.0
    rank = 0
    while remaining:
        p = max(remaining, key=lambda i: a[i][i])
        pivot = a[p][p]
        if pivot <= rel_tol:
            break
        remaining.remove(p)
        rank += 1
        zp = z[p]
        explained += zp * zp / pivot
        row = a[p]
        for i in remaining:  # Schur complement of the pivot (symmetric: update the full remaining block)
            f = row[i] / pivot
            if f:
                ai = a[i]
                for j in remaining:
                    ai[j] -= f * row[j]
                z[i] -= f * zp
    return max(yy - explained, 0.0), rank


def nonnegative_minimiser(a: Matrix, b: Sequence[float], start: Sequence[int] = ()) -> list[float]:
    """``argmin t'At - 2b't`` over ``t >= 0`` for a symmetric positive definite ``a`` (Lawson-Hanson on the normal
    equations: grow the set of free unknowns by the largest descent, solve on it, step back to the boundary when an
    unknown would turn negative).

    ``start``: a guess of the unknowns that are > 0 at the solution (e.g. the last solution's): when the problem
    restricted to them has a positive solution, the search starts there, and a solve whose support did not change
    costs one factorisation and one gradient check."""
    n = len(b)
    t = [0.0] * n
    free: list[int] = []
    scale = max((abs(x) for x in b), default=0.0) + max((abs(a[i][i]) for i in range(n)), default=0.0)
    tol = 1e-12 * (scale or 1.0)
    if start:
        guess = sorted(set(start))
        z = _cholesky_solve([[a[i][j] for j in guess] for i in guess], [b[i] for i in guess])
        if all(v > 0 for v in z):
            free = guess
            for i, v in zip(guess, z, strict=True):
                t[i] = v
    for _ in range(3 * n + 3):
        candidates = []
        for i in range(n):
            if i not in free:
                row = a[i]
                g = b[i]
                for j in free:
                    g -= row[j] * t[j]
                if g > tol:
                    candidates.append((g, i))
        if not candidates:
            break
        free.append(max(candidates)[1])
        while free:
            z = _cholesky_solve([[a[i][j] for j in free] for i in free], [b[i] for i in free])
            if all(v > 0 for v in z):
                for i, v in zip(free, z, strict=True):
                    t[i] = v
                break
            # Step from t towards z until the first free unknown reaches 0, and fix it there.
            alpha = min(t[i] / (t[i] - v) for i, v in zip(free, z, strict=True) if v <= 0)
            for i, v in zip(free, z, strict=True):
                t[i] += alpha * (v - t[i])
            free = [i for i in free if t[i] > tol]
            for i in range(n):
                if i not in free:
                    t[i] = 0.0
    return t


def _cholesky_solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve ``a x = b`` for a symmetric positive definite ``a`` (a few unknowns): ``a = L L'``, then two
    triangular solves."""
    n = len(b)
    low: list[list[float]] = []
    for i in range(n):
        ai, row = a[i], [0.0] * n
        for j in range(i + 1):
            lj = low[j] if j < i else row
            s = ai[j]
            for k in range(j):
                s -= row[k] * lj[k]
            if i == j:
                if s <= 0:
                    raise ValueError("The matrix is not positive definite.")
                row[i] = math.sqrt(s)
            else:
                row[j] = s / lj[j]
        low.append(row)
    y = [0.0] * n
    for i in range(n):
        row, s = low[i], b[i]
        for k in range(i):
            s -= row[k] * y[k]
        y[i] = s / row[i]
    x = [0.0] * n
    for i in reversed(range(n)):
        s = y[i]
        for k in range(i + 1, n):
            s -= low[k][i] * x[k]
        x[i] = s / low[i][i]
    return x
