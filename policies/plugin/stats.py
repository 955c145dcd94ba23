"""`PluginStats`: what the scheduler plugin measured in the engine, aggregated, and its JSON file (stats.json).

The engine-core process fills it step by step (`PluginStats.observe_step`) and writes it atomically to the config's
``stats_path``; the parent reads it back with `PluginStats.load` and turns it into acceptance profiles
(`PluginStats.acceptance`) and step-cost samples (`PluginStats.step_samples`). Pure Python: no vLLM import.

Worked example: one decode step of three requests at verified depth 2, where the two "code" requests accepted 2 and
1 drafts and the "chat" one none; 9 tokens verified (3 * (2 + 1)) in 10 ms::

    >>> s = PluginStats()
    >>> s.observe_step(step_ms=10.0, prompt_tokens=0, drafting_depth=2,
    ...                requests=[("code", "p", 2, 2), ("code", "p", 2, 1), ("chat", "p", 2, 0)])
    >>> s.acceptance("code", 2)
    AcceptanceProfile(num_drafts=2, accepted_per_position=(2, 1))
    >>> [(x.batch_size, x.depth, x.tokens, x.step_ms) for x in s.step_samples()]
    [(3, 2, 9, 10.0)]
"""

from __future__ import annotations

import json
import math
import os
import random
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from policies import AcceptanceProfile, StepSample, StepTally
from policies.errors import PluginConfigError
from policies.plugin.config import CONFIG_ENV, SCHEDULER_CLS
from policies.plugin.labels import MAX_CLASSES, MAX_PHASES, LabelBook

__all__ = ["STATS_VERSION", "PluginStats"]

STATS_VERSION = 1
"""The stats file format this peagle-tune reads and writes."""
_BULK = "\x00bulk"  # placeholder of the parts `PluginStats.to_json` splices in
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


class PluginStats:
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
        classes, phases_book = self._class_labels, self._phase_labels
        if traces is not None and self.max_traces > 0:
            self._observe_traces_rows(traces)
        depths = set()
        phases = set()
        hist, acceptance = self._depth_hist, self._acceptance
        for (raw_cls, raw_phase), outcomes in tally.outcomes.items():
            cls, phase = classes.admit(raw_cls), phases_book.admit(raw_phase)
            phases.add(phase)
            for (drafted, accepted), m in outcomes.items():
                if not 0 <= accepted <= drafted:
                    raise ValueError(f"accepted drafts must be in [0, drafted={drafted}], but got {accepted}.")
                depths.add(drafted)
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
                mkey = (phases.pop() if len(phases) == 1 else "mixed", drafting_depth > 0)
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
        phase = phases.pop() if len(phases) == 1 else "mixed"
        uniform = next(iter(depths)) if len(depths) == 1 else None
        ckey = (phase, tally.size, uniform, tally.verified, drafting_depth)
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

    # -- reading --
    def phases(self) -> list[str]:
        return sorted({k[0] for k in self._acceptance} | {k[0] for k in self._costs})

    def classes(self, phases: Iterable[str] | None = None) -> list[str]:
        wanted = None if phases is None else set(phases)
        return sorted({c for p, c, _ in self._acceptance if wanted is None or p in wanted})

    def acceptance(self, cls: str, depth: int, phases: Iterable[str] | None = None) -> AcceptanceProfile | None:
        """Measured counts of ``cls`` over the steps it verified exactly ``depth`` drafts (None: no such step)."""
        wanted = None if phases is None else set(phases)
        total = [0] * (depth + 1)
        for (p, c, d), row in self._acceptance.items():
            if c == cls and d == depth and (wanted is None or p in wanted):
                total = [a + b for a, b in zip(total, row, strict=True)]
        if total[0] == 0:
            return None
        return AcceptanceProfile(total[0], tuple(total[1:]))

    def acceptance_by_depth(self, cls: str, phases: Iterable[str] | None = None) -> dict[int, AcceptanceProfile]:
        depths = sorted({d for _, c, d in self._acceptance if c == cls})
        out = {}
        for d in depths:
            prof = self.acceptance(cls, d, phases)
            if prof is not None:
                out[d] = prof
        return out

    def step_costs(self, phases: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Decode-step cost entries: phase, batch_size, depth (uniform verified depth or None), verified_tokens,
        drafting_depth, n (steps), mean_ms, samples_ms (measured)."""
        wanted = None if phases is None else set(phases)
        out = []
        ordered = sorted(self._costs.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], kv[0][4]))
        for (phase, b, d, v, dd), e in ordered:
            if wanted is None or phase in wanted:
                out.append(
                    {"phase": phase, "batch_size": b, "depth": d, "verified_tokens": v, "drafting_depth": dd,
                     "n": e.n, "mean_ms": e.sum_ms / e.n, "samples_ms": list(e.samples)}
                )
        return out

    def prompt_steps(self, phases: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Steps with prompt tokens summed per (phase, whether the drafter ran), as the statistics file's
        ``mixed_step_costs`` holds them ("phase", "drafter_ran", "n", "sum_ms", "prompt_tokens", "requests"), for
        ``phases`` (None: every phase)."""
        wanted = None if phases is None else set(phases)
        return [
            {"phase": p, "drafter_ran": ran, "n": int(e[0]), "sum_ms": e[1], "prompt_tokens": int(e[2]),
             "requests": int(e[3])}
            for (p, ran), e in sorted(self.mixed_costs.items()) if wanted is None or p in wanted
        ]

    def step_samples(
        self,
        phases: Iterable[str] | None = None,
        *,
        sequential: bool = False,
        uniform_only: bool = True,
        statistic: Literal["median", "mean"] = "median",
    ) -> list[StepSample]:
        """Measured step times as `StepSample`s, one per (batch size, depth[, drafting depth]) with the median.

        ``statistic="mean"``: each shape's mean instead (its summed step time / its steps: what a run of that shape
        pays per step, since a run's duration is the sum of its steps; step times have a tail, so the mean is above
        the median). Phases are pooled (``phases``: those only; None: every phase). ``sequential``: the drafting
        depth (drafter passes) is the sample's depth and only steps whose drafting depth equals the verified depth
        are kept, so each sample has one K; otherwise (parallel drafting, one drafter pass at the configured K) the
        verified depth is. The drafter ran in every step (depth applied by trimming, or a drafting width > 0), so
        ``drafter_ran=True``, except when the engine had no speculative decoding (``info["num_speculative_tokens"]
        == 0``: a no-speculation baseline) and, when the workers skipped off-steps
        (``info["drafter_width"]["skip_drafter"]``), for steps of drafting depth 0.
        """
        if statistic not in ("median", "mean"):
            raise ValueError(f"statistic must be 'median' or 'mean', but got {statistic!r}.")
        speculative = self.info.get("num_speculative_tokens", 1) != 0
        skips = bool((self.info.get("drafter_width") or {}).get("skip_drafter"))
        pooled: dict[tuple[int, int, int, bool], tuple[list[float], int, float]] = {}
        for e in self.step_costs(phases):
            d = e["depth"]
            if d is None:
                if uniform_only:
                    continue
                d = e["drafting_depth"] if sequential else max(0, e["verified_tokens"] // e["batch_size"] - 1)
            if sequential and e["drafting_depth"] != d:
                continue
            ran = speculative and (e["drafting_depth"] > 0 or not skips)
            key = (e["batch_size"], d, e["verified_tokens"], ran)
            samples, n, total_ms = pooled.get(key, ([], 0, 0.0))
            pooled[key] = (samples + e["samples_ms"], n + e["n"], total_ms + e["mean_ms"] * e["n"])
        out = []
        for (b, d, v, ran), (samples, n, total_ms) in sorted(pooled.items()):
            samples.sort()
            mid = len(samples) // 2
            if statistic == "mean" or not samples:  # shapes beyond max_cost_keys keep no samples: their mean
                ms = total_ms / n
            else:
                ms = samples[mid] if len(samples) % 2 else 0.5 * (samples[mid - 1] + samples[mid])
            out.append(StepSample(b, d, float(ms), n=n, verified_tokens=v, drafter_ran=ran))
        return out

    def totals(self) -> dict[str, Any]:
        """Drafts, draft tokens, accepted tokens and accepted per position over every step (all phases)."""
        drafts = tokens = accepted = 0
        per_pos = list(self._per_pos_offset)
        for (_p, _c, d), row in self._acceptance.items():
            drafts += row[0]
            tokens += d * row[0]
            if len(per_pos) < d:
                per_pos += [0] * (d - len(per_pos))
            for i in range(d):
                accepted += row[i + 1]
                per_pos[i] += row[i + 1]
        off = self._totals_offset
        return {"num_drafts": drafts + off["num_drafts"], "num_draft_tokens": tokens + off["num_draft_tokens"],
                "num_accepted_tokens": accepted + off["num_accepted_tokens"], "accepted_per_position": per_pos}

    def class_counts(self) -> dict[str, list[int]]:
        """Per class over every step (phases pooled): [drafts, draft tokens, accepted tokens, accepted at position
        0, 1, ...] (cumulative; what the plugin's Prometheus counters export, `policies.plugin.PluginMetrics`)."""
        out: dict[str, list[int]] = {}
        for (_p, cls, d), row in self._acceptance.items():
            c = out.get(cls)
            if c is None:
                c = out[cls] = [0, 0, 0]
            c[0] += row[0]
            c[1] += d * row[0]
            if len(c) < 3 + d:
                c += [0] * (3 + d - len(c))
            for i in range(d):
                c[2] += row[i + 1]
                c[3 + i] += row[i + 1]
        return out

    def depth_histogram(self) -> dict[int, int]:
        """Verified depth -> request-steps at that depth (all steps)."""
        return dict(sorted(self._depth_hist.items()))

    # -- (de)serialising --
    def to_dict(self, *, _bulk: bool = True) -> dict[str, Any]:
        """Everything, as plain JSON-able data (``_bulk=False``: `to_json`'s placeholders for the bulky parts)."""
        info = dict(self.info)
        if self._class_labels.folded or self._phase_labels.folded:
            info["folded_labels"] = {"classes": self._class_labels.folded, "phases": self._phase_labels.folded}
        capped = sum(1 for e in self._costs.values() if not e.room)
        if capped:
            info["step_cost_keys_without_samples"] = capped
        return {
            "version": STATS_VERSION,
            "info": info,
            "steps": self.steps,
            "decode_steps": self.decode_steps,
            "mixed_steps": self.mixed_steps,
            "fallback": self.fallback,
            "errors": list(self.errors),
            "overhead_ms": self.overhead_ms,
            "draft_fetch": {"n": self.draft_fetches, "sum_ms": self.draft_fetch_ms},
            "between_steps": {k: {"n": int(n), "sum_ms": ms} for k, (n, ms) in sorted(self.between_steps.items())},
            "mixed_step_costs": self.prompt_steps(),
            "totals": self.totals(),
            "depth_histogram": {str(k): v for k, v in self.depth_histogram().items()},
            "acceptance": [
                {"phase": p, "class": c, "depth": d, "num_drafts": row[0], "accepted_per_position": row[1:]}
                for (p, c, d), row in sorted(self._acceptance.items())
            ],
            "step_costs": [
                {"phase": p, "batch_size": b, "depth": d, "verified_tokens": v, "drafting_depth": dd, "n": e.n,
                 "sum_ms": e.sum_ms, "samples_ms": e.samples}
                for (p, b, d, v, dd), e in self._costs.items()
            ] if _bulk else _BULK,
            "traces": self.traces() if _bulk else _BULK,
        }

    def to_json(self) -> str:
        """``json.dumps(self.to_dict())``, the same text, built incrementally: the step-time samples of a shape and
        the finished traces are serialised once and reused until they change, so writing the file while the engine
        runs (every ``flush_every_s``, and after it goes idle) costs little more than the parts that changed."""
        data = self.to_dict(_bulk=False)
        head = json.dumps(data)
        costs = []
        names: dict[str, str] = {}
        for (p, b, d, v, dd), e in self._costs.items():
            if e.json is None:
                e.json = json.dumps(e.samples)
            phase = names.get(p)
            if phase is None:
                phase = names[p] = json.dumps(p)
            # json.dumps' own text for these fields: ints, null, and repr() of a finite float
            total = repr(e.sum_ms) if math.isfinite(e.sum_ms) else json.dumps(e.sum_ms)
            costs.append(f'{{"phase": {phase}, "batch_size": {b}, "depth": {"null" if d is None else d}, '
                         f'"verified_tokens": {v}, "drafting_depth": {dd}, "n": {e.n}, "sum_ms": {total}, '
                         f'"samples_ms": {e.json}}}')
        traces = []
        cached = self._trace_json
        for i, trace in enumerate(self._traces):
            text = cached[i] if i < len(cached) else None
            if text is None:
                text = json.dumps(trace)
                if i < len(cached):
                    cached[i] = text
            traces.append(text)
        traces.extend(json.dumps(t) for t in self._running_traces())
        head = head.replace(f'"step_costs": {json.dumps(_BULK)}', f'"step_costs": [{", ".join(costs)}]', 1)
        return head.replace(f'"traces": {json.dumps(_BULK)}', f'"traces": [{", ".join(traces)}]', 1)

    @classmethod
    def from_dict(cls, data: Any, source: str = "plugin stats") -> PluginStats:
        if not isinstance(data, Mapping) or data.get("version") != STATS_VERSION:
            raise PluginConfigError(
                f"{source}: not a version-{STATS_VERSION} plugin stats object (got "
                f"{type(data).__name__ if not isinstance(data, Mapping) else 'version ' + repr(data.get('version'))})."
            )
        try:
            stats = cls()
            stats.info = dict(data.get("info") or {})
            stats.steps = int(data["steps"])
            stats.decode_steps = int(data["decode_steps"])
            stats.mixed_steps = int(data["mixed_steps"])
            stats.fallback = bool(data["fallback"])
            stats.errors = [str(e) for e in data.get("errors") or []]
            stats.overhead_ms = float(data.get("overhead_ms", 0.0))
            fetch = data.get("draft_fetch") or {}
            stats.draft_fetches, stats.draft_fetch_ms = int(fetch.get("n", 0)), float(fetch.get("sum_ms", 0.0))
            stats.between_steps = {
                str(k): [int(v["n"]), float(v["sum_ms"])] for k, v in (data.get("between_steps") or {}).items()
            }
            stats.mixed_costs = {
                (str(m["phase"]), bool(m["drafter_ran"])): [int(m["n"]), float(m["sum_ms"]), int(m["prompt_tokens"]),
                                                             int(m["requests"])]
                for m in data.get("mixed_step_costs") or []
            }
            totals = data["totals"]
            loaded = {k: int(totals[k]) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
            loaded_per_pos = [int(x) for x in totals["accepted_per_position"]]
            stats._depth_hist = {int(k): int(v) for k, v in (data.get("depth_histogram") or {}).items()}
            for a in data["acceptance"]:
                per_pos = [int(x) for x in a["accepted_per_position"]]
                if len(per_pos) != int(a["depth"]):
                    raise ValueError(f"acceptance entry has depth {a['depth']} but {len(per_pos)} positions")
                akey = (str(a["phase"]), str(a["class"]), int(a["depth"]))
                stats._acceptance[akey] = [int(a["num_drafts"]), *per_pos]
            derived = stats.totals()
            stats._totals_offset = {k: v - derived[k] for k, v in loaded.items()}
            derived_per_pos = derived["accepted_per_position"]
            width = max(len(loaded_per_pos), len(derived_per_pos))
            loaded_per_pos += [0] * (width - len(loaded_per_pos))
            derived_per_pos += [0] * (width - len(derived_per_pos))
            stats._per_pos_offset = [a - b for a, b in zip(loaded_per_pos, derived_per_pos, strict=True)]
            for c in data["step_costs"]:
                depth = None if c["depth"] is None else int(c["depth"])
                key = (
                    str(c["phase"]), int(c["batch_size"]), depth, int(c["verified_tokens"]), int(c["drafting_depth"])
                )
                samples = [float(x) for x in c["samples_ms"]]
                stats._costs[key] = _CostKey(samples, int(c["n"]), float(c["sum_ms"]),
                                             room=stats.max_samples_per_key if samples else 0)
            stats._traces = [
                {"class": str(t["class"]), "phase": str(t["phase"]), "steps": [[int(d), int(a)] for d, a in t["steps"]]}
                for t in data.get("traces") or []
            ]
            stats._trace_json = [None] * len(stats._traces)
        except (KeyError, TypeError, ValueError) as exc:
            raise PluginConfigError(f"{source}: malformed plugin stats ({type(exc).__name__}: {exc}).") from None
        return stats

    def save(self, path: str | Path) -> None:
        """Write atomically (a reader never sees half a file)."""
        p = Path(path)
        tmp = p.with_name(p.name + f".tmp{os.getpid()}")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> PluginStats:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise PluginConfigError(
                f"{p}: no plugin stats ({exc.strerror or exc}); was the engine started with "
                f"scheduler_cls={SCHEDULER_CLS!r} and {CONFIG_ENV} naming a config with stats_path?"
            ) from exc
        except json.JSONDecodeError as exc:
            raise PluginConfigError(f"{p}: not valid JSON: {exc}.") from exc
        return cls.from_dict(data, source=str(p))
