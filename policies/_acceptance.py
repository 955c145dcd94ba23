"""Acceptance math for chain drafting: survival per draft position and the acceptance length AL(K).

vLLM counts, per draft position i (0-based), ``accepted_per_position[i]``: the drafts whose first i+1 tokens
were all accepted (with chain drafting, accepting position i implies every earlier position was accepted).
With ``num_drafts`` drafts (one per request per step that speculated):

- survival ``s_i = accepted_per_position[i] / num_drafts = P(first i+1 draft tokens accepted)``;
- acceptance length ``AL(K) = 1 + sum_{i<K} s_i``: the expected tokens one request gains per step when K
  tokens are verified, including the bonus token the target always produces;
- conditional rate ``a_i = s_i / s_{i-1}`` (``a_0 = s_0``): P(position i accepted | all earlier accepted).

Prefix consistency: the draft token at position i does not depend on K, so one run at K_max gives AL(K) for
every K <= K_max.

Worked example: ``num_drafts=100``, ``accepted_per_position=[80, 60, 30]`` gives survival ``[0.8, 0.6, 0.3]``,
conditional rates ``[0.8, 0.75, 0.5]``, ``AL(0)=1``, ``AL(1)=1.8``, ``AL(2)=2.4``, ``AL(3)=2.7``.

Everything here is measured-count arithmetic; the only predictions are extrapolation beyond the measured depth
(documented where it happens) and the profiles built from a published AL (``from_acceptance_length``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# scipy is imported where it is used: it takes ~0.3 s to import, and every `peagle-tune` command imports policies.

__all__ = [
    "AcceptanceProfile",
    "acceptance_length",
    "acceptance_lengths",
    "conditional_rates",
    "mix",
]


def conditional_rates(survival: Sequence[float] | np.ndarray) -> np.ndarray:
    """Conditional acceptance rates ``a_i = s_i / s_{i-1}`` (``a_0 = s_0``) from a survival curve.

    Where ``s_{i-1} = 0`` no draft reached position i, so there is no evidence; the rate is reported as 0
    (nothing survives there anyway, so AL does not depend on it).

    Example: ``conditional_rates([0.8, 0.6, 0.3]) -> [0.8, 0.75, 0.5]``.
    """
    s = np.asarray(survival, dtype=float)
    if s.size == 0:
        return s.copy()
    prev = np.concatenate(([1.0], s[:-1]))
    out = np.zeros_like(s)
    np.divide(s, prev, out=out, where=prev > 0)
    return out


def acceptance_lengths(survival: Sequence[float] | np.ndarray, max_k: int) -> np.ndarray:
    """``[AL(0), AL(1), ..., AL(max_k)]`` in tokens per request per step (bonus token included).

    For K beyond the measured positions the survival is extrapolated geometrically with the last conditional
    rate: ``s_j = s_{n-1} * a_{n-1}^(j-n+1)`` for ``j >= n = len(survival)``. That is a prediction
    (acceptance usually keeps decaying, often faster), not a measurement.

    Example: ``acceptance_lengths([0.8, 0.6, 0.3], 4) -> [1.0, 1.8, 2.4, 2.7, 2.85]`` (AL(4) extrapolates
    ``s_3 = 0.3 * 0.5 = 0.15``).
    """
    return np.asarray(acceptance_length_list([float(x) for x in survival], max_k))


def acceptance_length_list(survival: Sequence[float], max_k: int) -> list[float]:
    """`acceptance_lengths` in plain floats: what the depth controller rebuilds its tables with (a few positions
    per class, where numpy's per-call overhead is most of the cost)."""
    if max_k < 0:
        raise ValueError(f"max_k must be >= 0, but got max_k={max_k}.")
    n = len(survival)
    s = list(survival[:max_k])
    if max_k > n:
        if n == 0:
            raise ValueError(
                f"Cannot compute AL({max_k}) from an empty survival curve: measure at least one position."
            )
        last = float(survival[-1])
        if n == 1:
            rate = last
        else:
            prev = float(survival[-2])
            rate = last / prev if prev > 0 else 0.0
        s += [last * rate**j for j in range(1, max_k - n + 1)]
    out = [1.0]
    total = 0.0
    for x in s:
        total += x
        out.append(1.0 + total)
    return out


def acceptance_length(survival: Sequence[float] | np.ndarray, k: int) -> float:
    """AL(k) = 1 + sum_{i<k} survival[i], in tokens per request per step (bonus token included).

    ``k = 0`` (no speculation) gives 1.0. For ``k > len(survival)`` the curve is extrapolated geometrically
    with the last conditional rate (see `acceptance_lengths`); that part is predicted, not measured.

    Example: ``acceptance_length([0.8, 0.6, 0.3], 2) -> 2.4``;
    ``acceptance_length([0.8, 0.6, 0.3], 3) -> 2.7``.
    """
    if k < 0:
        raise ValueError(f"k (draft depth) must be >= 0, but got k={k}.")
    return float(acceptance_lengths(survival, k)[k])


def _geometric_rate_for(al: float, k: int) -> float:
    """The constant conditional rate a with ``1 + sum_{i=1..k} a^i = al``."""
    target = al - 1.0
    if target <= 0.0:
        return 0.0
    if target >= k:
        return 1.0

    def excess(a: float) -> float:
        return sum(a**i for i in range(1, k + 1)) - target

    from scipy import optimize

    # excess(0) = -target < 0 and excess(1) = k - target > 0, and it is increasing on [0, 1]: one root.
    return float(optimize.brentq(excess, 0.0, 1.0, xtol=1e-14, rtol=1e-14))


@dataclass(frozen=True)
class AcceptanceProfile:
    """Measured acceptance counts of one drafter on one workload (class), per draft position.

    ``num_drafts``: drafts (one per request per step that speculated). ``accepted_per_position[i]``: drafts
    whose first i+1 tokens were all accepted. Lists and numpy integers are accepted and stored as a tuple of
    ints.

    Example::

        >>> p = AcceptanceProfile(100, (80, 60, 30))
        >>> p.survival().tolist(), p.acceptance_length(2), p.acceptance_length(3)
        ([0.8, 0.6, 0.3], 2.4, 2.7)
    """

    num_drafts: int
    accepted_per_position: tuple[int, ...]

    def __post_init__(self) -> None:
        counts = self.accepted_per_position
        try:
            as_ints = tuple(_as_int(c, f"accepted_per_position[{i}]") for i, c in enumerate(counts))
            n = _as_int(self.num_drafts, "num_drafts")
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        object.__setattr__(self, "accepted_per_position", as_ints)
        object.__setattr__(self, "num_drafts", n)
        if n < 1:
            raise ValueError(f"num_drafts must be >= 1 (survival is a fraction of drafts), but got {n}.")
        if not as_ints:
            raise ValueError("accepted_per_position needs at least one position, but got an empty sequence.")
        for i, c in enumerate(as_ints):
            if c < 0:
                raise ValueError(
                    f"accepted_per_position[{i}] must be >= 0, but got {c} (counts: {list(as_ints)})."
                )
            if c > n:
                raise ValueError(
                    f"accepted_per_position[{i}]={c} exceeds num_drafts={n}: a position cannot be accepted "
                    "more often than drafts were made. Pass the delta of vLLM's num_drafts counter for the "
                    "same phase."
                )
            if i > 0 and c > as_ints[i - 1]:
                raise ValueError(
                    "accepted_per_position must be non-increasing (chain drafting: accepting position i "
                    f"implies every earlier one), but position {i} has {c} > position {i - 1} has "
                    f"{as_ints[i - 1]} (counts: {list(as_ints)})."
                )

    # ---- basic views -----------------------------------------------------------------------------------
    @property
    def max_k(self) -> int:
        """The deepest measured draft depth (number of positions)."""
        return len(self.accepted_per_position)

    def survival(self) -> np.ndarray:
        """``s_i = P(first i+1 draft tokens accepted)``, measured, shape ``(max_k,)``."""
        return np.asarray(self.accepted_per_position, dtype=float) / self.num_drafts

    def conditional(self) -> np.ndarray:
        """``a_i = s_i / s_{i-1}`` (``a_0 = s_0``); 0 where no draft reached position i."""
        return conditional_rates(self.survival())

    def acceptance_length(self, k: int) -> float:
        """AL(k) in tokens per request per step, bonus token included; ``k = 0`` gives 1.0.

        For ``k <= max_k`` this is measured. For ``k > max_k`` it is predicted: the survival curve is
        extended geometrically with the last measured conditional rate (``s_j = s_{max_k-1} *
        a_{max_k-1}^(j-max_k+1)``).
        """
        return acceptance_length(self.survival(), k)

    def acceptance_lengths(self, max_k: int | None = None) -> np.ndarray:
        """``[AL(0), ..., AL(max_k)]`` (default: the measured depth); extrapolated beyond it as above."""
        return acceptance_lengths(self.survival(), self.max_k if max_k is None else max_k)

    # ---- uncertainty -----------------------------------------------------------------------------------
    def survival_interval(self, position: int, confidence: float = 0.95) -> tuple[float, float]:
        """Clopper-Pearson (exact binomial) interval for ``s_position`` at the given confidence.

        Treats the ``num_drafts`` drafts as independent trials (requests within one step are, to first order).
        """
        _check_confidence(confidence)
        if not 0 <= position < self.max_k:
            raise ValueError(
                f"position must be in [0, {self.max_k - 1}] (measured positions), but got {position}."
            )
        from scipy import stats

        x, n = self.accepted_per_position[position], self.num_drafts
        alpha = 1.0 - confidence
        lower = 0.0 if x == 0 else float(stats.beta.ppf(alpha / 2, x, n - x + 1))
        upper = 1.0 if x == n else float(stats.beta.ppf(1 - alpha / 2, x + 1, n - x))
        return lower, upper

    def acceptance_length_interval(self, k: int, confidence: float = 0.95) -> tuple[float, float]:
        """Approximate confidence interval for AL(k) (tokens per request per step).

        ``AL(k) - 1`` is the mean over drafts of L = min(accepted run length, k). Its variance is exact from
        the counts, because ``L^2 = sum_{i<L} (2i+1)`` gives ``E[L^2] = sum_{i<k} (2i+1) s_i``. The interval
        is the normal approximation ``AL ± z * sqrt(Var(L) / n)``, with Var(L) computed after adding two
        pseudo-drafts (one with L=0, one with L=k, Agresti-Coull style) so it does not collapse to a point
        when every draft agreed; clipped to ``[1, k+1]``. For ``k > max_k`` it uses the extrapolated
        survival and ignores the extrapolation's own error.
        """
        _check_confidence(confidence)
        if k < 0:
            raise ValueError(f"k (draft depth) must be >= 0, but got k={k}.")
        al = self.acceptance_length(k)
        if k == 0:
            return 1.0, 1.0
        s = acceptance_lengths(self.survival(), k)
        s = np.diff(s)  # survival up to k, extrapolated if needed
        n = self.num_drafts
        i = np.arange(k)
        sum_l = n * float(s.sum()) + k  # pseudo-draft with L=k adds k; the L=0 one adds nothing
        sum_l2 = n * float(((2 * i + 1) * s).sum()) + k * k
        m = n + 2
        var = max(sum_l2 / m - (sum_l / m) ** 2, 0.0)
        from scipy import stats

        half = float(stats.norm.ppf(0.5 + confidence / 2)) * math.sqrt(var / n)
        return max(1.0, al - half), min(k + 1.0, al + half)

    # ---- combining and (de)serialising -----------------------------------------------------------------
    def combine(self, other: AcceptanceProfile, extend: bool = False) -> AcceptanceProfile:
        """Pool two measurements of the same drafter/class: counts and drafts add.

        Same depth: exact. Different depths: by default the result is truncated to the common depth (exact,
        by prefix consistency). With ``extend=True`` the positions only the deeper profile measured are
        kept, carried by the deeper profile's conditional rates (``s_j = s_{j-1} * a_j``, counts rounded):
        zero-padding the shorter one instead would wrongly count its never-drafted positions as rejections.
        """
        n = self.num_drafts + other.num_drafts
        common = min(self.max_k, other.max_k)
        counts = [self.accepted_per_position[i] + other.accepted_per_position[i] for i in range(common)]
        if extend and self.max_k != other.max_k:
            deeper = self if self.max_k > other.max_k else other
            rates = deeper.conditional()
            for j in range(common, deeper.max_k):
                counts.append(min(counts[-1], int(round(counts[-1] * float(rates[j])))))
        return AcceptanceProfile(n, tuple(counts))

    def to_dict(self) -> dict[str, Any]:
        """``{"num_drafts": int, "accepted_per_position": [int, ...]}`` (JSON-ready)."""
        return {"num_drafts": self.num_drafts, "accepted_per_position": list(self.accepted_per_position)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptanceProfile:
        """Inverse of `to_dict`; unknown or missing keys are errors."""
        expected = {"num_drafts", "accepted_per_position"}
        if set(data) != expected:
            raise ValueError(
                f"An acceptance profile has exactly the keys {sorted(expected)}, but got {sorted(data)}."
            )
        return cls(data["num_drafts"], tuple(data["accepted_per_position"]))

    # ---- constructors from summaries -------------------------------------------------------------------
    @classmethod
    def from_survival(cls, survival: Sequence[float], num_drafts: int = 1000) -> AcceptanceProfile:
        """A profile with the given survival curve, as ``round(s_i * num_drafts)`` pseudo-counts.

        ``num_drafts`` sets how much evidence the profile claims (it drives the intervals and the estimator
        prior); the AL it reproduces is exact to ``max_k * 0.5 / num_drafts``.
        """
        s = [float(v) for v in survival]
        for i, v in enumerate(s):
            if not 0.0 <= v <= 1.0:
                raise ValueError(
                    f"survival[{i}] must be a probability in [0, 1], but got {v} (survival: {s})."
                )
            if i > 0 and v > s[i - 1] + 1e-12:
                raise ValueError(
                    f"survival must be non-increasing, but survival[{i}]={v} > survival[{i - 1}]={s[i - 1]}."
                )
        counts: list[int] = []
        for v in s:
            c = int(round(v * num_drafts))
            counts.append(min(c, counts[-1]) if counts else c)
        return cls(num_drafts, tuple(counts))

    @classmethod
    def from_acceptance_length(
        cls, al: float, k: int, max_k: int | None = None, num_drafts: int = 100_000
    ) -> AcceptanceProfile:
        """Turn a published "AL at K" into a per-position profile with a constant conditional rate.

        Solves ``1 + sum_{i=1..k} a^i = al`` for a in [0, 1] (brentq) and sets ``s_i = a^(i+1)`` for ``i <
        max_k`` (default ``max_k = k``). The result is a prediction: real acceptance usually decays with
        position, so AL below k is underestimated a little and above k overestimated. ``num_drafts``
        pseudo-counts keep the round-trip AL(k) within ``k * 0.5 / num_drafts`` of ``al``.

        Example: ``from_acceptance_length(2.68, 5)`` (gpt-oss-120b P-EAGLE, MT-Bench) has ``a ~ 0.650``.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1 for a published acceptance length, but got k={k}.")
        if not 1.0 <= al <= k + 1:
            raise ValueError(
                f"An acceptance length at K={k} must be in [1, {k + 1}] (bonus token + at most K accepted), "
                f"but got al={al}. Check that AL includes the bonus token and that K matches the source."
            )
        depth = k if max_k is None else max_k
        if depth < 1:
            raise ValueError(f"max_k must be >= 1, but got max_k={max_k}.")
        a = _geometric_rate_for(al, k)
        return cls.from_survival([a ** (i + 1) for i in range(depth)], num_drafts=num_drafts)


def mix(profiles: Mapping[str, AcceptanceProfile], weights: Mapping[str, float]) -> AcceptanceProfile:
    """Expected survival curve of a workload that mixes classes with the given weights.

    Why averaging survival is right: AL is linear in survival, so for every K ``E[AL(K)] = sum_c w_c *
    AL_c(K) = sum_c w_c (1 + sum_{i<K} s_{c,i}) = 1 + sum_{i<K} (sum_c w_c s_{c,i})``. The weighted-average
    survival curve therefore gives the expected AL at every depth at once. (Averaging the conditional rates
    instead would not: a product of averages is not the average of products.) Weights are shares of *drafts*
    (request-steps), not of requests: a class with longer outputs drafts more often. They are normalised.

    The result holds pseudo-counts with ``num_drafts`` = the sum of the inputs' (the pooled evidence) and
    depth = the shallowest input's (beyond it some classes would need extrapolation).
    """
    missing = sorted(set(weights) - set(profiles))
    if missing:
        raise ValueError(f"weights name classes {missing} without a profile; profiles: {sorted(profiles)}.")
    used = {c: float(w) for c, w in weights.items() if w != 0}
    for c, w in used.items():
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weight of class {c!r} must be a finite number >= 0, but got {w}.")
    total = sum(used.values())
    if total <= 0:
        raise ValueError(f"At least one class weight must be > 0, but got {dict(weights)}.")
    depth = min(profiles[c].max_k for c in used)
    s = sum((w / total) * profiles[c].survival()[:depth] for c, w in used.items())
    n = sum(profiles[c].num_drafts for c in used)
    return AcceptanceProfile.from_survival(np.clip(np.asarray(s), 0.0, 1.0).tolist(), num_drafts=n)


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            return int(value)
        raise TypeError(f"{name} must be an integer count, but got {value!r} ({type(value).__name__}).")
    return int(value)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, but got {confidence}.")
