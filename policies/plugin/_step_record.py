"""What the scheduler plugin records after each step: the step's outcomes counted per (class, phase)
(`StepObserver.observe`), fed to the statistics, the controller's learning and the metrics (`record_step`).

Acceptance (per request and step): drafted = the draft tokens scheduled for verification
(``scheduled_spec_decode_tokens``, placeholders -1 excluded); accepted = sampled tokens minus the one bonus token,
exactly as vLLM counts for ``vllm:spec_decode_*``. Pure Python: no vLLM import (outputs are read by duck typing).
"""

from __future__ import annotations

from typing import Any

from policies import DepthController, StepTally, request_outcome
from policies.plugin._request_labels import RequestLabels
from policies.plugin.drafting import DraftFetchCost
from policies.plugin.metrics import GuardedMetrics
from policies.plugin.stats import PluginStats

__all__ = ["Observed", "StepObserver", "record_step"]

Row = tuple[str, str, str, int, int]  # (request id, class, phase, drafted, accepted)
Observed = tuple[StepTally, list[Row], int]  # the tally, the traced requests' rows, the drafting depth


class StepObserver:
    """Counts a step's outcomes. ``bonus``: tokens sampled per request besides the verified drafts (vLLM's
    ``num_sampled_tokens_per_step``); ``async_scheduling``: drafts are -1 placeholders."""

    def __init__(self, labels: RequestLabels, bonus: int, async_scheduling: bool) -> None:
        self.labels = labels
        self.bonus = bonus
        self.async_scheduling = async_scheduling
        # The observation of the last off-step (no draft verified, no prompt token) of a batch, by batch number, which
        # every further off-step of the same batch repeats.
        self._off_observed: tuple[int, StepTally, list[Row]] | None = None

    def observe(self, output: Any, runner_output: Any, batch: int | None, drafting: int) -> Observed:
        """The step's outcomes counted per (class, phase) (`StepTally`, what the controller, stats and metrics
        consume); per traced request (request id, class, phase, drafted, accepted) for the stats' traces; the
        drafting depth. ``batch``: the number of the batch the depth decision saw when ``output`` holds exactly its
        decoding requests (`DepthDecider.batch_of`), else None. ``drafting``: the drafting depth decided in
        ``output``'s own schedule() (under async scheduling a later step has been scheduled by now)."""
        spec = output.scheduled_spec_decode_tokens
        scheduled_tokens = output.num_scheduled_tokens
        # An off-step of an unchanged batch (no draft verified, one token per request) observes exactly what the
        # last off-step of that batch did: reuse it (the tally and the rows are only read downstream).
        off_step = not spec and not self.async_scheduling and output.total_num_scheduled_tokens == len(
            scheduled_tokens)
        known = off_step and batch is not None
        last = self._off_observed
        if known and last is not None and last[0] == batch:
            return last[1], last[2], drafting
        sampled = runner_output.sampled_token_ids
        index = runner_output.req_id_to_index
        bonus = self.bonus
        rows = []
        tally = StepTally()
        prompt_tokens = 0
        # Async scheduling verifies the drafts behind its -1 placeholders (minus those structured output rejected).
        invalid = (getattr(output, "num_invalid_spec_tokens", None) or {}) if self.async_scheduling else None
        labels = self.labels
        label = labels.label
        cached = labels.class_phase
        requests = labels.requests
        outcomes = tally.outcomes
        drafted_total = deepest = 0
        for req_id, n in scheduled_tokens.items():
            scheduled = spec.get(req_id)
            if not scheduled:  # no draft verified (the common case at depth 0 and in prefill): `request_outcome`
                drafted = accepted = 0
                prompt = n - bonus if n > bonus else 0
            elif invalid is None and min(scheduled) >= 0:  # drafts, no placeholder: `request_outcome` inline
                drafted = len(scheduled)
                prompt = n - bonus - drafted
                if prompt < 0:
                    prompt = 0
                i = index.get(req_id) if sampled else None
                accepted = 0 if i is None else len(sampled[i]) - bonus
                if accepted > drafted:
                    accepted = drafted
                elif accepted < 0:
                    accepted = 0
            else:
                i = index.get(req_id) if sampled else None
                if invalid is not None and scheduled[0] < 0:
                    bad = invalid.get(req_id, 0)
                    scheduled = (0,) * (len(scheduled) - bad) + (-1,) * bad
                drafted, accepted, prompt = request_outcome(
                    n, scheduled, None if i is None else len(sampled[i]), bonus
                )
            prompt_tokens += prompt
            # (class, phase), cached per request (`RequestLabels.label`): also the tally's key (`StepTally.add`)
            entry = cached.get(req_id)
            if entry is None or entry[0] is not requests.get(req_id):
                key = label(req_id)
                entry = labels.class_phase.get(req_id)
                traced = entry is not None and entry[1] is key and entry[2]
            else:
                key, traced = entry[1], entry[2]
            per_key = outcomes.get(key)
            if per_key is None:
                per_key = outcomes[key] = {}
            pair = (drafted, accepted)
            per_key[pair] = per_key.get(pair, 0) + 1
            drafted_total += drafted
            if drafted > deepest:
                deepest = drafted
            if traced:  # the request's steps are recorded (`PluginStats.admit_trace`)
                rows.append((req_id, key[0], key[1], drafted, accepted))
        size = len(scheduled_tokens)
        tally.size, tally.verified, tally.deepest = size, drafted_total + size, deepest
        tally.prompt_tokens = prompt_tokens
        if known and prompt_tokens == 0:
            assert batch is not None
            self._off_observed = (batch, tally, rows)
        return tally, rows, drafting


def record_step(
    observed: Observed,
    step_ms: float | None,
    stats: PluginStats,
    controller: DepthController | None,
    metrics: GuardedMetrics,
    fetch_cost: DraftFetchCost,
    fetch_follows: bool,
) -> None:
    """Feed a step's outcomes to the statistics, the controller (decode steps are its cost samples, with the drafts'
    fetch that follows the step when ``fetch_follows``) and the metrics. An idle step (nothing scheduled) is not
    recorded."""
    tally, rows, drafting = observed
    if not tally.size:
        return
    stats.observe_tally(tally, step_ms=step_ms, drafting_depth=drafting, traces=rows)
    if controller is not None:
        # The drafter's width in this step (not the depth verified in it) says whether the drafter ran.
        learn_ms = None
        if step_ms is not None and tally.prompt_tokens == 0:
            learn_ms = fetch_cost.step_cost(step_ms, fetch_follows)
        controller.observe_tally(tally, learn_ms, drafting)
    if metrics.active:
        metrics.call("maybe_push")
