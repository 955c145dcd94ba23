"""`StatsRecorder`: the plugin's statistics tables and how a step is recorded into them (`PluginStats` reads them,
`policies.plugin._stats_file` writes and loads them). Pure Python: no vLLM import.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies import StepTally
from policies.plugin.labels import MAX_CLASSES, MAX_PHASES, LabelBook

__all__ = ["StatsRecorder"]

_TRACE_IDLE_STEPS = 64
"""A request absent from this many consecutive steps has finished (or was preempted): its trace is closed."""


@dataclass
class _CostKey:
    samples: list[float]
    n: int = 0
    sum_ms: float = 0.0
    room: int = 0
    """Samples this key may keep (0: a key beyond ``max_cost_keys``, counted in ``n`` and ``sum_ms`` only)."""
    json: str | None = None
    """``json.dumps(samples)``, cached between flushes (None: the samples changed since)."""


def _pairs(flat: array[int]) -> list[list[int]]:
    """[[verified, accepted], ...] from a trace's flat array."""
    values = flat.tolist()
    return [[d, a] for d, a in zip(values[0::2], values[1::2], strict=True)]


class StatsRecorder:
    """What the plugin measured, aggregated (the engine process fills it; the parent reads it from JSON).

    Per (phase, class, verified depth d): ``num_drafts`` (requests that verified d > 0 drafts in a step) and
    ``accepted_per_position[i]`` (those whose first i+1 drafts were accepted), i < d.

    Per (phase, batch size B, uniform verified depth d or None, verified tokens V, drafting depth D) over decode-only
    steps (no prompt token in the step): the number of steps, their summed and a sample of individual step times in
    ms. A step's time runs from the entry of ``schedule()`` to the return of vLLM's ``update_from_output()`` for the
    same step (see `policies.scheduler`).

    ``totals``: drafts, draft tokens, accepted tokens and accepted per position over every step, to cross-check
    against vLLM's own ``vllm:spec_decode_*`` counters.

    Labels are bounded: at most ``max_classes`` classes and ``max_phases`` phases are kept apart (the first ones
    seen); later new labels are recorded as "other" (`policies.plugin.labels.LabelBook`) and counted in
    ``info["folded_labels"]``, so the file stays small whatever labels requests carry.

    Bounded shapes: the first ``max_cost_keys`` step shapes keep their samples; later shapes (a long session that
    meets many batch sizes and verified-token counts) keep their step count and summed time only, so the file stops
    growing; `step_samples` then uses their mean instead of a median (the cost model is fitted per shape either way),
    and ``info["step_cost_keys_without_samples"]`` says how many there are.

    ``traces`` (when `observe_step` gets request ids): per request, its (verified, accepted) drafts step by step, for
    the simulator (`autotune.simulate`). Bounded: at most ``max_trace_steps`` steps per request and ``max_traces``
    finished requests, a uniform reservoir sample of the requests in arrival order (`admit_trace`, which decides when
    a request is first seen, so a request that will not be kept costs nothing per step: once the reservoir is full,
    almost none are traced); a request unseen for ``_TRACE_IDLE_STEPS`` steps is finished, and one that never
    verified a draft is dropped then.
    """

    def __init__(
        self,
        *,
        max_samples_per_key: int = 512,
        max_cost_keys: int = 256,
        seed: int = 0,
        max_traces: int = 64,
        max_trace_steps: int = 256,
        max_classes: int = MAX_CLASSES,
        max_phases: int = MAX_PHASES,
    ) -> None:
        self.max_samples_per_key = max_samples_per_key
        self.max_cost_keys = max_cost_keys
        # Bounded labels: at most max_classes classes and max_phases phases are kept apart; later new labels are
        # recorded under "other", so the file's size does not grow with the number of distinct labels clients send.
        self._class_labels = LabelBook(max_classes)
        self._phase_labels = LabelBook(max_phases)
        self._admitted: dict[tuple[str, str], tuple[str, str]] = {}  # (class, phase) pairs admitted unfolded
        self.max_traces = max_traces
        self.max_trace_steps = max_trace_steps
        # request id -> (class, phase, steps, [last step seen]); steps flat: verified, accepted, verified, ... (an
        # array, not a list of pairs: no object per request-step for the garbage collector to count and scan)
        self._open_traces: dict[str, tuple[str, str, array[int], list[int]]] = {}
        self._traces: list[dict[str, Any]] = []
        self._trace_json: list[str | None] = []  # json.dumps of each finished trace, cached (they never change)
        self._trace_offers = 0  # requests offered to the trace reservoir (`admit_trace`)
        self._untraced: dict[str, int] = {}  # request id -> last step seen, for requests `admit_trace` turned down
        self.info: dict[str, Any] = {}
        """Engine facts the plugin saw (K, method, parallel drafting, drafting-depth lowering, mode)."""
        self.steps = 0
        """Engine steps seen (every update_from_output with scheduled tokens)."""
        self.decode_steps = 0
        self.mixed_steps = 0
        """Steps that also computed prompt tokens (excluded from the step-cost samples)."""
        self.mixed_costs: dict[tuple[str, bool], list[float]] = {}
        """Those steps timed, by (phase, whether the drafter ran): [steps, summed ms, prompt tokens, requests]. What a
        request's admission costs beyond its decode steps (the drafter reads the prompt too), which the decode-step
        samples leave out."""
        self.fallback = False
        self.errors: list[str] = []
        self.overhead_ms = 0.0
        """Wall time spent in the plugin's own logic (decisions, trimming, bookkeeping), ms."""
        self.draft_fetches = 0
        """Draft fetches timed (the engine core's ``take_draft_token_ids`` after a step; none after an off-step)."""
        self.draft_fetch_ms = 0.0
        """Their summed wall time, ms (host time outside ``step_ms``)."""
        self.between_steps: dict[str, list[float]] = {}
        """Wall time from the end of one step (after the plugin's bookkeeping in ``update_from_output``) to the start
        of the next while requests were unfinished, i.e. the engine core's work between steps (the draft fetch and
        ``update_draft_token_ids``, outputs to the client, new requests), by whether the drafter ran in the step
        before (``"drafter"``, ``"no_drafter"``): [count, summed ms]. Synchronous scheduling only (async overlaps
        steps)."""
        self._acceptance: dict[tuple[str, str, int], list[int]] = {}  # -> [num_drafts, acc_0, ..., acc_{d-1}]
        self._costs: dict[tuple[str, int, int | None, int, int], _CostKey] = {}
        # `totals` and `class_counts` are sums over the acceptance rows (not counted step by step); a loaded file
        # whose totals differ from its rows keeps the difference here.
        self._totals_offset = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self._per_pos_offset: list[int] = []
        self._depth_hist: dict[int, int] = {}
        self._rng = random.Random(seed)

    # -- recording --
    def observe_step(
        self,
        *,
        step_ms: float | None,
        prompt_tokens: int,
        requests: Sequence[tuple[str, str, int, int]],
        drafting_depth: int,
        request_ids: Sequence[str] | None = None,
    ) -> None:
        """One engine step: ``requests`` = (class, phase, verified drafts, accepted drafts) per scheduled request.

        ``prompt_tokens``: prompt (prefill) tokens computed in the step; a step with any is "mixed" and gives no
        step-cost sample. ``drafting_depth``: drafts the drafter proposed per request in the step. ``request_ids``
        (same order as ``requests``): also record per-request traces (see the class docstring).
        """
        tally = StepTally()
        for cls, phase, drafted, accepted in requests:
            tally.add(cls, phase, drafted, accepted)
        tally.prompt_tokens = prompt_tokens
        traces = None
        if request_ids is not None:
            traces = [(rid, c, p, d, a) for rid, (c, p, d, a) in zip(request_ids, requests, strict=True)]
        self.observe_tally(tally, step_ms=step_ms, drafting_depth=drafting_depth, traces=traces)

    def observe_tally(
        self,
        tally: StepTally,
        *,
        step_ms: float | None,
        drafting_depth: int,
        traces: Sequence[tuple[str, str, str, int, int]] | None = None,
    ) -> None:
        """`observe_step` for a step already counted per (class, phase) (what the plugin passes; the work grows
        with the distinct outcomes, not with the batch). ``traces``: (request id, class, phase, drafted, accepted)
        per request, for the per-request traces."""
        self.steps += 1
        if traces is not None and self.max_traces > 0:
            self._observe_traces_rows(traces)
        # The step's phase ("mixed" when it has several) and its uniform verified depth (None when several).
        step_phase: str | None = None
        uniform: int | None = None
        several_depths = False
        hist, acceptance, admitted = self._depth_hist, self._acceptance, self._admitted
        for label, outcomes in tally.outcomes.items():
            known = admitted.get(label)
            cls, phase = known if known is not None else self._admit(label)
            if step_phase is None:
                step_phase = phase
            elif phase != step_phase:
                step_phase = "mixed"
            for (drafted, accepted), m in outcomes.items():
                if not 0 <= accepted <= drafted:
                    raise ValueError(f"accepted drafts must be in [0, drafted={drafted}], but got {accepted}.")
                if uniform is None:
                    uniform = drafted
                elif drafted != uniform:
                    several_depths = True
                hist[drafted] = hist.get(drafted, 0) + m
                if drafted == 0:
                    continue
                key = (phase, cls, drafted)
                row = acceptance.get(key)
                if row is None:
                    row = acceptance[key] = [0] * (drafted + 1)
                row[0] += m
                for i in range(1, accepted + 1):
                    row[i] += m
        if tally.prompt_tokens > 0 or not tally.size:
            self.mixed_steps += 1
            if step_ms is not None and math.isfinite(step_ms) and step_ms > 0:
                mkey = ("mixed" if step_phase is None else step_phase, drafting_depth > 0)
                mixed = self.mixed_costs.get(mkey)
                if mixed is None:
                    mixed = self.mixed_costs[mkey] = [0, 0.0, 0, 0]
                mixed[0] += 1
                mixed[1] += step_ms
                mixed[2] += tally.prompt_tokens
                mixed[3] += tally.size
            return
        self.decode_steps += 1
        if step_ms is None or not math.isfinite(step_ms) or step_ms <= 0:
            return
        phase = "mixed" if step_phase is None else step_phase
        ckey = (phase, tally.size, None if several_depths else uniform, tally.verified, drafting_depth)
        entry = self._costs.get(ckey)
        if entry is None:
            room = self.max_samples_per_key if len(self._costs) < self.max_cost_keys else 0
            entry = self._costs[ckey] = _CostKey([], room=room)
        entry.n += 1
        entry.sum_ms += step_ms
        if len(entry.samples) < entry.room:
            entry.samples.append(step_ms)
            entry.json = None
        elif entry.room:  # reservoir sampling keeps a uniform sample of all steps
            j = self._rng.randrange(entry.n)
            if j < entry.room:
                entry.samples[j] = step_ms
                entry.json = None

    def _admit(self, label: tuple[str, str]) -> tuple[str, str]:
        """(class, phase) as recorded (`LabelBook.admit`); remembered when neither was folded (a label once admitted
        stays admitted, while every folded one is counted)."""
        raw_cls, raw_phase = label
        admitted = (self._class_labels.admit(raw_cls), self._phase_labels.admit(raw_phase))
        if admitted == label:
            self._admitted[label] = admitted
        return admitted

    def observe_between_steps(self, ms: float, drafter_ran: bool) -> None:
        """The engine core spent ``ms`` (wall) between a step whose drafter ran (or not) and the next step."""
        if math.isfinite(ms) and ms >= 0:
            key = "drafter" if drafter_ran else "no_drafter"
            entry = self.between_steps.get(key)
            if entry is None:
                entry = self.between_steps[key] = [0, 0.0]
            entry[0] += 1
            entry[1] += ms

    def observe_draft_fetch(self, ms: float) -> None:
        """One draft fetch that took ``ms`` (wall)."""
        if math.isfinite(ms) and ms >= 0:
            self.draft_fetches += 1
            self.draft_fetch_ms += ms

    def admit_trace(self, request_id: str, cls: str, phase: str) -> bool:
        """Offer a request seen for the first time to the trace reservoir: whether its steps are to be recorded.

        Reservoir sampling (Algorithm R) in arrival order: the first ``max_traces`` requests are traced, the n-th
        with probability ``max_traces / n``, and a kept trace replaces a uniformly chosen finished one when it
        finishes. The scheduler plugin asks once per request and passes only traced requests' rows."""
        if self.max_traces <= 0:
            return False
        self._trace_offers += 1
        n = self._trace_offers
        if n > self.max_traces and self._rng.randrange(n) >= self.max_traces:
            return False
        self._open_traces[request_id] = (self._class_labels.admit(cls), self._phase_labels.admit(phase), array("L"),
                                         [self.steps])
        return True

    def _observe_traces_rows(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        """Per-request traces from (request id, class, phase, drafted, accepted) rows; a request not seen before is
        offered to the reservoir (`admit_trace`), so a step costs one dict lookup and one append per traced
        request."""
        step = self.steps
        open_traces = self._open_traces
        untraced = self._untraced
        limit = 2 * self.max_trace_steps
        for rid, c, p, d, a in rows:
            entry = open_traces.get(rid)
            if entry is None:
                if rid in untraced or not self.admit_trace(rid, c, p):
                    untraced[rid] = step
                    continue
                entry = open_traces[rid]
            steps = entry[2]
            if len(steps) < limit:
                steps.append(d)
                steps.append(a)
            entry[3][0] = step
        if step % _TRACE_IDLE_STEPS == 0:
            for rid in [r for r, e in open_traces.items() if step - e[3][0] >= _TRACE_IDLE_STEPS]:
                self._close_trace(rid)
            if untraced:
                self._untraced = {r: last for r, last in untraced.items() if step - last < _TRACE_IDLE_STEPS}

    def _close_trace(self, rid: str) -> None:
        cls, phase, flat, _ = self._open_traces.pop(rid)
        if not any(flat[0::2]):  # never verified a draft: nothing to replay
            return
        trace = {"class": cls, "phase": phase, "steps": _pairs(flat)}
        if len(self._traces) < self.max_traces:
            self._traces.append(trace)
            self._trace_json.append(None)
        else:  # the reservoir's replacement (`admit_trace` already drew this request in)
            j = self._rng.randrange(self.max_traces)
            self._traces[j] = trace
            self._trace_json[j] = None

    def traces(self) -> list[dict[str, Any]]:
        """Recorded per-request traces: ``{"class", "phase", "steps": [[verified, accepted], ...]}`` (measured);
        finished requests first, then those still running."""
        return [*self._traces, *self._running_traces()]

    def _running_traces(self) -> list[dict[str, Any]]:
        return [
            {"class": c, "phase": p, "steps": _pairs(flat)}
            for c, p, flat, _ in self._open_traces.values() if any(flat[0::2])
        ]

    def record_error(self, message: str) -> None:
        self.fallback = True
        if len(self.errors) < 20:
            self.errors.append(message)
