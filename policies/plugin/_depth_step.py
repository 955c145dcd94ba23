"""The scheduler plugin's depth decision for one step: the verified depth of each request that is drafted for in
the step (it verifies those drafts in the next one), from the adaptive controller, a depth plan, or the static
depth, with opt-outs, per-request caps and class caps applied (`policies.DepthRules`).

A step with the same requests as the last one skips re-labelling and re-syncing the tracked batch, and reuses the
last depths when the decision (or the static / plan base depth) and the rules are the same. An exception in the
controller makes that step fall back to the static depth (`DepthController.decide_or_fallback`; logged once,
counted as ``controller_fallbacks`` in the stats info). Pure Python: no vLLM import.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from policies import DepthController, DepthRules, PlanClock, RequestPolicy, TrackedBatch
from policies.plugin._request_labels import RequestLabels
from policies.plugin.factory import check_plugin_fault
from policies.plugin.metrics import GuardedMetrics

__all__ = ["DepthDecider"]


class DepthDecider:
    """Depths per step. ``rules``: the depth rules (replaced when the drafter width falls back); ``info``: the stats
    info the controller's fallbacks are counted in."""

    def __init__(self, labels: RequestLabels, metrics: GuardedMetrics, logger: logging.Logger, k: int) -> None:
        self.labels = labels
        self.metrics = metrics
        self.rules = DepthRules(k)
        self.mode = "static"
        self.fault: Any = None  # the config, when its ``fault_class`` test hook is armed
        self.plan: PlanClock | None = None
        self.policy: RequestPolicy | None = None
        self.controller: DepthController | None = None
        self.batch = TrackedBatch()
        self.info: dict[str, Any] | None = None
        self.controller_fallbacks = 0
        self._logger = logger
        self._fallback_logged = False
        # Last step's batch: request ids, request objects, controller views, and (decision or base depth, rules,
        # depths); ``batch_number`` counts the batches seen (the step observer reuses an off-step of the same one).
        self.last_ids: list[str] = []
        self._last_members: list[Any] = []
        self._last_views: list[Any] = []
        self._last_depths: tuple[Any, DepthRules, dict[str, int]] | None = None
        self.batch_number = 0
        self.batch_output: Any = None  # the output whose decoding requests are `last_ids`

    def decide(self, output: Any, requests: Mapping[str, Any]) -> dict[str, int]:
        """Depth per decoding request of ``output`` (empty: none)."""
        self.batch_output = None
        ids = [r for r in output.num_scheduled_tokens if r in requests and not requests[r].is_prefill_chunk]
        if not ids:
            return {}
        rules = self.rules
        if self.fault is not None:  # the test hook (a generator per step costs ~1 us otherwise)
            label = self.labels.label
            check_plugin_fault(self.fault, (label(r)[0] for r in ids))
        members = [requests[r] for r in ids]
        same_batch = ids == self.last_ids and members == self._last_members
        if not same_batch:
            self.last_ids, self._last_members, self._last_views = ids, members, []
            self.batch_number += 1
        self.batch_output = output
        # What the depths follow: the controller's decision (adaptive) or the base depth (static / plan).
        adaptive = self.mode == "adaptive"
        key: Any = self._adaptive_decision(ids, same_batch) if adaptive else (
            self.plan.next_depth(len(ids)) if self.plan is not None else rules.static_base)
        last = self._last_depths
        if same_batch and last is not None and last[1] is rules and (last[0] is key or last[0] == key):
            return last[2]  # same requests, same decision (or base depth), same rules as last step: same depths
        if adaptive:
            if rules.class_caps:  # first labelling offers a request to the trace reservoir: keep the order
                for r in ids:
                    self.labels.label(r)
            depths = self._adaptive_depths(key, rules)
        else:  # one base depth; opt-out and caps per request
            labeled = {r: self.labels.labeled(r) for r in ids}
            chosen = rules.uniform(key, {r: not x.view.speculate for r, x in labeled.items()})
            chosen = {r: labeled[r].bound(d) for r, d in chosen.items()}
            classes = {r: self.labels.label(r)[0] for r in ids} if rules.class_caps else {}
            depths = rules.apply_caps(chosen, classes)
        self._last_depths = (key, rules, depths)
        return depths

    def _adaptive_depths(self, decision: Any, rules: DepthRules) -> dict[str, int]:
        """Each request's depth under ``decision``, capped by ``rules``: `Decision.depth_for` then
        `DepthRules.capped`, computed once per cohort (a request's depth depends only on its cohort, unless it
        explores)."""
        explore = decision.explore
        per_cohort: dict[Any, int] = {}
        depths = {}
        for view in self._last_views:
            cohort = view.cohort
            depth = per_cohort.get(cohort)
            if depth is None or view.request_id in explore:
                depth = rules.capped(decision.depth_for(view), cohort[0])
                if view.request_id not in explore:
                    per_cohort[cohort] = depth
            depths[view.request_id] = depth
        return depths

    def batch_of(self, output: Any) -> int | None:
        """The number of the batch decided for ``output`` when it schedules exactly that batch's requests."""
        if self.batch_output is output and len(output.num_scheduled_tokens) == len(self.last_ids):
            return self.batch_number
        return None

    def _adaptive_decision(self, ids: list[str], same_batch: bool) -> Any:
        """The controller's `Decision` for this step's requests (``same_batch``: the same requests as last step, so
        the tracked batch is already in sync)."""
        controller, batch = self.controller, self.batch
        assert controller is not None
        if not same_batch or not self._last_views:
            labeled = self.labels.labeled
            views = [labeled(r).view for r in ids]  # built by the policy (`RequestLabeler`), cached per request
            batch.sync(views)
            self._last_views = views
        decision = controller.decide_or_fallback(batch)
        if self.metrics.active:
            self.metrics.call("observe_decision", decision, controller)
        if decision.fallback:
            self.controller_fallbacks += 1
            if self.info is not None:
                self.info["controller_fallbacks"] = self.controller_fallbacks
                self.info.setdefault("controller_fallback_reason", decision.reason)
            if not self._fallback_logged:
                self._fallback_logged = True
                self._logger.warning(
                    "PeagleScheduler: controller fell back to static K=%d (logged once; counted in the stats as "
                    "controller_fallbacks): %s", decision.default_depth, decision.reason)
        return decision

    def set_drafter_always_runs(self, always: bool) -> None:
        """Tell the controller whether a step at depth 0 still pays for the drafter (trimming) or not (off-steps)."""
        controller = self.controller
        if controller is not None and controller.settings.drafter_always_runs != always:
            controller.settings = dataclasses.replace(controller.settings, drafter_always_runs=always)
            controller.refresh()
