"""Per-position acceptance from published acceptance lengths: the curve the catalog predicts with.

Publishers give acceptance length (AL, bonus token included) at one or two draft depths K, not per position. The
catalog turns them into a survival curve ``s_i = P(first i drafts accepted)`` with a two-parameter model of the
conditional acceptance rate at draft position i (1-based):

    ``a_i = min(1, a_1 * d^(i-1))``,  ``s_i = a_1 * ... * a_i``,  ``AL(K) = 1 + s_1 + ... + s_K``

- ``a_1`` (`first_rate`): how often the first draft is accepted;
- ``d`` (`position_decay`): how fast the rate falls with depth (1 = a constant rate, the usual one-point fit).

AL at TWO depths (the vLLM P-EAGLE blog gives K = 3 and K = 7) determines both parameters exactly (`fit_curve`):
for a trial ``d`` the first rate that reproduces AL(K1) is found by bisection, and ``d`` is bisected until AL(K2)
matches too (with AL(K1) held, a larger ``d`` moves acceptance to deeper positions, so AL(K2) rises with ``d``).
AL at ONE depth determines ``a_1`` once ``d`` is known; the catalog then takes ``d`` from the two-depth fits of
heads that draft the same way (parallel or sequential), a prior measured on real heads instead of assuming a
constant rate, which overstates acceptance beyond the published K.

Example: GPT-OSS-20B P-EAGLE on HumanEval, AL(3) = 3.02 and AL(7) = 3.94 -> a_1 = 0.838, d = 0.955; its survival
curve is 0.838, 0.670, 0.512, 0.374, ... and it predicts AL(5) = 3.66.

A weaker head of the same kind (fewer layers) is the same curve with every conditional rate multiplied by a factor
f < 1 (`rate_factor_for_mean`): errors compound with depth, so a 2-layer head loses more at K = 7 than at K = 3.
The family is closed under that scaling (``a_1 -> f * a_1``, same ``d``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "acceptance_length",
    "fit_curve",
    "first_rate_for",
    "rate_factor_for_mean",
    "survival",
]

#: Bounds of the fitted position decay: below 0.05 acceptance would vanish after two positions; above 1 the
#: conditional rate would rise with depth, which no published head shows.
DECAY_RANGE = (0.05, 1.0)


def survival(first_rate: float, decay: float, max_k: int) -> tuple[float, ...]:
    """``(s_1, ..., s_max_k)``: P(first i drafts accepted) for the curve ``a_i = min(1, first_rate * decay^(i-1))``.

    Example: ``survival(0.8, 0.5, 3) -> (0.8, 0.32, 0.064)`` (rates 0.8, 0.4, 0.2).
    """
    if not 0.0 <= first_rate <= 1.0:
        raise ValueError(f"first_rate is a probability in [0, 1], but got {first_rate}.")
    if decay <= 0.0:
        raise ValueError(f"decay must be > 0, but got {decay}.")
    s, out = 1.0, []
    for i in range(max_k):
        s *= min(1.0, first_rate * decay**i)
        out.append(s)
    return tuple(out)


def acceptance_length(first_rate: float, decay: float, k: int) -> float:
    """AL(k) = 1 + s_1 + ... + s_k of the curve (tokens per request per verification step, bonus included)."""
    return 1.0 + sum(survival(first_rate, decay, k))


def _bisect(f: Callable[[float], float], lo: float, hi: float, iterations: int = 80) -> float:
    """The root of an increasing function on [lo, hi] (clamped to an end when it has no sign change)."""
    if f(lo) >= 0.0:
        return lo
    if f(hi) <= 0.0:
        return hi
    for _ in range(iterations):
        mid = (lo + hi) / 2.0
        if f(mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2.0


def first_rate_for(al: float, k: int, decay: float) -> float:
    """The first-position rate that gives AL(k) = `al` for a given decay (AL rises with it: bisection).

    Example: ``first_rate_for(2.68, 5, 1.0)`` is the constant rate 0.650 of a one-point fit.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1 for a published acceptance length, but got k={k}.")
    if not 1.0 <= al <= k + 1:
        raise ValueError(f"AL at K={k} must be in [1, {k + 1}] (bonus token + at most K drafts), but got {al}.")
    return _bisect(lambda a: acceptance_length(a, decay, k) - al, 0.0, 1.0)


def fit_curve(points: Mapping[int, float], decay_prior: float = 1.0) -> tuple[float, float]:
    """``(first_rate, decay)`` through published ``{K: AL}`` points.

    One point: the first rate for `decay_prior`. Two or more: the shallowest and the deepest K fix both parameters
    (an interior point is not fitted; compare it with `acceptance_length` to see the residual). When the deeper AL
    exceeds even a constant-rate extrapolation, the decay is clamped to 1 (the nearest curve of the family).
    """
    if not points:
        raise ValueError("fit_curve needs at least one published (K, AL) point.")
    ks = sorted(points)
    if len(ks) == 1:
        k = ks[0]
        return first_rate_for(points[k], k, decay_prior), decay_prior
    k1, k2 = ks[0], ks[-1]
    al1, al2 = points[k1], points[k2]
    if al2 < al1:
        raise ValueError(f"AL cannot fall with depth, but AL({k1}) = {al1} > AL({k2}) = {al2}.")

    def excess(d: float) -> float:
        return acceptance_length(first_rate_for(al1, k1, d), d, k2) - al2

    decay = _bisect(excess, *DECAY_RANGE)
    return first_rate_for(al1, k1, decay), decay


def rate_factor_for_mean(target_mean: float, curves: Sequence[tuple[float, float]], k: int) -> float:
    """The factor f on every conditional rate that makes the mean AL(k) of `curves` equal `target_mean`.

    Used for layer variants: the P-EAGLE paper gives a 2-layer head's AL averaged over three workloads (Table 11)
    and the 4-layer head's per workload (Table 9); f carries the 2-layer loss to every workload and depth.
    Example: one curve with a constant rate 0.8 (AL(5) = 3.689) and a target of 3.0 -> f = 0.828.
    """
    if not curves:
        raise ValueError("rate_factor_for_mean needs at least one base curve.")

    def excess(f: float) -> float:
        mean = sum(acceptance_length(min(1.0, f * a), d, k) for a, d in curves) / len(curves)
        return mean - target_mean

    top = 1.0 / max(a for a, _ in curves) if max(a for a, _ in curves) > 0 else 1.0
    return _bisect(excess, 0.0, max(top, 1.0))
