"""Per request and step, how many of the verified drafts are accepted: from a profile (with autocorrelation) or a trace.

Profile model. For a class with survival ``s_i = P(first i+1 drafts accepted)`` (an `AcceptanceProfile`, extended
geometrically beyond its measured depth), a step that verifies K drafts accepts ``A = min(R, K)`` where R, the
length of the run of correct drafts, has ``P(R >= j) = s_{j-1}``. R is drawn by inverting that distribution at
``u = Phi(z)``, where z is a per-request latent state following an AR(1) process over the request's decode steps:
``z_n = rho * z_{n-1} + sqrt(1 - rho^2) * e_n`` with ``e_n ~ N(0, 1)``. So:

- every step's marginal is exactly the profile's, for every K (AL(K) is reproduced whatever rho);
- the same u gives a consistent answer for every K (prefix consistency: ``min(R, K)``);
- ``rho = 0`` is i.i.d. acceptance; ``rho`` near 1 gives long easy and hard stretches within a request (text regions
  the drafter predicts well or badly), about ``1 / (1 - rho)`` steps long.

Why steps and not token positions: a profile counts drafts per step. Were z indexed by token position, a request
would cross an easy stretch in few steps (many tokens each) and a hard one in many, so the per-step marginal would
lean towards the hard state and fall below the profile (at rho = 0.9 and AL(3) = 2.7: 2.28).

Trace model. A recorded trace is one request's sequence of (verified drafts d, accepted a) per decode step, as the
scheduler plugin saw them. The simulated request replays it step by step: verifying K drafts at its n-th step it
accepts ``min(a_n, K)`` when the recorded step was decided (a_n < d_n) or ``K <= d_n``; when the recorded drafts
were all accepted (censored, a_n = d_n) and K > d_n, the positions beyond d_n are drawn from the class profile
conditional on reaching d_n. After the trace ends the request continues with the profile model. Replay is by step
index, not by token position: a config that advances faster reaches later parts of the text in fewer steps, which
the replay does not reproduce (it keeps each step's difficulty in sequence, which is what the autocorrelation is).

`fit_autocorrelation` chooses rho so that the profile model reproduces the lag-1 autocorrelation of accepted counts
measured in traces. Everything here is a model of measured counts; nothing is measured by it.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.errors import UsageError
from autotune.simulate._requests import SimRequest
from policies import AcceptanceProfile, load_json_text

__all__ = [
    "AcceptanceModel",
    "AcceptanceStream",
    "RequestTrace",
    "autocorrelation_statistic",
    "fit_autocorrelation",
    "load_traces",
]

_SQRT2 = math.sqrt(2.0)


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / _SQRT2))


@dataclass(frozen=True)
class RequestTrace:
    """One request's recorded decode steps: ``steps[n] = (verified drafts, accepted drafts)`` (measured)."""

    cls: str
    steps: tuple[tuple[int, int], ...]
    phase: str = ""

    def __post_init__(self) -> None:
        for n, (d, a) in enumerate(self.steps):
            if d < 0 or not 0 <= a <= d:
                raise UsageError(
                    f"trace of class {self.cls!r}, step {n}: need 0 <= accepted <= verified drafts, but got "
                    f"verified={d}, accepted={a}."
                )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestTrace:
        return cls(
            str(data["class"]),
            tuple((int(d), int(a)) for d, a in data["steps"]),
            str(data.get("phase", "")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "phase": self.phase, "steps": [list(s) for s in self.steps]}


def load_traces(path: str | Path) -> list[RequestTrace]:
    """Traces from a JSON file: the scheduler plugin's stats (its ``traces`` list) or a bare list of traces.

    Each trace is ``{"class": str, "phase": str, "steps": [[verified, accepted], ...]}``. The plugin records a
    request's prefill step(s) as ``[0, 0]`` too; leading ``[0, 0]`` steps are dropped, so step n of a trace is the
    request's n-th decode step (a later ``[0, 0]`` is a decode step at depth 0 and stays). Empty traces are dropped.
    """
    p = Path(path)
    try:
        data = load_json_text(p.read_text(encoding="utf-8"))  # deep nesting and huge numbers: JSONDecodeError
    except OSError as exc:
        raise UsageError(f"{p}: cannot read traces ({exc.strerror or exc}).") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{p}: not valid JSON: {exc}.") from None
    raw = data.get("traces") if isinstance(data, Mapping) else data
    if not isinstance(raw, list):
        raise UsageError(
            f"{p}: no traces: expected the scheduler plugin's stats JSON with a 'traces' list (recorded by "
            "`peagle-tune profile` / `serve`), or a JSON list of {{class, steps}} objects."
        )
    out = []
    try:
        for t in raw:
            trace = RequestTrace.from_dict(t)
            steps = trace.steps
            start = 0
            while start < len(steps) and steps[start] == (0, 0):
                start += 1
            if start < len(steps):
                out.append(RequestTrace(trace.cls, steps[start:], trace.phase))
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{p}: malformed trace ({type(exc).__name__}: {exc}).") from None
    return out


class AcceptanceStream:
    """The accepted-draft counts of one simulated request, step after step (`accepted` once per decode step)."""

    __slots__ = ("_thresholds", "_survival", "_rho", "_keep", "_rng", "_z", "_trace", "_step")

    def __init__(
        self,
        survival: Sequence[float],
        rho: float,
        rng: random.Random,
        trace: Sequence[tuple[int, int]] = (),
    ) -> None:
        self._survival = list(survival)
        # R >= j+1 iff u > 1 - s_j; thresholds ascend because survival does not increase.
        self._thresholds = [1.0 - s for s in self._survival]
        self._rho = rho
        self._keep = math.sqrt(max(1.0 - rho * rho, 0.0))
        self._rng = rng
        self._z: float | None = None
        self._trace = trace
        self._step = 0

    def accepted(self, depth: int) -> int:
        """Accepted drafts when this step verifies ``depth`` drafts (0 when ``depth`` is 0)."""
        step = self._step
        self._step = step + 1
        if step < len(self._trace):
            return self._from_trace(self._trace[step], depth)
        z = self._z
        if z is None or self._rho == 0.0:
            z = self._rng.gauss(0.0, 1.0)
        else:
            z = self._rho * z + self._keep * self._rng.gauss(0.0, 1.0)
        self._z = z
        if depth <= 0:
            return 0
        run = bisect.bisect_left(self._thresholds, _phi(z))
        return run if run < depth else depth

    def _from_trace(self, recorded: tuple[int, int], depth: int) -> int:
        d, a = recorded
        if a < d or depth <= d:
            return a if a < depth else depth
        # All d recorded drafts accepted: positions d.. are drawn given that the run reached d.
        surv = self._survival
        reach = surv[d - 1] if d > 0 else 1.0
        if reach <= 0.0:
            return d
        u = self._rng.random()
        run = d
        while run < depth and run < len(surv) and surv[run] / reach > 1.0 - u:
            run += 1
        return run


class AcceptanceModel:
    """Per-request acceptance for the simulator: class profiles, an autocorrelation rho, optional traces.

    ``profiles``: class -> measured or published `AcceptanceProfile`; extended to ``max_k`` geometrically (a
    prediction beyond the measured depth). ``autocorrelation``: rho of the latent AR(1) over token positions, in
    [0, 1) (0: i.i.d.). ``traces``: recorded traces; request i of class c replays trace ``i mod n_c`` of that class
    (after a seeded shuffle). ``seed``: makes every stream reproducible; request i's stream depends only on the seed
    and i, so every config sees the same acceptance draws for the same request.
    """

    def __init__(
        self,
        profiles: Mapping[str, AcceptanceProfile],
        max_k: int,
        *,
        autocorrelation: float = 0.0,
        traces: Iterable[RequestTrace] = (),
        seed: int = 0,
        source: str = "profile",
    ) -> None:
        if max_k < 1:
            raise UsageError(f"max_k must be >= 1, but got {max_k}.")
        if not (math.isfinite(autocorrelation) and 0.0 <= autocorrelation < 1.0):
            raise UsageError(
                f"autocorrelation (rho of the latent acceptance state) must be in [0, 1), but got {autocorrelation}."
            )
        if not profiles:
            raise UsageError("AcceptanceModel needs at least one class profile.")
        self.profiles = dict(profiles)
        self.max_k = int(max_k)
        self.autocorrelation = float(autocorrelation)
        self.seed = int(seed)
        self.source = source
        self._survival = {c: np.diff(p.acceptance_lengths(self.max_k)).tolist() for c, p in self.profiles.items()}
        by_class: dict[str, list[RequestTrace]] = {}
        for t in traces:
            by_class.setdefault(t.cls, []).append(t)
        shuffler = random.Random(self.seed)
        for ts in by_class.values():
            shuffler.shuffle(ts)
        self.traces = by_class

    @property
    def classes(self) -> list[str]:
        return sorted(self.profiles)

    def describe(self) -> str:
        """One line naming the acceptance source, e.g. ``measured profile, i.i.d. (rho=0)``."""
        corr = "i.i.d. (rho=0)" if self.autocorrelation == 0.0 else f"autocorrelated (rho={self.autocorrelation:.2f})"
        if self.traces:
            n = sum(len(v) for v in self.traces.values())
            return f"{n} recorded traces, then {self.source}, {corr}"
        return f"{self.source}, {corr}"

    def survival(self, cls: str) -> list[float]:
        """``[s_0, ..., s_{max_k-1}]`` of a class."""
        return list(self._require(cls))

    def acceptance_length(self, cls: str, k: int) -> float:
        """AL(k) of a class under this model (the profile's, whatever rho)."""
        return 1.0 + float(sum(self._require(cls)[:k]))

    def stream(self, request: SimRequest) -> AcceptanceStream:
        """A fresh acceptance stream for one request."""
        survival = self._require(request.cls)
        rng = random.Random(self.seed * 1_000_003 + request.index)
        trace: Sequence[tuple[int, int]] = ()
        pool = self.traces.get(request.cls)
        if pool:
            trace = pool[request.index % len(pool)].steps
        return AcceptanceStream(survival, self.autocorrelation, rng, trace)

    def _require(self, cls: str) -> list[float]:
        survival = self._survival.get(cls)
        if survival is None:
            raise UsageError(
                f"no acceptance profile for request class {cls!r}; profiles cover {self.classes}. Profile that class "
                "or map it to a published benchmark."
            )
        return survival


# ---- autocorrelation from traces -------------------------------------------------------------------------------


def autocorrelation_statistic(traces: Iterable[RequestTrace]) -> tuple[float, int]:
    """(lag-1 correlation, number of pairs) of accepted counts between consecutive steps of the same request.

    Only pairs of consecutive steps at the same verified depth d >= 1 count; each count is standardised within its
    (class, depth) group first, so class and depth differences do not show up as correlation. 0 with no pairs.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    traces = list(traces)
    for t in traces:
        for d, a in t.steps:
            if d >= 1:
                groups.setdefault((t.cls, d), []).append(a)
    stats = {}
    for key, values in groups.items():
        arr = np.asarray(values, dtype=float)
        std = float(arr.std())
        stats[key] = (float(arr.mean()), std)
    xs: list[float] = []
    ys: list[float] = []
    for t in traces:
        for (d0, a0), (d1, a1) in zip(t.steps, t.steps[1:], strict=False):
            if d0 != d1 or d0 < 1:
                continue
            mean, std = stats[(t.cls, d0)]
            if std <= 0.0:
                continue
            xs.append((a0 - mean) / std)
            ys.append((a1 - mean) / std)
    if len(xs) < 3:
        return 0.0, len(xs)
    x, y = np.asarray(xs), np.asarray(ys)
    denom = float(np.sqrt((x * x).sum() * (y * y).sum()))
    return (float((x * y).sum()) / denom if denom > 0 else 0.0), len(xs)


def _synthetic(traces: Sequence[RequestTrace], model: AcceptanceModel) -> list[RequestTrace]:
    """The traces' depth sequences re-drawn from the profile model (same classes, same verified depths)."""
    out = []
    for i, t in enumerate(traces):
        stream = model.stream(SimRequest(i, t.cls, 1, 1))
        out.append(RequestTrace(t.cls, tuple((d, stream.accepted(d)) for d, _ in t.steps), t.phase))
    return out


def fit_autocorrelation(
    traces: Sequence[RequestTrace],
    profiles: Mapping[str, AcceptanceProfile],
    max_k: int,
    *,
    seed: int = 0,
    replicates: int = 3,
) -> tuple[float, float]:
    """(rho, measured statistic): the latent autocorrelation whose simulated traces match the measured lag-1
    correlation of accepted counts (`autocorrelation_statistic`).

    The simulated statistic rises with rho, so rho is found by bisection on [0, 0.99]; each evaluation re-draws the
    traces' depth sequences ``replicates`` times from the class profiles (seeded). A measured statistic at or below
    the i.i.d. one gives rho = 0. Classes of the traces without a profile are skipped.
    """
    usable = [t for t in traces if t.cls in profiles]
    measured, pairs = autocorrelation_statistic(usable)
    if pairs < 3:
        raise UsageError(
            f"the traces hold {pairs} pairs of consecutive steps at the same depth; fitting the acceptance "
            "autocorrelation needs more (record longer requests or more of them)."
        )

    def simulated(rho: float) -> float:
        values = []
        for r in range(replicates):
            model = AcceptanceModel(profiles, max_k, autocorrelation=rho, seed=seed + 7919 * r)
            values.append(autocorrelation_statistic(_synthetic(usable, model))[0])
        return float(np.mean(values))

    lo, hi = 0.0, 0.99
    if measured <= simulated(lo):
        return 0.0, measured
    if measured >= simulated(hi):
        return hi, measured
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        if simulated(mid) < measured:
            lo = mid
        else:
            hi = mid
    return round(0.5 * (lo + hi), 3), measured
