"""Calibrating predictions with measurements: a multiplicative factor per drafter with a trend in K (pure numpy).

Model-guided search predicts every config from a profile, measures a few, and scales the predictions of the rest
by what the measured ones showed (`calibration_scales`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from autotune.spec import SpecConfig


def calibration_scales(
    ratios: Mapping[SpecConfig, float], weight: float = 1.0, slope_weight: float = 4.0
) -> tuple[Callable[[SpecConfig], float], float]:
    """Multiplicative calibration of predictions from the measured/predicted ratios of the measured configs.

    `ratios`: config -> log(measured / predicted) of its objective score (higher is better). Speculative configs get
    ``log factor = g + d[drafter] + b * (K - mean measured K)``, fitted by least squares with ridge priors: each
    drafter's offset d is pulled to 0 with `weight` pseudo-observations and the slope b (log units per unit of K) with
    `slope_weight`, so one measurement moves every prediction by the same factor and a K trend is trusted once
    several depths were measured. (A profile run at K_max with the verified depth trimmed cannot see how the
    drafter's own cost grows with K; the slope absorbs that.) The no-speculation baseline is its own group: its
    measured ratio, else g.

    Returns ``(log_scale(config), error)``: the log factor for a config's prediction, and the leave-one-out RMS
    relative error of calibrated predictions of measured speculative configs (NaN with fewer than two).

    Worked example: two configs of one drafter at K=2 and K=4 measured at exactly 0.8x their predictions: g =
    log 0.8, d = 0, b = 0, so every config of every drafter is predicted at 0.8x, and leaving either out predicts it
    at 0.8x again: error 0.

    >>> a, b = SpecConfig("eagle3", "d", 2), SpecConfig("eagle3", "d", 4)
    >>> scale, error = calibration_scales({a: math.log(0.8), b: math.log(0.8)})
    >>> round(math.exp(scale(SpecConfig("eagle3", "other", 7))), 6), round(error, 6)
    (0.8, 0.0)
    """
    items = list(ratios.items())
    errors = []
    for i, (c, r) in enumerate(items):
        if not c.speculative:
            continue
        rest = items[:i] + items[i + 1:]
        if not any(o.speculative for o, _ in rest):
            continue
        errors.append(math.expm1(abs(r - _fit(rest, weight, slope_weight)(c))))
    error = math.sqrt(sum(e * e for e in errors) / len(errors)) if len(errors) >= 2 else math.nan
    return _fit(items, weight, slope_weight), error


def _fit(
    items: Sequence[tuple[SpecConfig, float]], weight: float, slope_weight: float
) -> Callable[[SpecConfig], float]:
    """The least-squares fit of `calibration_scales` on `items`: config -> log factor."""
    import numpy as np

    spec = [(c, r) for c, r in items if c.speculative]
    base = [r for c, r in items if not c.speculative]
    drafters = sorted({str(c.drafter) for c, _ in spec})
    k_ref = sum(c.k for c, _ in spec) / len(spec) if spec else 0.0
    g = 0.0
    offsets: dict[str, float] = {}
    slope = 0.0
    if spec:
        n = 2 + len(drafters)  # g, b, d_1..d_n
        rows, ys = [], []
        for c, r in spec:
            row = [1.0, c.k - k_ref] + [1.0 if str(c.drafter) == d else 0.0 for d in drafters]
            rows.append(row)
            ys.append(r)
        rows.append([0.0, math.sqrt(slope_weight)] + [0.0] * len(drafters))
        ys.append(0.0)
        for i in range(len(drafters)):
            row = [0.0] * n
            row[2 + i] = math.sqrt(weight)
            rows.append(row)
            ys.append(0.0)
        theta = np.linalg.lstsq(np.asarray(rows), np.asarray(ys), rcond=None)[0]
        g, slope = float(theta[0]), float(theta[1])
        offsets = {d: float(theta[2 + i]) for i, d in enumerate(drafters)}
    elif base:
        g = sum(base) / len(base)
    base_scale = sum(base) / len(base) if base else g

    def log_scale(c: SpecConfig) -> float:
        if not c.speculative:
            return base_scale
        return g + offsets.get(str(c.drafter), 0.0) + slope * (c.k - k_ref)

    return log_scale
