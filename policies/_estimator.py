"""Live acceptance estimator: per class and per draft position, a Beta posterior of the conditional acceptance rate.

Model. For class c and position i, the conditional rate ``a_{c,i} = P(position i accepted | 0..i-1 accepted)`` has a
Beta posterior kept as two decayed counts: successes ``S_{c,i}`` and trials ``N_{c,i}`` (drafts that reached position
i). A request that drafted K tokens and had the first A accepted adds a trial at positions ``0..min(A, K-1)`` and a
success at positions ``0..A-1`` (position A, if drafted, failed; later positions were never judged).

Forgetting. Once per engine step (`advance`) the counts are multiplied by ``decay`` (e.g. 0.98), so an observation
made t steps ago weighs ``decay**t``: the estimator remembers about ``1 / (1 - decay)`` steps (50 at 0.98) and follows
acceptance changes. A class's clock only runs in steps where the class is present (``advance(present=...)``, what the
controller passes): a class absent from the batch keeps its estimate, so a workload that returns after a long phase
of other classes starts from what was learnt about it, not from the all-class estimate. ``advance()`` without
``present`` ages every class. Decay is applied lazily when a class is touched, so `observe` is O(K).

Prior and fallback. A class seeded from a stored `AcceptanceProfile` starts with ``prior_strength`` pseudo-trials per
position at the profile's conditional rate; those counts decay like data, which keeps the prior mean until data
arrive and then lets data take over, except `ANCHOR_FRACTION` of them, which never decay: without evidence a profiled
class returns to its profile. Every class estimate is shrunk towards the global (all-class) estimate with a
fixed ``shrinkage`` pseudo-trials: ``a_{c,0} = (S_{c,0} + shrinkage * g_0) / (N_{c,0} + shrinkage)`` and, deeper,
towards ``g_i`` scaled by the class's ratio ``a_{c,0} / g_0`` (capped at rate 1; see
`AcceptanceEstimator.conditional`), so an unseen class gets exactly the global estimate and a rarely seen one leans on
it. The global estimate pools every observation (and the seeded priors, weighted equally), with a fixed Jeffreys-like
floor of one pseudo-trial at rate 0.5 so that it is defined before any data.

With no new evidence (e.g. the controller stopped verifying a position), the decayed counts shrink until the fixed
floor and the shrinkage dominate, so the estimate drifts back towards the global/uninformative value over roughly
``ln(N) / (1 - decay)`` steps for N saturated trials; the controller then probes again. `DepthController`'s
exploration requests measure such positions directly and much sooner.

Bounded. At most ``max_classes`` classes (default `MAX_CLASSES`) get their own counts; observations of any further
class feed only the global pool, and its estimate is the global one (an untracked class behaves exactly like an unseen
one). Memory and the cost of `classes`-wide work (the controller's tables, the Prometheus gauges) therefore stay flat
however many distinct labels reach the estimator.

All outputs are estimates from measured counts; AL beyond ``max_k`` is extrapolated (see `policies.acceptance_length`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from policies._acceptance import AcceptanceProfile, acceptance_length_list, acceptance_lengths

__all__ = ["MAX_CLASSES", "AcceptanceEstimator"]

MAX_CLASSES = 64
"""Most request classes tracked anywhere: classes a policy may know, class labels the plugin keeps apart, classes
with their own acceptance estimate. Beyond it labels fold into a default or "other" bucket (see `policies.plugin`)."""
ANCHOR_FRACTION = 0.25
"""Share of a stored profile's ``prior_strength`` that never decays (5 pseudo-trials per position at the default
20): small against live evidence (a class present for 50 steps holds ~50 effective trials per request), decisive
when the class has none."""

_GLOBAL = "\x00global"
_FLOOR_TRIALS = 1.0
_FLOOR_RATE = 0.5


class _Counts:
    """Decayed success/trial counts per position for one class (or the global pool). ``clock``: the steps this
    class has aged (its own time); ``step``: the clock value the counts were last decayed to.

    Plain lists, not arrays: an engine step touches a few classes with K <= 16 positions each, where list updates
    cost a fraction of numpy's per-call overhead; the read side (`AcceptanceEstimator.conditional`) converts.

    ``pending``: per-step outcomes not yet added, ``(judged, accepted) -> weight``, each weighted by
    ``decay ** -(clock at observation - step)`` so that `age` adds it with exactly the weight it would have had if
    added at once (``decay ** (clock now - clock at observation)``). A step then costs one dict update per distinct
    outcome instead of K list updates; everything is added on the next read (`age`)."""

    __slots__ = ("succ", "trials", "step", "clock", "pending")

    _MAX_PENDING_STEPS = 64  # add the pending outcomes at least this often (keeps decay ** -n far from overflow)

    def __init__(self, max_k: int, step: int) -> None:
        self.succ = [0.0] * max_k
        self.trials = [0.0] * max_k
        self.step = step
        self.clock = step
        self.pending: dict[tuple[int, int], float] = {}

    def age(self, decay: float) -> None:
        """Decay the counts to the class's own clock and add the pending outcomes."""
        if self.clock != self.step:
            f = decay ** (self.clock - self.step)
            self.succ = [x * f for x in self.succ]
            self.trials = [x * f for x in self.trials]
            self.step = self.clock
        else:
            f = 1.0
        if self.pending:
            pending, self.pending = self.pending, {}
            for (judged, accepted), w in pending.items():
                self.add_pair(judged, accepted, w * f)

    def defer(self, outcomes: Mapping[tuple[int, int], float], decay: float, inverse_powers: Sequence[float]) -> None:
        """Queue ``(judged, accepted) -> drafts`` observed now (at ``clock``); added by the next `age`.
        ``inverse_powers[n]``: ``decay ** -n`` for n <= `_MAX_PENDING_STEPS` (computed once per estimator)."""
        lag = self.clock - self.step
        if lag > self._MAX_PENDING_STEPS:
            self.age(decay)
            lag = 0
        scale = inverse_powers[lag] if lag else 1.0
        pending = self.pending
        for key, m in outcomes.items():
            pending[key] = pending.get(key, 0.0) + m * scale

    def add(self, trials: Sequence[float], succ: Sequence[float]) -> None:
        t, s = self.trials, self.succ
        for i, v in enumerate(trials):
            t[i] += v
        for i, v in enumerate(succ):
            s[i] += v

    def add_pair(self, judged: int, accepted: int, m: float) -> None:
        """``m`` drafts judged at positions < ``judged`` and accepted at positions < ``accepted``."""
        t, s = self.trials, self.succ
        for i in range(judged):
            t[i] += m
        for i in range(accepted):
            s[i] += m


class AcceptanceEstimator:
    """Online per-class, per-position acceptance estimate with exponential forgetting (see module docstring).

    ``max_k``: deepest position tracked (the drafter's K). ``decay``: count multiplier per engine step, in (0, 1].
    ``shrinkage``: pseudo-trials pulling each class towards the global estimate. ``max_classes``: classes with their
    own counts; later classes share the global estimate.
    """

    def __init__(
        self, max_k: int, *, decay: float = 0.98, shrinkage: float = 2.0, max_classes: int = MAX_CLASSES
    ) -> None:
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1 (the drafter's K), but got {max_k}.")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1] (1 = never forget), e.g. 0.98, but got {decay}.")
        if not (math.isfinite(shrinkage) and shrinkage > 0):
            raise ValueError(f"shrinkage must be a finite number of pseudo-trials > 0, but got {shrinkage}.")
        if isinstance(max_classes, bool) or not isinstance(max_classes, int) or max_classes < 0:
            raise ValueError(f"max_classes must be an integer >= 0, but got {max_classes!r}.")
        self.max_k = int(max_k)
        self.max_classes = max_classes
        self.decay = float(decay)
        self.shrinkage = float(shrinkage)
        self._step = 0
        self._classes: dict[str, _Counts] = {}
        self._global = _Counts(self.max_k, 0)
        self._inverse_powers = [self.decay ** -n if n else 1.0 for n in range(_Counts._MAX_PENDING_STEPS + 1)]
        # class -> (trials, successes) per position that never decay: a stored profile's anchor (`from_profiles`)
        self._anchors: dict[str, tuple[list[float], list[float]]] = {}

    @classmethod
    def from_profiles(
        cls,
        profiles: Mapping[str, AcceptanceProfile],
        *,
        max_k: int | None = None,
        prior_strength: float = 20.0,
        decay: float = 0.98,
        shrinkage: float = 2.0,
        max_classes: int = MAX_CLASSES,
    ) -> AcceptanceEstimator:
        """An estimator seeded with stored profiles, each worth ``prior_strength`` pseudo-trials per position.

        ``max_k`` defaults to the deepest profile; shallower profiles are extended geometrically with their last
        conditional rate (a prediction). Profiles beyond ``max_classes`` still inform the global estimate.
        """
        if not (math.isfinite(prior_strength) and prior_strength >= 0):
            raise ValueError(f"prior_strength must be a finite number of pseudo-trials >= 0, but got {prior_strength}.")
        depth = max_k if max_k is not None else max((p.max_k for p in profiles.values()), default=0)
        if depth < 1:
            raise ValueError("from_profiles needs max_k >= 1 or at least one profile to take the depth from.")
        est = cls(depth, decay=decay, shrinkage=shrinkage, max_classes=max_classes)
        for name, profile in profiles.items():
            survival = np.diff(profile.acceptance_lengths(depth))
            prev = np.concatenate(([1.0], survival[:-1]))
            rates = np.divide(survival, prev, out=np.zeros_like(survival), where=prev > 0)
            trials, succ = [prior_strength] * depth, (prior_strength * rates).tolist()
            counts = est._counts(name)
            if counts is not None:
                counts.add(trials, succ)
                anchor = prior_strength * ANCHOR_FRACTION
                est._anchors[name] = ([anchor] * depth, (anchor * rates).tolist())
            est._global.add(trials, succ)
        return est

    # ---- observing ----------------------------------------------------------------------------------------------
    def observe(self, cls: str, num_drafted: int, num_accepted: int) -> None:
        """One request's step result: it verified ``num_drafted`` draft tokens and the first ``num_accepted`` were
        accepted (measured). O(K)."""
        self._check(num_drafted, num_accepted)
        if num_drafted == 0:
            return
        judged = min(num_accepted + 1, num_drafted)
        for counts in self._targets(cls):
            counts.age(self.decay)
            counts.add_pair(judged, num_accepted, 1.0)

    def observe_counts(self, cls: str, outcomes: Mapping[tuple[int, int], int]) -> None:
        """One step's requests of one class as ``{(drafted, accepted): number of requests}`` (what the scheduler
        plugin aggregates per class). O(distinct outcomes * K), independent of the number of requests."""
        judged_outcomes: dict[tuple[int, int], float] = {}
        max_k = self.max_k
        for (drafted, accepted), m in outcomes.items():
            if drafted == 0 or m == 0:
                continue
            if not (0 <= accepted <= drafted <= max_k):
                self._check(drafted, accepted)
            key = (accepted + 1 if accepted < drafted else drafted, accepted)
            judged_outcomes[key] = judged_outcomes.get(key, 0.0) + m
        if judged_outcomes:
            counts = self._classes.get(cls)
            if counts is None:
                counts = self._counts(cls)
            decay, powers = self.decay, self._inverse_powers
            if counts is not None:
                counts.defer(judged_outcomes, decay, powers)
            self._global.defer(judged_outcomes, decay, powers)

    def observe_many(
        self, cls: str, num_drafted: Sequence[int] | np.ndarray, num_accepted: Sequence[int] | np.ndarray
    ) -> None:
        """Several requests of one class in one step, vectorised: O(n + K) instead of O(n * K)."""
        drafted = np.asarray(num_drafted, dtype=np.int64)
        accepted = np.asarray(num_accepted, dtype=np.int64)
        if drafted.shape != accepted.shape or drafted.ndim != 1:
            raise ValueError(
                f"num_drafted and num_accepted must be 1-D and the same length, but got shapes {drafted.shape} "
                f"and {accepted.shape}."
            )
        if drafted.size == 0:
            return
        if accepted.min() < 0 or (accepted > drafted).any() or drafted.max() > self.max_k:
            bad = int(np.argmax((accepted < 0) | (accepted > drafted) | (drafted > self.max_k)))
            self._check(int(drafted[bad]), int(accepted[bad]))
        k = self.max_k
        # succ_i = #(A > i); trials_i = #(A >= i and K > i) = #(A >= i) - #(A == K == i), since A <= K.
        acc_hist = np.bincount(accepted, minlength=k + 1)[: k + 1]
        at_least = drafted.size - np.concatenate(([0], np.cumsum(acc_hist)[:-1]))  # #(A >= i), i = 0..k
        full = accepted[accepted == drafted]
        full_hist = np.bincount(full, minlength=k + 1)[: k + 1]
        trials = (at_least - full_hist)[:k].astype(float).tolist()
        succ = at_least[1 : k + 1].astype(float).tolist()
        for counts in self._targets(cls):
            counts.age(self.decay)
            counts.add(trials, succ)

    def advance(self, steps: int = 1, present: Iterable[str] | None = None) -> None:
        """Mark the end of ``steps`` engine steps: older observations now weigh ``decay`` times less.

        ``present``: the classes that were in the batch; only they (and the global pool) age, a class absent from
        the steps keeps its estimate. None ages every class. O(len(present)), or O(classes) with None.
        """
        if steps < 0:
            raise ValueError(f"steps must be >= 0, but got {steps}.")
        self._step += steps
        self._global.clock += steps
        classes = self._classes
        if present is None:
            for counts in classes.values():
                counts.clock += steps
            return
        for cls in present:
            found = classes.get(cls)
            if found is not None:
                found.clock += steps

    # ---- estimates -------------------------------------------------------------------------------------------------
    def global_conditional(self) -> np.ndarray:
        """Conditional acceptance rate per position pooled over all classes, shape ``(max_k,)``."""
        return np.asarray(self._global_rates())

    def conditional(self, cls: str) -> np.ndarray:
        """Estimated conditional acceptance rate per position for ``cls`` (posterior mean), shape ``(max_k,)``.

        An unseen class gets the global estimate. A class is shrunk at position 0 towards the global rate, and at
        deeper positions towards the global rate scaled by the class's own ratio to it at position 0 (capped at 1):
        every draft is judged at position 0, but only the accepted ones reach the next positions, so a class that
        rarely accepts has almost no trials deeper. Shrinking those positions to the plain pooled rate (dominated by
        the classes that do accept) made such a class look good exactly where it was never measured (benchmark: an
        entropic class, 0.23 at position 0 and 0 beyond, was estimated at AL(4) ~1.75 instead of 1.23 once its
        prior had decayed, and was verified at depth 4). A class seeded from a profile also keeps a fraction of its
        prior that never decays (`ANCHOR_FRACTION`), so with no evidence it returns to its profile, not to the pooled
        rate: evidence then comes from exploration, not from a drift that turned a measured-bad class back on.
        """
        return np.asarray(self._class_rates(cls, self._global_rates()))

    def survival(self, cls: str) -> np.ndarray:
        """Estimated ``P(first i+1 drafts accepted)`` per position for ``cls``: the running product of `conditional`."""
        return np.cumprod(self.conditional(cls))

    def acceptance_length(self, cls: str, k: int) -> float:
        """Estimated AL(k) for ``cls`` in tokens per request per step (bonus token included)."""
        if k < 0:
            raise ValueError(f"k must be >= 0, but got k={k}.")
        return float(acceptance_lengths(self.survival(cls), k)[k])

    def acceptance_lengths(self, cls: str, max_k: int | None = None) -> np.ndarray:
        """``[AL(0), ..., AL(max_k)]`` for ``cls`` (default up to the estimator's max_k)."""
        return acceptance_lengths(self.survival(cls), self.max_k if max_k is None else max_k)

    def acceptance_length_tables(self, classes: Iterable[str], max_k: int | None = None) -> dict[str, list[float]]:
        """`acceptance_lengths` of several classes as plain lists, the global estimate computed once: what the depth
        controller rebuilds its tables with at every refresh (a few positions per class, where numpy's per-call
        overhead was most of the refresh)."""
        depth = self.max_k if max_k is None else max_k
        g = self._global_rates()
        out = {}
        for cls in classes:
            survival, running = [], 1.0
            for rate in self._class_rates(cls, g):
                running *= rate
                survival.append(running)
            out[cls] = acceptance_length_list(survival, depth)
        return out

    def effective_trials(self, cls: str) -> float:
        """Decayed number of drafts observed for ``cls`` at position 0 (0 for an unseen class): how much the
        estimate rests on data rather than on the global fallback."""
        counts = self._classes.get(cls)
        if counts is None:
            return 0.0
        counts.age(self.decay)
        return float(counts.trials[0])

    def classes(self) -> list[str]:
        """Classes with their own counts (a seeded prior or observations); at most ``max_classes``."""
        return list(self._classes)

    def to_profile(self, cls: str, num_drafts: int = 1000) -> AcceptanceProfile:
        """The current estimate for ``cls`` as a profile with ``num_drafts`` pseudo-counts (for recording)."""
        return AcceptanceProfile.from_survival(self.survival(cls).tolist(), num_drafts=num_drafts)

    # ---- internals ---------------------------------------------------------------------------------------------------
    def _global_rates(self) -> list[float]:
        g = self._global
        g.age(self.decay)
        floor_succ = _FLOOR_TRIALS * _FLOOR_RATE
        return [(x + floor_succ) / (n + _FLOOR_TRIALS) for x, n in zip(g.succ, g.trials, strict=True)]

    def _class_rates(self, cls: str, g: list[float]) -> list[float]:
        """`conditional` given the global rates ``g`` (plain floats)."""
        counts = self._classes.get(cls)
        if counts is None:
            return list(g)
        counts.age(self.decay)
        succ, trials, shrink = counts.succ, counts.trials, self.shrinkage
        anchor = self._anchors.get(cls)
        if anchor is not None:
            trials = [n + a for n, a in zip(trials, anchor[0], strict=True)]
            succ = [x + a for x, a in zip(succ, anchor[1], strict=True)]
        first = (succ[0] + shrink * g[0]) / (trials[0] + shrink)
        scale = first / g[0]
        target = [g[0]] + [min(r * scale, 1.0) for r in g[1:]]
        return [(x + shrink * t) / (n + shrink) for x, t, n in zip(succ, target, trials, strict=True)]

    def _counts(self, cls: str) -> _Counts | None:
        """The class's counts, created on first use while fewer than ``max_classes`` exist (None beyond)."""
        counts = self._classes.get(cls)
        if counts is None:
            if not isinstance(cls, str):
                raise TypeError(f"A request class must be a string, but got {cls!r} ({type(cls).__name__}).")
            if len(self._classes) >= self.max_classes:
                return None
            counts = self._classes[cls] = _Counts(self.max_k, self._step)
        return counts

    def _targets(self, cls: str) -> tuple[_Counts, ...]:
        counts = self._counts(cls)
        return (self._global,) if counts is None else (counts, self._global)

    def _check(self, num_drafted: int, num_accepted: int) -> None:
        if not 0 <= num_drafted <= self.max_k:
            raise ValueError(
                f"num_drafted must be in [0, max_k={self.max_k}], but got {num_drafted}. Build the estimator with "
                "max_k >= the drafter's K."
            )
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(
                f"num_accepted must be in [0, num_drafted={num_drafted}], but got {num_accepted}."
            )
