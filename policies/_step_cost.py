"""Step-cost model: the time of one engine step T(B, K) in ms, and the goodput it implies.

T is linear in non-negative coefficients over an explicit feature set (names in `FEATURES`):

=========================  ==========================  ==========================================================
feature                    value                       what the coefficient is
=========================  ==========================  ==========================================================
``base``                   1                           fixed per-step cost (scheduling, launch, sampling), ms
``per_request``            B                           per-request cost not tied to tokens (KV reads), ms
``per_verified_token``     V = sum_r (K_r + 1)         target forward cost per token verified, ms
``drafter_fixed``          [drafter ran]               fixed cost of the drafter pass, ms
``drafter_per_request``    [drafter ran] * B           per-request cost of the drafter pass, ms
``drafter_per_pass``       D (sequential only)         fixed cost of each further sequential drafter pass, ms
``drafter_per_pass_req``   D * B (sequential only)     per-request cost of each sequential drafter pass, ms
``piecewise``              [step ran PIECEWISE]        extra cost of a step that could not replay FULL CUDA graphs
=========================  ==========================  ==========================================================

For a uniform depth K, ``V = B * (K + 1)`` and the drafter ran iff ``K > 0``, which is the form
``T = c0 + c1*B + c2*B*(K+1) + c3*[K>0] + c4*[K>0]*B``. P-EAGLE drafts all K tokens in one pass, so its drafter
cost does not scale with K; sequential drafting (EAGLE-3 without parallel drafting) adds the last two features
(``D`` = drafting depth). Writing the target cost in V (total verified tokens) lets the same model price per-request
depths. When depth is applied by trimming drafts in the scheduler, the drafter still runs at its configured K even
for a depth-0 step: pass ``drafter_ran=True`` then.

On a GPU with FULL CUDA graphs only a uniform decode step at the launch's K (``full_graph_depth``) replays them;
every other step runs PIECEWISE and pays ``piecewise`` (`policies._graphs`). A step's flag is derived from
``full_graph_depth`` (``V != B * (full_graph_depth + 1)``) unless a sample or a prediction gives it. Without
``full_graph_depth`` (the CPU build, no graphs) the feature is 0 everywhere and its coefficient 0. A fit whose samples
never ran PIECEWISE cannot see the penalty; `fit` then takes the sourced prior (`policies._graphs`).

Fitting minimises the n-weighted squared *relative* error with non-negative coefficients (scipy.optimize.nnls), so
small-batch steps of a few ms count as much as large ones. `update` refines the fit online by exponentially forgotten
Bayesian least squares with the prior model as the prior (see `StepCostModel.update`). Everything the model returns is a
prediction; the samples are measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies._acceptance import AcceptanceProfile
from policies._graphs import piecewise_penalty_ms
from policies._small_linalg import Matrix, nonnegative_minimiser, residual_sum_of_squares

__all__ = ["FEATURES", "PARALLEL_FEATURES", "SEQUENTIAL_FEATURES", "StepCostModel", "StepSample", "tokens_per_second"]

PARALLEL_FEATURES: tuple[str, ...] = (
    "base",
    "per_request",
    "per_verified_token",
    "drafter_fixed",
    "drafter_per_request",
)
"""Features of the P-EAGLE (parallel drafting) model: the drafter is one pass whatever K."""
SEQUENTIAL_FEATURES: tuple[str, ...] = PARALLEL_FEATURES + ("drafter_per_pass", "drafter_per_pass_req")
"""Features of the sequential-drafting model: each draft position costs one more drafter pass."""
PARALLEL_FEATURES += ("piecewise",)
SEQUENTIAL_FEATURES += ("piecewise",)
FEATURES = SEQUENTIAL_FEATURES
"""Every feature name the model knows, in column order."""

_STATE_VERSION = 1
_PRIOR_ERROR = 0.10
"""Relative error assumed for a prior that carries no fit error (a model built from bare coefficients)."""
_MAD_TO_SIGMA = 1.4826
"""Median absolute relative error -> standard deviation (normal errors): ``sigma = 1.4826 * median``."""
_NOISE_FLOOR = 1e-3
"""Least relative noise of one measured step (0.1%): noise-free measurements (a simulator) still leave the prior a
trace of weight, so the directions they never excite stay defined."""


@dataclass(frozen=True)
class StepSample:
    """One measured step time (or the mean of ``n`` steps with the same shape).

    ``batch_size``: requests in the step (B). ``depth``: verified draft depth K (0: plain decode); for per-request
    depths, the drafting depth D (the deepest request). ``step_ms``: measured wall time of the step, ms.
    ``verified_tokens``: sum over requests of (K_r + 1); None means ``B * (depth + 1)`` (uniform depth).
    ``drafter_ran``: whether a drafter pass ran in the step; None means ``depth > 0``.
    ``piecewise``: the step ran PIECEWISE where FULL CUDA graphs exist; None: derived from the model's
    ``full_graph_depth``.
    """

    batch_size: int
    depth: int
    step_ms: float
    n: int = 1
    verified_tokens: int | None = None
    drafter_ran: bool | None = None
    piecewise: bool | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, but got {self.batch_size}.")
        if self.depth < 0:
            raise ValueError(f"depth must be >= 0, but got {self.depth}.")
        if not (math.isfinite(self.step_ms) and self.step_ms > 0):
            raise ValueError(f"step_ms must be a finite time > 0 ms, but got {self.step_ms}.")
        if self.n < 1:
            raise ValueError(f"n (steps averaged) must be >= 1, but got {self.n}.")
        if self.verified_tokens is not None and self.verified_tokens < self.batch_size:
            raise ValueError(
                f"verified_tokens counts K_r + 1 per request, so it must be >= batch_size={self.batch_size}, "
                f"but got {self.verified_tokens}."
            )

    @property
    def tokens(self) -> int:
        """Verified tokens V in the step."""
        return self.batch_size * (self.depth + 1) if self.verified_tokens is None else self.verified_tokens

    @property
    def drafted(self) -> bool:
        return self.depth > 0 if self.drafter_ran is None else self.drafter_ran


class StepCostModel:
    """Linear, non-negative model of the engine step time T(B, K) in ms (see the module docstring).

    Build it with `fit` from measured `StepSample`s or from stored coefficients (`from_dict`); refine online with
    `update`. ``forgetting`` (0 < λ <= 1) is the forgetting factor of `update`: the online estimate remembers about
    ``1 / (1 - λ)`` updates.
    """

    def __init__(
        self,
        coefficients: Mapping[str, float],
        *,
        sequential: bool = False,
        forgetting: float = 0.99,
        full_graph_depth: int | None = None,
    ) -> None:
        self.sequential = bool(sequential)
        if full_graph_depth is not None and full_graph_depth < 0:
            raise ValueError(f"full_graph_depth is a depth >= 0 (or None: no FULL graphs), but got {full_graph_depth}.")
        self.full_graph_depth = full_graph_depth
        """The depth whose uniform decode steps replay FULL CUDA graphs (the launch's K on a GPU); None: none do."""
        names = self.feature_names
        unknown = sorted(set(coefficients) - set(names))
        if unknown:
            hint = " (sequential features need sequential=True)" if set(unknown) <= set(FEATURES) else ""
            raise ValueError(f"Unknown step-cost features {unknown}{hint}; known: {list(names)}.")
        values = [float(coefficients.get(n, 0.0)) for n in names]
        for n, v in zip(names, values, strict=True):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"Step-cost coefficient {n!r} must be a finite number >= 0 (ms), but got {v}.")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], e.g. 0.99, but got {forgetting}.")
        self.forgetting = float(forgetting)
        self._theta = values  # coefficients used for predictions, all >= 0 (plain floats, see `_prior`)
        self._stale = False  # updates arrived since `_theta` was solved (solved once, when next read)
        # Online refinement (`update`), created at the first update: the prior's (information, rhs) and the
        # forgotten data's.
        # Plain floats (5-7 features): numpy's per-call overhead would be most of an update or a solve.
        self._prior: tuple[list[list[float]], list[float], float] | None = None
        self._info: list[list[float]] | None = None
        self._updates = 0.0  # remembered pooled updates (forgotten like the data)
        self._rhs: list[float] | None = None
        self._yy = 0.0  # remembered sum of squared targets (for the residual sum of squares)
        self._noise2: float | None = None  # estimated relative noise variance of one step (see `_solved`)
        self._fit_samples: tuple[StepSample, ...] = ()
        self._fit_stats: dict[str, float] | None = None

    # ---- features and prediction -----------------------------------------------------------------------
    @property
    def feature_names(self) -> tuple[str, ...]:
        return SEQUENTIAL_FEATURES if self.sequential else PARALLEL_FEATURES

    @property
    def coefficients(self) -> dict[str, float]:
        """Current coefficients in ms per unit of each feature."""
        return dict(zip(self.feature_names, self._solved(), strict=True))

    def features(
        self, batch_size: int, verified_tokens: int, drafter_ran: bool, draft_depth: int,
        piecewise: bool | None = None,
    ) -> np.ndarray:
        """The feature row for a step (see the module docstring for each column)."""
        return np.asarray(self._row(batch_size, verified_tokens, drafter_ran, draft_depth, piecewise), dtype=float)

    def runs_piecewise(self, batch_size: int, verified_tokens: int) -> bool:
        """Whether a decode step of B requests verifying V tokens runs PIECEWISE in this model's launch: not the
        uniform ``V == B * (full_graph_depth + 1)`` step, where FULL graphs exist."""
        full = self.full_graph_depth
        return full is not None and verified_tokens != batch_size * (full + 1)

    def _row(self, batch_size: int, verified_tokens: int, drafter_ran: bool, draft_depth: int,
             piecewise: bool | None = None) -> list[float]:
        d = 1.0 if drafter_ran else 0.0
        row = [1.0, float(batch_size), float(verified_tokens), d, d * batch_size]
        if self.sequential:
            depth = draft_depth if drafter_ran else 0
            row += [float(depth), float(depth * batch_size)]
        if piecewise is None:
            piecewise = self.runs_piecewise(batch_size, verified_tokens)
        row.append(1.0 if piecewise else 0.0)
        return row

    def predict(self, batch_size: int, depth: int, drafter_ran: bool | None = None,
                piecewise: bool | None = None) -> float:
        """Predicted step time in ms for B requests all verifying K = ``depth`` drafts.

        ``drafter_ran`` defaults to ``depth > 0``; pass True when depth 0 is reached by trimming drafts (the drafter
        still ran). ``piecewise`` (None: `runs_piecewise`): pass False for a fresh launch at static K = ``depth``,
        whose uniform steps replay FULL graphs.
        """
        ran = depth > 0 if drafter_ran is None else drafter_ran
        return self.predict_tokens(batch_size, batch_size * (depth + 1), ran, depth, piecewise)

    def predict_tokens(
        self, batch_size: int, verified_tokens: int, drafter_ran: bool, draft_depth: int = 0,
        piecewise: bool | None = None,
    ) -> float:
        """Predicted step time in ms for B requests verifying V tokens in total (per-request depths)."""
        row = self._row(batch_size, verified_tokens, drafter_ran, draft_depth, piecewise)
        return float(sum(x * t for x, t in zip(row, self._solved(), strict=True)))

    def goodput(
        self, batch_size: int, depth: int, acceptance_length: float, drafter_ran: bool | None = None,
        piecewise: bool | None = None,
    ) -> float:
        """Predicted tokens/s: ``B * AL / T(B, K) * 1000`` (AL in tokens per request per step)."""
        return tokens_per_second(batch_size, acceptance_length,
                                 self.predict(batch_size, depth, drafter_ran, piecewise))

    def best_depth(
        self,
        batch_size: int,
        acceptance: AcceptanceProfile | Callable[[int], float] | Sequence[float],
        max_k: int,
        drafter_ran_at_zero: bool = False,
    ) -> int:
        """The uniform depth K in [0, max_k] with the highest predicted goodput (smallest K on ties).

        ``acceptance``: a profile, a function ``k -> AL(k)``, or a table ``[AL(0), ..., AL(max_k)]``.
        ``drafter_ran_at_zero``: True when K=0 still pays the drafter (depth applied by trimming).
        """
        if max_k < 0:
            raise ValueError(f"max_k must be >= 0, but got {max_k}.")
        al = _al_function(acceptance, max_k)
        best_k, best_g = 0, -math.inf
        for k in range(max_k + 1):
            g = self.goodput(batch_size, k, al(k), drafter_ran=True if drafter_ran_at_zero else None)
            if g > best_g * (1 + 1e-12):
                best_k, best_g = k, g
        return best_k

    # ---- fitting ---------------------------------------------------------------------------------------
    @classmethod
    def fit(
        cls, samples: Sequence[StepSample], *, sequential: bool = False, forgetting: float = 0.99,
        full_graph_depth: int | None = None,
    ) -> StepCostModel:
        """Least-squares fit (non-negative coefficients) of measured step times.

        Minimises ``sum_j n_j * ((T_pred_j - step_ms_j) / step_ms_j)^2``. The coefficients are identifiable only if
        the samples include plain-decode steps (K=0, no drafter), at least two different depths > 0 and at least
        two batch sizes; otherwise the fit still predicts the sampled region but individual coefficients mean little.
        ``full_graph_depth``: see the class; when no sample ran PIECEWISE, ``piecewise`` is the sourced prior
        (`policies._graphs.piecewise_penalty_ms` of the predicted single-stream step at that depth).
        """
        samples = tuple(samples)
        model = cls({}, sequential=sequential, forgetting=forgetting, full_graph_depth=full_graph_depth)
        if len(samples) < 2:
            raise ValueError(
                f"Fitting a step-cost model needs at least 2 samples (ideally a grid of batch sizes x depths "
                f"including K=0), but got {len(samples)}."
            )
        from scipy import optimize  # lazily: importing scipy costs ~0.3 s on every `peagle-tune` command

        x, y, w = model._design(samples)
        scale = np.sqrt(w) / y
        theta, _ = optimize.nnls(x * scale[:, None], y * scale)
        model._theta = [float(v) for v in theta]
        if full_graph_depth is not None and not x[:, -1].any():
            model._theta[-1] = piecewise_penalty_ms(model.predict(1, full_graph_depth, piecewise=False))
        model._fit_samples = samples
        model._fit_stats = model._error_stats(samples)
        return model

    def with_graphs(self, full_graph_depth: int | None) -> StepCostModel:
        """A copy of this model for a launch whose uniform steps at ``full_graph_depth`` replay FULL graphs (None:
        no graphs). A model that never saw a PIECEWISE step (a CPU profile, a roofline fit of static launches) takes
        the sourced prior for the penalty; one that did keeps its own coefficient."""
        state = self.to_dict()
        state["full_graph_depth"] = full_graph_depth
        coefficients = dict(state["coefficients"])
        if full_graph_depth is None:
            coefficients["piecewise"] = 0.0
        elif not coefficients.get("piecewise"):
            flat = StepCostModel({**coefficients, "piecewise": 0.0}, sequential=self.sequential)
            coefficients["piecewise"] = piecewise_penalty_ms(flat.predict(1, full_graph_depth, piecewise=False))
        state["coefficients"] = coefficients
        return StepCostModel.from_dict(state)

    def fit_error(self) -> dict[str, float]:
        """Error of the predictions on the samples the model was fit on (measured vs predicted).

        Keys: ``median_rel_error`` and ``max_rel_error`` (|pred - measured| / measured), ``r2`` (n-weighted
        coefficient of determination on ms), ``num_samples``. Online `update`s do not change it.
        """
        if self._fit_stats is None:
            raise ValueError(
                "This step-cost model was not fit on samples (it was built from coefficients), so it has no fit "
                "error. Use StepCostModel.fit(samples) or evaluate on held-out samples with error_on(samples)."
            )
        return dict(self._fit_stats)

    def error_on(self, samples: Sequence[StepSample]) -> dict[str, float]:
        """The same statistics as `fit_error`, on any samples (e.g. held-out measurements)."""
        samples = tuple(samples)
        if not samples:
            raise ValueError("error_on needs at least one sample.")
        return self._error_stats(samples)

    def _design(self, samples: Sequence[StepSample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.stack([self.features(s.batch_size, s.tokens, s.drafted, s.depth, s.piecewise) for s in samples])
        y = np.asarray([s.step_ms for s in samples], dtype=float)
        w = np.asarray([s.n for s in samples], dtype=float)
        return x, y, w

    def _error_stats(self, samples: Sequence[StepSample]) -> dict[str, float]:
        x, y, w = self._design(samples)
        pred = x @ np.asarray(self._solved())
        rel = np.abs(pred - y) / y
        mean = float(np.average(y, weights=w))
        ss_tot = float(np.sum(w * (y - mean) ** 2))
        ss_res = float(np.sum(w * (y - pred) ** 2))
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
        return {
            "median_rel_error": float(np.median(rel)),
            "max_rel_error": float(np.max(rel)),
            "r2": r2,
            "num_samples": float(len(samples)),
        }

    # ---- online refinement -----------------------------------------------------------------------------
    def update(self, sample: StepSample) -> None:
        """Refine the coefficients with one measured step (or the mean of ``sample.n`` steps of one shape).

        Bayesian linear regression on relative errors, with forgetting: the coefficients minimise
        ``sum_j forgetting**age_j * n_j * rel_err_j**2 / noise**2 + prior / prior_error**2`` under
        ``coefficients >= 0``, where ``noise`` is the relative noise of one measured step, estimated from the
        remembered measurements (`_solved`), ``prior`` is the mean squared relative error against the model as it
        was before any update (its fit, or its stored coefficients) over the shapes it was fit on (or a grid
        spanning every feature), and ``prior_error`` is that fit's own error (``1.4826 * median_rel_error``, or
        `_PRIOR_ERROR` when the model carries no fit error). The prior counts as one observation, not one per fit
        sample: a linear fit's errors at neighbouring shapes are one misfit, not independent measurements.

        So the prior's pull is fixed and the data's grows with what they measure, direction by direction: directions
        the measurements pin down follow them (a GPU whose step at B = 1 costs 0.23 ms per verified token where the
        fit over B = 1..64 says 0.036), directions they excite only weakly against their noise keep the prior (CPU
        steps with ~15% noise at nearly one shape had driven ``per_verified_token`` to 0.02 ms against a measured
        0.15 when the prior was worth a fixed 0.1 step), and directions they never excite stay at the prior (plain
        RLS with forgetting let an off-step drift to 6.7 ms where 3.7 ms were measured after a long stretch at B=1,
        K=4). The non-negative solution is exact (NNLS), not a clipped unconstrained one. Cost: O(F^2) per update;
        one F x F eigendecomposition and one NNLS (F <= 7 features) when the coefficients are next read.
        """
        y = math.sqrt(sample.n)
        scale = y / sample.step_ms
        x = [v * scale for v in self._row(sample.batch_size, sample.tokens, sample.drafted, sample.depth,
                                          sample.piecewise)]
        if self._prior is None or self._info is None or self._rhs is None:
            self._prior = self._prior_system()
            dim = len(self.feature_names)
            self._info, self._rhs = [[0.0] * dim for _ in range(dim)], [0.0] * dim
        lam = self.forgetting
        self._updates = lam * self._updates + 1.0
        for info_row, xi in zip(self._info, x, strict=True):
            for j, xj in enumerate(x):
                info_row[j] = lam * info_row[j] + xi * xj
        self._rhs = [lam * r + xi * y for r, xi in zip(self._rhs, x, strict=True)]
        self._yy = lam * self._yy + y * y
        self._stale = True

    @property
    def noise(self) -> float | None:
        """Estimated relative noise of one measured step (standard deviation of ``(measured - predicted) /
        measured``), from the remembered online measurements; None before there are more pooled updates than
        features."""
        self._solved()
        return None if self._noise2 is None else math.sqrt(self._noise2)

    def _solved(self) -> list[float]:
        """The coefficients, re-solved if updates arrived since (so a batch of updates costs one NNLS).

        The prior's weight relative to one measured step is ``noise**2 / prior_error**2`` (`update`). The noise is
        estimated from the measurements alone, as in ordinary least squares: the residual sum of squares of their own
        best linear fit over its degrees of freedom (remembered pooled updates minus the directions they span; each
        pooled update of n steps contributes ``n * rel_err**2``, whose expectation is one step's noise variance). So
        measurements that disagree with the prior do not count as noise. Until there are more pooled updates than
        directions the noise is unknown and the measurements are taken at face value (`_NOISE_FLOOR`): the first
        refresh moves the model to them, and the noise estimate takes over from the next ones (every solve starts
        from the remembered statistics, so nothing of that first step is kept)."""
        if self._stale and self._prior is not None and self._info is not None and self._rhs is not None:
            prior_info, prior_rhs, prior_var = self._prior
            self._noise2 = _residual_variance(self._info, self._rhs, self._yy, self._updates)
            noise2 = _NOISE_FLOOR**2 if self._noise2 is None else self._noise2
            k = noise2 / prior_var
            info = [[k * p + v for p, v in zip(prow, row, strict=True)]
                    for prow, row in zip(prior_info, self._info, strict=True)]
            rhs = [k * p + v for p, v in zip(prior_rhs, self._rhs, strict=True)]
            support = [i for i, v in enumerate(self._theta) if v > 0]
            self._theta = _nonnegative_solve(info, rhs, support)
            self._stale = False
        return self._theta

    def _prior_system(self) -> tuple[list[list[float]], list[float], float]:
        """(information matrix, right-hand side, error variance) of the prior: the current model's own predictions,
        weighted as relative errors, on the fit's shapes (or a grid spanning every feature), one observation in
        total, and the fit's relative error variance (see `update`)."""
        dim = len(self.feature_names)
        stats = self._fit_stats or {}
        median = stats.get("median_rel_error")
        error = _PRIOR_ERROR if median is None else max(_MAD_TO_SIGMA * float(median), _NOISE_FLOOR)
        if self._fit_samples:
            shapes = [(s.batch_size, s.tokens, s.drafted, s.depth, s.piecewise) for s in self._fit_samples]
        else:
            shapes = []
            for b in (1, 8, 64):
                shapes += [(b, b, False, 0, None), (b, b, True, 4, None), (b, 2 * b, True, 1, None),
                           (b, 5 * b, True, 4, None)]
            if self.full_graph_depth is not None:  # the uniform step at the FULL depth, and a PIECEWISE one
                k = self.full_graph_depth
                shapes += [(b, b * (k + 1), k > 0, k, False) for b in (1, 8, 64)]
                shapes += [(b, b * (k + 1), k > 0, k, True) for b in (1, 8, 64)]
        rows = []
        for b, v, ran, depth, piecewise in shapes:
            x = self.features(b, v, ran, depth, piecewise)
            pred = float(x @ np.asarray(self._theta))
            if pred > 0:
                rows.append(x / pred)
        if not rows:  # an all-zero model says nothing: an almost flat prior
            return (np.eye(dim) * 1e-9).tolist(), [0.0] * dim, error**2
        xs = np.stack(rows) / math.sqrt(len(rows))
        ones = np.full(len(rows), 1.0 / math.sqrt(len(rows)))
        return (xs.T @ xs + np.eye(dim) * 1e-9).tolist(), (xs.T @ ones).tolist(), error**2

    # ---- (de)serialising -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state: coefficients (ms per feature unit), options and the fit error (if fit)."""
        return {
            "version": _STATE_VERSION,
            "sequential": self.sequential,
            "forgetting": self.forgetting,
            "full_graph_depth": self.full_graph_depth,
            "coefficients": self.coefficients,
            "fit_error": self._fit_stats,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepCostModel:
        """Inverse of `to_dict` (the fit samples are not stored; `fit_error` is)."""
        known = {"version", "sequential", "forgetting", "full_graph_depth", "coefficients", "fit_error"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Unknown step-cost model keys {unknown}; known: {sorted(known)}.")
        version = data.get("version", _STATE_VERSION)
        if version != _STATE_VERSION:
            raise ValueError(f"Step-cost model state version {version!r} is not supported (expected 1).")
        if not isinstance(data.get("coefficients"), Mapping):
            raise ValueError("Step-cost model state needs 'coefficients': a mapping of feature name to ms.")
        model = cls(
            data["coefficients"],
            sequential=bool(data.get("sequential", False)),
            forgetting=float(data.get("forgetting", 0.99)),
            full_graph_depth=_optional_depth(data.get("full_graph_depth")),
        )
        stats = data.get("fit_error")
        model._fit_stats = None if stats is None else {str(k): float(v) for k, v in stats.items()}
        return model

    def __repr__(self) -> str:
        coefs = ", ".join(f"{n}={v:.4g}" for n, v in self.coefficients.items())
        return f"StepCostModel({coefs}, sequential={self.sequential})"


def _optional_depth(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"Step-cost model state: full_graph_depth must be a depth >= 0 or null, but got {value!r}.")
    return value


def tokens_per_second(batch_size: int, acceptance_length: float, step_ms: float) -> float:
    """Tokens/s of a step: ``batch_size * acceptance_length / step_ms * 1000``.

    Example: 32 requests, AL 2.5 tokens per request per step, 20 ms per step -> 4000 tokens/s.
    """
    if step_ms <= 0:
        raise ValueError(f"step_ms must be > 0, but got {step_ms}.")
    return batch_size * acceptance_length / step_ms * 1000.0


def _al_function(
    acceptance: AcceptanceProfile | Callable[[int], float] | Sequence[float], max_k: int
) -> Callable[[int], float]:
    if isinstance(acceptance, AcceptanceProfile):
        table = acceptance.acceptance_lengths(max_k)
        return lambda k: float(table[k])
    if callable(acceptance):
        return acceptance
    values = [float(v) for v in acceptance]
    if len(values) < max_k + 1:
        raise ValueError(
            f"An AL table must hold [AL(0), ..., AL(max_k)] = {max_k + 1} values, but got {len(values)}."
        )
    return lambda k: values[k]


def _residual_variance(info: Matrix, rhs: Sequence[float], yy: float, updates: float) -> float | None:
    """Relative noise variance of one step, ``RSS / (updates - rank)``, from the sufficient statistics of a weighted
    least-squares problem (``info = X'X``, ``rhs = X'y``, ``yy = y'y``): the RSS of its unconstrained best fit on the
    directions the data span (`policies._small_linalg.residual_sum_of_squares`). None when the data have no degrees
    of freedom left."""
    rss, rank = residual_sum_of_squares(info, rhs, yy)
    dof = updates - rank
    if rank == 0 or dof <= 0:
        return None
    return max(rss / dof, _NOISE_FLOOR**2)


def _nonnegative_solve(info: Matrix, rhs: Sequence[float], start: Sequence[int] = ()) -> list[float]:
    """argmin ``t' info t - 2 rhs' t`` over ``t >= 0`` (info symmetric positive definite); ``start``: the unknowns
    expected > 0 (the last solution's), where the search starts (`policies._small_linalg.nonnegative_minimiser`)."""
    n = len(rhs)
    sym = [[0.5 * (info[i][j] + info[j][i]) for j in range(n)] for i in range(n)]
    # A relative jitter keeps the problem positive definite when the prior is flat (an all-zero model) or weighs almost
    # nothing (noise-free data) along a direction the data do not excite; it moves no solution measurably.
    jitter = 1e-12 * max(max(sym[i][i] for i in range(n)), 1e-300)
    for i in range(n):
        sym[i][i] += jitter
    return nonnegative_minimiser(sym, rhs, start)
