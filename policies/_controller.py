"""Depth controller: per engine step, choose the verified draft depth of every request to maximise predicted goodput.

Objective. For a batch of B requests with depths K_r, the expected tokens produced in the step are
``N = sum_r AL_r(K_r)`` (AL from the live `AcceptanceEstimator`, per request class) and the step time is predicted by
the `StepCostModel` from the *total verified tokens* ``V = sum_r (K_r + 1)``:
``T = base(B) + c_tok * V + drafter(B, D)``. Modelling T in V (not in a per-request K) is what makes per-request depths
priceable, and for a uniform depth it is exactly ``T(B, K)`` because then ``V = B (K + 1)``. The drafter term is paid
when any request speculates, or always when ``drafter_always_runs`` (depth applied by trimming drafts in the vLLM
scheduler: the P-EAGLE drafter ran at its configured K anyway). Goodput ``G = 1000 * N / T`` tokens/s.

Optimisation. Giving request r one more verified token (position i) adds ``s_{r,i}`` (its survival at i) to N and
``c_tok`` to T. The best set of positions for a ratio objective with a linear cost is a threshold set (Dinkelbach):
take every (request, position) whose gain is >= some threshold. Survival is non-increasing in the position, so sorting
the (class, position) gains once and sweeping prefixes gives the exact optimum for one drafting depth; requests of one
class with the same cap/floor are one cohort, so a step costs O(classes * max_k), not O(B * max_k). For sequential
drafting the drafter cost grows with the deepest request D, so the sweep runs once per D.

Stability and cost. Per-class AL tables and the cost coefficients are refreshed every ``refresh_every`` decisions,
not every step; between refreshes the optimisation is re-run only when ``reoptimize_churn`` (5%) of the batch has
changed, otherwise the last optimum is re-priced on the current batch. A `TrackedBatch` (kept up to date by the
scheduler's add/remove) makes a step independent of B. A new plan replaces the current one only if its predicted
goodput beats the current plan's (on the same batch) by more than ``hysteresis`` (e.g. 3%), or if the same new plan
has been preferred for ``patience`` consecutive steps.

Switching the drafter on. With drafter-width control an idle drafter is skipped; turning it back on costs a catch-up:
the drafter replays the tokens generated while it was off. It is priced at one drafter pass over the batch until the
controller has measured such a step (`catch_up_ms`: the step's time beyond a drafting step of its shape, per request
turned on; those steps stay out of the step-cost fit). A plan that turns the drafter on must beat the current one by
the hysteresis plus that catch-up spread over a drafting run (``run_steps``, then the mean length of the
controller's own runs): a batch where speculation only breaks even stays off instead of flapping.

Exploration. Every ``explore_every`` steps one request per class that runs below its cap verifies at its cap, so
acceptance at positions the plan no longer verifies keeps being measured (at K=0 nothing would be measured and only
the estimator's slow drift back to its prior would ever restart speculation). While the drafter is off an exploration
also pays its catch-up and a drafter pass, so it happens only as often as keeps that within ``explore_budget`` of
the step time.

Robustness. `decide` raises ordinary exceptions (never swallows them); a caller that must not fail uses
`decide_or_fallback`, which returns the static depth (`fallback_depth`) with ``fallback=True``.
Everything `decide` reports (goodput, step time) is predicted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from policies._batch import Cohort, Decision, RequestView, StepTally, TrackedBatch, cohort_of
from policies._estimator import AcceptanceEstimator
from policies._settings import ControllerSettings
from policies._step_cost import StepCostModel, StepSample

__all__ = ["DepthController"]

_OUTLIER_FACTOR = 4.0
"""A pooled step shape slower than this many times the cost model's prediction is not learnt (see
`DepthController._learn_step_costs`)."""

@dataclass
class _Tables:
    al: dict[str, list[float]]  # class -> [AL(0), ..., AL(max_k)]
    order: list[tuple[str, int, float]]  # (class, position, survival gain), best gain first
    base_ms: float  # c0 (per step)
    per_request_ms: float  # c1
    per_token_ms: float  # c2
    drafter_ms: float  # c3
    drafter_per_request_ms: float  # c4
    per_pass_ms: float  # c5 (sequential)
    per_pass_request_ms: float  # c6 (sequential)
    piecewise_ms: float = 0.0  # c7: a step that is not the uniform FULL-graph step (0 without FULL graphs)
    full_tokens: int = 0  # tokens per request of the uniform FULL-graph step (1 + the launch's K)


class DepthController:
    """Chooses per-request verified depths each engine step (see the module docstring for the model).

    ``max_k``: the drafter's K (deepest depth). ``static_k``: the offline-tuned depth, used as `fallback_depth`.
    Other keyword arguments are the fields of `ControllerSettings` (or pass ``settings=``).
    """

    def __init__(
        self,
        cost_model: StepCostModel,
        estimator: AcceptanceEstimator,
        max_k: int,
        static_k: int,
        hysteresis: float = 0.03,
        *,
        settings: ControllerSettings | None = None,
        **options: Any,
    ) -> None:
        if settings is None:
            settings = ControllerSettings(hysteresis=hysteresis, **options)
        elif options or hysteresis != 0.03:
            raise ValueError("Pass either settings= or individual options (hysteresis=..., ...), not both.")
        if max_k < 0:
            raise ValueError(f"max_k must be >= 0, but got {max_k}.")
        if not 0 <= static_k <= max_k:
            raise ValueError(f"static_k must be in [0, max_k={max_k}], but got {static_k}.")
        if estimator.max_k < max_k:
            raise ValueError(
                f"The estimator tracks {estimator.max_k} positions but the controller may verify max_k={max_k}: "
                f"build the estimator with max_k >= {max_k}."
            )
        self.cost_model = cost_model
        self.estimator = estimator
        self.max_k = int(max_k)
        self.static_k = int(static_k)
        self.settings = settings
        self._tables: _Tables | None = None
        self._decisions = 0
        self._plan: dict[str, int] = {}
        self._candidate: dict[str, int] | None = None
        self._streak = 0
        self._last: tuple[object, Decision] | None = None
        self._best: dict[str, int] | None = None  # last optimum, valid until refresh or enough churn
        self._best_mark: tuple[int, int] | dict[Cohort, int] = {}
        # The last optimisation's inputs (tables, settings, batch size, cohort counts) and result: a batch whose
        # replaced requests leave its composition as it was optimises to the same plan.
        self._optimum_of: tuple[_Tables, ControllerSettings, int, dict[Cohort, int]] | None = None
        self._optimum_plan: dict[str, int] = {}
        self._pending_samples: dict[tuple[int, int, int, bool], list[float]] = {}  # shape -> [steps, summed ms]
        self._drafting = 0  # drafting depth of the last decision: the drafter's width in the step it was made for
        self._since_explore = 0  # decisions since the last exploration
        self._idle_wait: float | None = None  # budgeted exploration interval while idle, as of the last full decision
        self._run = 0  # decisions of the current drafting run (plan depth > 0), 0 while the plan keeps it off
        self._turn_on: tuple[float, int] | None = None  # (predicted ms without the replay, requests turned on)
        self.catch_up_ms: float | None = None
        """Measured extra time per request of the step that turns an idle drafter on (its replay of the tokens the
        drafter missed), ms, averaged over such steps; None until one was measured (then a drafter pass over the
        batch is assumed)."""
        self.run_steps = float(settings.run_steps)
        """Mean length of the plan's drafting runs, decisions (starts at ``run_steps``; learnt from the runs)."""
        self.switches = 0
        """Number of plan changes so far (for monitoring flapping)."""

    @property
    def fallback_depth(self) -> int:
        """The depth to use when the controller cannot decide: the offline-tuned static K."""
        return self.static_k

    @property
    def plan(self) -> dict[str, int]:
        """The current depth per class (before caps/floors)."""
        return dict(self._plan)

    # ---- deciding -----------------------------------------------------------------------------------------------
    def decide(self, batch: Sequence[RequestView] | TrackedBatch) -> Decision:
        """Depth per request for this step. Raises on bad input or internal failure (see `decide_or_fallback`).

        ``batch``: the requests of the step, as a sequence (counted each call, O(B)) or a `TrackedBatch` the caller
        keeps up to date (O(classes * max_k) per call, independent of B).
        """
        self._decisions += 1
        refreshed = False
        if self._tables is None or self._decisions % self.settings.refresh_every == 0:
            self.refresh()
            refreshed = True
        tables = self._tables
        assert tables is not None
        # Turning an idle drafter on (drafter-width control) costs one extra drafter pass: it replays the tokens the
        # requests generated while it was off (measured at batch 8: 5.3 ms drafting that step vs 2.7 ms a pass).
        drafter_was_off = self._drafting == 0 and not self.settings.drafter_always_runs
        self._since_explore += 1
        explore_now = self.settings.explore_every > 0 and self._since_explore >= self.settings.explore_every
        if explore_now and drafter_was_off and self._idle_wait is not None:
            # Idle drafter: the budgeted interval of the last full decision holds until anything changes (the batch,
            # the tables), so the same-batch fast path below stays open between explorations.
            explore_now = self._since_explore >= self._idle_wait
        if isinstance(batch, TrackedBatch):
            counts: Mapping[Cohort, int] = batch.counts
            key: object = (id(batch), batch.version)
        else:
            counts = Counter(map(cohort_of, batch))
            key = counts
        last = self._last
        if not refreshed and not explore_now and self._candidate is None and last is not None and last[0] == key:
            # Same composition, same tables, stable plan: the answer cannot change.
            d = last[1]
            self._drafting = d.batch_depth
            if d.batch is batch:
                return d
            return Decision(d.plan, d.default_depth, d.max_k, d.batch_depth, d.predicted_goodput,
                            d.predicted_step_ms, batch)
        present = {c[0] for c in counts}
        for cls in present - tables.al.keys():
            self._add_class(tables, cls)
        size = len(batch)
        best_plan = self._best
        if best_plan is None or self._churned(batch, counts, size) or not present <= best_plan.keys():
            best_plan = self._optimum(tables, counts, size)
            self._best = best_plan
            self._best_mark = (id(batch), batch.changes) if isinstance(batch, TrackedBatch) else dict(counts)
        if len(best_plan) != len(present):
            best_plan = {c: k for c, k in best_plan.items() if c in present}
        current = self._plan
        merged = {c: current.get(c, k) for c, k in best_plan.items()}  # new classes adopt the best depth at once
        n_cur, ms_cur, depth_cur = self._evaluate(tables, counts, size, merged)
        if merged != best_plan:
            n_best, ms_best, depth_best = self._evaluate(tables, counts, size, best_plan)
            same_candidate = self._candidate == best_plan
            self._streak = self._streak + 1 if same_candidate else 1
            self._candidate = best_plan
            gain = n_best * ms_cur / (n_cur * ms_best) - 1.0
            need = self.settings.hysteresis
            if drafter_was_off and depth_best > 0:  # the catch-up pass, spread over a drafting run
                on = sum(m for c, m in counts.items() if best_plan.get(c[0], 0) > 0)
                need += self._catch_up_ms(tables, size, on) / (self.run_steps * ms_best)
            if gain > need or self._streak >= self.settings.patience:
                self.switches += 1
                self._candidate, self._streak = None, 0
                merged, n_cur, ms_cur, depth_cur = best_plan, n_best, ms_best, depth_best
        else:
            self._candidate, self._streak = None, 0
        current.update(merged)
        self._track_run(depth_cur)
        self._idle_wait = None
        if drafter_was_off and depth_cur == 0:
            self._idle_wait = self._idle_explore_interval(tables, size, ms_cur)
            explore_now = explore_now and self._since_explore >= self._idle_wait
        explore: frozenset[str] = frozenset()
        if explore_now:
            explore = self._pick_explorers(batch, counts, merged)
            self._since_explore = 0
        max_k = self.max_k
        batch_depth = depth_cur
        for rid in explore:
            view = batch.get(rid) if isinstance(batch, TrackedBatch) else None
            if view is None:
                view = next(v for v in batch if v.request_id == rid)
            batch_depth = max(batch_depth, max_k if view.max_k is None else min(view.max_k, max_k))
        decision = Decision(
            MappingProxyType(merged), self.static_k, max_k, batch_depth, 1000.0 * n_cur / ms_cur, ms_cur, batch, explore
        )
        self._last = (key, decision) if not explore else None
        self._drafting = batch_depth
        self._turn_on = None
        if drafter_was_off and batch_depth > 0:  # measured by `observe_tally` as `catch_up_ms`
            on = sum(m for c, m in counts.items() if merged.get(c[0], 0) > 0) + len(explore)
            self._turn_on = (self._step_ms(tables, size, size, True, batch_depth), max(on, 1))
        return decision

    def decide_or_fallback(self, batch: Sequence[RequestView] | TrackedBatch) -> Decision:
        """`decide`, but any exception yields `fallback_decision` (``fallback=True``, ``reason`` = the error)."""
        try:
            return self.decide(batch)
        except Exception as exc:  # noqa: BLE001 - the engine must keep serving; the reason is reported
            return self.fallback_decision(batch, reason=f"{type(exc).__name__}: {exc}")

    def fallback_decision(
        self, batch: Sequence[RequestView] | TrackedBatch, reason: str = "fallback requested"
    ) -> Decision:
        """Every request at `fallback_depth` (clamped to its cap/floor, 0 if opted out); no prediction."""
        d = Decision({}, self.static_k, self.max_k, 0, math.nan, math.nan, batch, fallback=True, reason=reason)
        depth = max((d.depth_for(v) for v in batch), default=0)
        self._drafting = depth
        return Decision({}, self.static_k, self.max_k, depth, math.nan, math.nan, batch, fallback=True, reason=reason)

    # ---- learning ------------------------------------------------------------------------------------------------
    def observe_step(
        self,
        results: Sequence[tuple[str, str, int, int]],
        step_ms: float | None = None,
        drafting_depth: int | None = None,
    ) -> None:
        """Feed one step's measured outcome: ``(request_id, class, drafted, accepted)`` per request in the step.

        ``drafted``: draft tokens the request verified (0 if it did not speculate); ``accepted``: how many of them
        (a prefix) were accepted. ``step_ms``: measured step time, ms; pass None for steps that also ran prefill,
        which the decode-step cost model does not describe. The outcomes are counted per class (so the work per
        step grows with the distinct outcomes, not with B), feed the estimator, and age only the classes present
        in the step (a class absent from the batch keeps its estimate). Step times of the same shape (B, verified
        tokens, drafter ran) are pooled and refine the cost model at the next refresh if ``learn_step_cost``. New
        estimates are used from the next refresh.

        ``drafting_depth``: drafts per request the drafter proposed in this step (for the NEXT step), which is what
        decides whether the drafter ran; None: the deepest depth of this controller's last decision, which is this
        step's under synchronous scheduling (decide at schedule(n), observe after step n). It is not the depth
        verified in this step (decided one step earlier): labelling by the verified depth called the first step after
        a switch to depth 0 a drafter step and the first step after a switch back a drafter-free one, and the cost
        model learnt a nearly free drafter (the c=1 benchmark: 245 steps verifying 4 drafts without a drafter pass at
        4.45 ms, 243 drafting without verifying at 6.31 ms, against 3.7 ms off-steps).
        """
        tally = StepTally()
        for _rid, cls, drafted, accepted in results:
            tally.add(cls, "", drafted, accepted)
        self.observe_tally(tally, step_ms, drafting_depth)

    def observe_tally(
        self, tally: StepTally, step_ms: float | None = None, drafting_depth: int | None = None
    ) -> None:
        """`observe_step` for a step already counted per class (what the scheduler plugin passes)."""
        estimator = self.estimator
        observe = estimator.observe_counts
        for (cls, _phase), outcomes in tally.outcomes.items():
            observe(cls, outcomes)
        estimator.advance(present={cls for cls, _phase in tally.outcomes})
        turn_on, self._turn_on = self._turn_on, None
        if turn_on is not None and step_ms is not None and tally.size and (drafting_depth or 0) > 0:
            # The step that turned the drafter on: what it took beyond a drafting step of its shape is the replay
            # of the missed tokens, a cost of switching, not of drafting (left out of the step-cost model).
            extra = max(float(step_ms) - turn_on[0], 0.0) / turn_on[1]
            last = self.catch_up_ms
            self.catch_up_ms = extra if last is None else last + 0.2 * (extra - last)
            return
        if step_ms is not None and tally.size and self.settings.learn_step_cost:
            always = self.settings.drafter_always_runs
            drafting = self._drafting if drafting_depth is None else drafting_depth
            ran = always or drafting > 0
            depth = self.max_k if always else drafting
            shape = (tally.size, depth, tally.verified, ran)
            pooled = self._pending_samples.get(shape)
            if pooled is None:
                self._pending_samples[shape] = [1, float(step_ms)]
            else:
                pooled[0] += 1
                pooled[1] += float(step_ms)

    def _learn_step_costs(self) -> None:
        """Feed the pooled step times to the cost model (one update per shape, weighted by its steps).

        A shape whose steps took more than `_OUTLIER_FACTOR` times the model's prediction is left out when it holds
        a minority of the pooled steps: such steps are not decode costs (first-use compilation in warm-up took
        50-380 ms against 4-13 ms, a preempted process, a garbage collection). When most pooled steps are that slow
        the model is what is wrong, and they are all learnt."""
        pending, self._pending_samples = self._pending_samples, {}
        model, tables = self.cost_model, self._tables
        samples = [StepSample(size, depth, total_ms / n, n=int(n), verified_tokens=verified, drafter_ran=ran)
                   for (size, depth, verified, ran), (n, total_ms) in pending.items()]
        # Predictions from the tables' plain-float coefficients (the model as of the last refresh): a few float
        # operations per shape, where the model's own prediction costs a numpy feature vector each.
        slow = [tables is not None
                and s.step_ms > _OUTLIER_FACTOR * self._step_ms(tables, s.batch_size, s.tokens, s.drafted, s.depth)
                for s in samples]
        outvoted = 2 * sum(s.n for s, x in zip(samples, slow, strict=True) if x) < sum(s.n for s in samples)
        for sample, is_slow in zip(samples, slow, strict=True):
            if not (is_slow and outvoted):
                model.update(sample)

    def refresh(self) -> None:
        """Rebuild the per-class AL tables and cost coefficients from the estimator and the cost model now."""
        if self._pending_samples:
            self._learn_step_costs()
        c = self.cost_model.coefficients
        tables = _Tables(
            al={}, order=[],
            base_ms=c["base"], per_request_ms=c["per_request"], per_token_ms=c["per_verified_token"],
            drafter_ms=c["drafter_fixed"], drafter_per_request_ms=c["drafter_per_request"],
            per_pass_ms=c.get("drafter_per_pass", 0.0), per_pass_request_ms=c.get("drafter_per_pass_req", 0.0),
        )
        full = self.cost_model.full_graph_depth
        if full is not None:
            tables.piecewise_ms, tables.full_tokens = c.get("piecewise", 0.0), full + 1
        classes = set(self.estimator.classes())
        if self._tables is not None:
            classes |= set(self._tables.al)
        for cls, al in self.estimator.acceptance_length_tables(sorted(classes), self.max_k).items():
            self._add_table(tables, cls, al)
        tables.order.sort(key=lambda item: (-item[2], item[1]))
        self._tables = tables
        self._last = None
        self._best = None
        self._idle_wait = None

    # ---- internals ------------------------------------------------------------------------------------------------
    def _add_class(self, tables: _Tables, cls: str) -> None:
        self._optimum_of = None
        self._add_table(tables, cls, self.estimator.acceptance_length_tables((cls,), self.max_k)[cls])
        tables.order.sort(key=lambda item: (-item[2], item[1]))

    def _add_table(self, tables: _Tables, cls: str, al: list[float]) -> None:
        """Add ``cls`` with its ``[AL(0), ..., AL(max_k)]`` to the tables (its survival gains unsorted)."""
        tables.al[cls] = al
        tables.order.extend((cls, i, al[i + 1] - al[i]) for i in range(self.max_k))

    def _drafter_pass_ms(self, t: _Tables, size: int) -> float:
        """Predicted ms of one drafter pass over ``size`` requests (the catch-up cost of turning the drafter on)."""
        return t.drafter_ms + t.drafter_per_request_ms * size + t.per_pass_ms + t.per_pass_request_ms * size

    def _catch_up_ms(self, t: _Tables, size: int, requests: int) -> float:
        """Extra ms of the step that turns an idle drafter on for ``requests`` of a batch of ``size``: measured per
        request (`catch_up_ms`) once a switch was observed, else one drafter pass over the batch."""
        if self.catch_up_ms is None:
            return self._drafter_pass_ms(t, size)
        return self.catch_up_ms * max(requests, 1)

    def _idle_explore_interval(self, t: _Tables, size: int, ms_off: float) -> float:
        """Decisions between explorations while the drafter is off, so that they cost at most ``explore_budget`` of
        the step time: an exploration turns the drafter on for one request per class (its catch-up, measured as
        `catch_up_ms`), runs a drafter pass and verifies ``max_k`` more tokens per explored class (counted as one).
        At least ``explore_every``."""
        budget = self.settings.explore_budget
        if budget <= 0:
            return math.inf
        cost = self._drafter_pass_ms(t, size) + self._catch_up_ms(t, size, 1) + t.per_token_ms * self.max_k
        return max(float(self.settings.explore_every), cost / (budget * max(ms_off, 1e-9)))

    def _track_run(self, depth: int) -> None:
        """Learn the mean length of the plan's drafting runs (exploration steps are not runs)."""
        if depth > 0:
            self._run += 1
        elif self._run:
            self.run_steps += 0.2 * (self._run - self.run_steps)
            self._run = 0

    def _churned(self, batch: Sequence[RequestView] | TrackedBatch, counts: Mapping[Cohort, int], size: int) -> bool:
        """Has more than ``reoptimize_churn`` of the batch changed since the last optimisation?"""
        limit = self.settings.reoptimize_churn * size
        mark = self._best_mark
        if isinstance(batch, TrackedBatch):
            if not isinstance(mark, tuple) or mark[0] != id(batch):
                return True
            return (batch.changes - mark[1]) / 2 > limit  # a finish plus a join is one replaced request
        if not isinstance(mark, dict):
            return True
        diff = sum(abs(m - mark.get(c, 0)) for c, m in counts.items())
        diff += sum(m for c, m in mark.items() if c not in counts)
        return diff / 2 > limit

    def _step_ms(self, t: _Tables, size: int, verified: float, drafting: bool, depth: int) -> float:
        """Predicted step ms for ``size`` requests verifying ``verified`` tokens; ``depth``: deepest request."""
        ms = t.base_ms + t.per_request_ms * size + t.per_token_ms * verified
        if t.piecewise_ms and verified != size * t.full_tokens:
            ms += t.piecewise_ms
        if drafting or self.settings.drafter_always_runs:
            passes = self.max_k if self.settings.drafter_always_runs else depth
            ms += t.drafter_ms + t.drafter_per_request_ms * size
            ms += (t.per_pass_ms + t.per_pass_request_ms * size) * passes
        return ms

    def _evaluate(
        self, t: _Tables, counts: Mapping[Cohort, int], size: int, plan: Mapping[str, int]
    ) -> tuple[float, float, int]:
        """(expected tokens N, predicted step ms T, deepest request depth) of a class plan on this batch."""
        max_k = self.max_k
        al = t.al
        n = 0.0
        verified = 0
        deepest = 0
        for (cls, lo, cap, speculate), m in counts.items():
            k = 0
            if speculate:
                hi = max_k if cap is None or cap > max_k else cap
                k = plan[cls]
                k = hi if k > hi else k
                if lo > k:
                    k = lo if lo < hi else hi
            n += m * al[cls][k]
            verified += m * (k + 1)
            if k > deepest:
                deepest = k
        return n, self._step_ms(t, size, verified, deepest > 0, deepest), deepest

    def _optimum(self, t: _Tables, counts: Mapping[Cohort, int], size: int) -> dict[str, int]:
        """The best class plan for this batch (`_best_per_request` or `_best_uniform`), a pure function of its
        arguments and the settings: reused while they are the same."""
        last = self._optimum_of
        if last is not None and last[0] is t and last[1] is self.settings and last[2] == size and last[3] == counts:
            return dict(self._optimum_plan)
        if self.settings.per_request:
            plan = self._best_per_request(t, counts, size)
        else:
            plan = self._best_uniform(t, counts, size)
        self._optimum_of, self._optimum_plan = (t, self.settings, size, dict(counts)), dict(plan)
        return plan

    def _best_uniform(self, t: _Tables, counts: Mapping[Cohort, int], size: int) -> dict[str, int]:
        classes = {c[0] for c in counts}
        best_k, best_g = 0, -math.inf
        for k in range(self.max_k + 1):
            n, ms, _ = self._evaluate(t, counts, size, dict.fromkeys(classes, k))
            g = n / ms
            if g > best_g * (1 + 1e-12):
                best_k, best_g = k, g
        return dict.fromkeys(classes, best_k)

    def _best_per_request(self, t: _Tables, counts: Mapping[Cohort, int], size: int) -> dict[str, int]:
        """Exact threshold sweep (module docstring). Returns the per-class depth of the best plan."""
        max_k = self.max_k
        al = t.al
        # Base: every request at its floor. reach[cls][i]: requests of cls that may verify position i beyond floors.
        n0 = 0.0
        v0 = 0
        floor_depth = 0
        reach: dict[str, list[int]] = {}
        for (cls, lo, cap, speculate), m in counts.items():
            hi = 0
            lo_eff = 0
            if speculate:
                hi = max_k if cap is None or cap > max_k else cap
                lo_eff = lo if lo < hi else hi
            n0 += m * al[cls][lo_eff]
            v0 += m * (lo_eff + 1)
            if lo_eff > floor_depth:
                floor_depth = lo_eff
            r = reach.get(cls)
            if r is None:
                r = reach[cls] = [0] * (max_k + 1)
            if hi > lo_eff:
                r[lo_eff] += m
                r[hi] -= m
        for r in reach.values():
            for i in range(1, max_k + 1):
                r[i] += r[i - 1]
        always = self.settings.drafter_always_runs
        sequential_cost = self.cost_model.sequential and not always
        # Every plan of the sweep is priced PIECEWISE; the one uniform FULL-graph plan is compared after it.
        fixed = t.base_ms + t.per_request_ms * size + t.piecewise_ms
        drafter = t.drafter_ms + t.drafter_per_request_ms * size
        per_pass = t.per_pass_ms + t.per_pass_request_ms * size
        per_token = t.per_token_ms
        limits = range(max(floor_depth, 1), max_k + 1) if sequential_cost else (max_k,)
        best_g, best_limit, best_cut = -math.inf, max_k, 0
        order = t.order
        for limit in limits:
            on = fixed + drafter + per_pass * (limit if sequential_cost else max_k)
            off = on if (always or floor_depth > 0) else fixed
            n, v = n0, v0
            g_here, cut_here = n / (off + per_token * v), 0
            for idx, (cls, i, gain) in enumerate(order):
                if i >= limit:
                    continue
                r = reach.get(cls)
                if r is None:
                    continue
                m = r[i]
                if m <= 0:
                    continue
                n += m * gain
                v += m
                g = n / (on + per_token * v)
                if g > g_here * (1 + 1e-12):
                    g_here, cut_here = g, idx + 1
            if g_here > best_g * (1 + 1e-12):
                best_g, best_limit, best_cut = g_here, limit, cut_here
        plan = dict.fromkeys(reach, 0)
        for cls, i, _gain in order[:best_cut]:
            r = reach.get(cls)
            if r is not None and i < best_limit and r[i] > 0 and i + 1 > plan[cls]:
                plan[cls] = i + 1
        if t.piecewise_ms and t.full_tokens == max_k + 1:
            full = dict.fromkeys(reach, max_k)
            n, ms, _ = self._evaluate(t, counts, size, full)
            if n / ms > best_g * (1 + 1e-12):
                return full
        return plan

    def _pick_explorers(
        self, batch: Sequence[RequestView] | TrackedBatch, counts: Mapping[Cohort, int], plan: Mapping[str, int]
    ) -> frozenset[str]:
        """One request per class that runs below its cap (it will verify at its cap this step)."""
        max_k = self.max_k
        chosen: dict[str, str] = {}
        if isinstance(batch, TrackedBatch):
            for cohort in counts:
                cls, lo, cap, speculate = cohort
                hi = max_k if cap is None or cap > max_k else cap
                if cls not in chosen and speculate and hi > max(plan.get(cls, 0), lo):
                    rid = batch.first_of(cohort)
                    if rid is not None:
                        chosen[cls] = rid
            return frozenset(chosen.values())
        for v in batch:
            if v.cls in chosen or not v.speculate:
                continue
            hi = max_k if v.max_k is None else min(v.max_k, max_k)
            if hi > max(plan.get(v.cls, 0), v.min_k):
                chosen[v.cls] = v.request_id
        return frozenset(chosen.values())
