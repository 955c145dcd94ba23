"""The vLLM scheduler plugin: runtime control of the verified draft depth, per step and per request.

Install it with ``LLM(..., **policies.plugin.engine_kwargs())``
(``scheduler_cls="policies.scheduler.PeagleScheduler"``, ``async_scheduling=False``) or ``vllm serve ...
--scheduler-cls policies.scheduler.PeagleScheduler --no-async-scheduling``, with ``PEAGLE_SCHEDULER_CONFIG`` naming a
`PluginConfig` JSON file. This module imports vLLM and is imported only by the engine-core process (vLLM loads it by
that class path, which `policies.scheduler` re-exports); ``import policies`` and ``import policies.plugin`` never
import it. It is a thin adapter: the depth rules are `policies.DepthRules` (pure, tested on plain numbers), the
adaptive controller comes from `policies.plugin.build_controller`, statistics go to `policies.plugin.PluginStats`.

How depth is applied (vLLM 0.32, synchronous scheduling). Step n: ``schedule()`` builds the batch, whose draft
tokens were proposed during step n-1; the model runner verifies them, samples, and the drafter proposes drafts for
step n+1 (``num_spec_tokens_to_schedule`` of them per request); ``update_from_output()`` applies the result;
``update_draft_token_ids()`` hands the new drafts to the scheduler. The plugin decides the depths for step n+1 right
after ``schedule()`` of step n, and

1. trims each request's ``spec_token_ids`` to its depth after ``Scheduler.update_draft_token_ids`` (the verified
   depth of step n+1; greedy outputs are unchanged because a shorter verified prefix only produces fewer tokens per
   step, never different ones);
2. when ``lower_drafting_depth`` (default: sequential drafters, and any drafter whose workers proved the
   drafter-width patch in the handshake), sets ``num_spec_tokens_to_schedule`` of step n to the deepest depth of
   step n+1, so the drafter drafts no tokens that would be trimmed; a step where that depth is 0 and no prompt token
   is computed is marked ``peagle_skip_drafter`` and skips the drafter and the rejection sampler. Without the
   handshake, parallel drafting (P-EAGLE, PARD) keeps its configured K (vLLM issue #45695) and only verification is
   saved.

Drafter width (`policies.plugin.drafter_width`, `policies.plugin.drafting`): at start-up the plugin installs the
worker-side patch in every worker through ``collective_rpc`` (the engine must run with ``worker_extension_cls``,
which `policies.plugin.engine_kwargs` sets); it lowers the width only if every worker answered. If the workers later
return more drafts than planned (a worker-side fault turned the patch off), the plugin goes back to trimming at K.
Under async scheduling (`PeagleAsyncScheduler`) depth is applied through vLLM's draft placeholders instead of
trimming.

What is timed (``step_ms``): ``time.perf_counter()`` from the entry of `PeagleScheduler.schedule` to the return of
vLLM's ``Scheduler.update_from_output`` for the same step: scheduling (including the plugin's decision), the model
forward over the verified tokens, rejection sampling, the drafter's proposal for the next step, and the scheduler's
output processing. Not included: ``update_draft_token_ids`` (where the trimming happens), sending outputs to the
frontend, and idle time between steps. Only decode-only steps (no prompt token computed) become step-cost samples;
steps with prompt tokens are timed apart (``mixed_step_costs`` in the stats: steps, ms, prompt tokens, requests).
The engine core's fetch of the drafts after a step (synchronous executors) is timed on its own (``draft_fetch`` in
the stats: steps and summed ms), and so is all the time from the end of one step to the start of the next while
requests are unfinished (``between_steps``, by whether the drafter ran in the step before; synchronous scheduling):
the draft fetch, ``update_draft_token_ids``, outputs to the frontend, new requests. The adaptive controller learns a
decode step's cost as its ``step_ms`` plus the smoothed draft fetch when one follows the step (`DraftFetchCost`): with
the multiprocess executor the fetch is a round trip to the workers that only steps that draft pay.

Acceptance (per request and step, in ``update_from_output``): drafted = the draft tokens scheduled for verification
(``scheduled_spec_decode_tokens``, placeholders -1 excluded); accepted = sampled tokens minus the one bonus token,
exactly as vLLM counts for ``vllm:spec_decode_*``.

Safety: an exception in the depth controller (adaptive mode) makes that step fall back to the static depth
(`DepthController.decide_or_fallback`; logged once, counted as ``controller_fallbacks`` in the stats info); the next
step is adaptive again. Any other exception in the plugin's own logic is logged once (with traceback), recorded in
the stats (``fallback: true``) and turns the plugin off: from then on every request verifies ``static_depth`` drafts
(plain trimming, nothing else), or, with no static depth below K, the scheduler behaves exactly as vLLM's (depth K,
no trimming). The engine never goes down because of the plugin. vLLM's own calls are never wrapped, so vLLM errors
propagate as usual.

Opt-out: a request with ``extra_args["peagle_speculate"]`` false (or 0 / "false": vLLM's OpenAI server turns a JSON
false in ``vllm_xargs`` into 0) verifies no draft in every mode.

Labels are untrusted: each request's class, phase, cap and opt-out come from `policies.plugin.RequestLabeler`. Under
the operator's policy (``adaptive.policy`` or ``policy`` in the config) a client's ``peagle_class`` never raises its
cap and unknown labels stay in the assigned class (the middleware's authenticated stamp, else the policy's default
class); without one, labels are taken as given. Either way at most `policies.MAX_CLASSES` classes and
`policies.plugin.labels.MAX_PHASES` phases are kept apart, so the controller, the stats and ``/metrics`` stay bounded.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

from policies import (
    DepthController,
    DepthRules,
    PlanClock,
    RequestPolicy,
    StepTally,
    TrackedBatch,
    request_outcome,
)
from policies.plugin.config import ASYNC_SCHEDULER_CLS, CONFIG_ENV, PluginConfig
from policies.plugin.drafting import (
    DraftFetchCost,
    HandshakeResult,
    assign_placeholders,
    drafting_requests,
    find_engine_executor,
    handshake,
    is_off_step,
    mark_drafting_requests,
    mark_off_step,
    wrap_draft_fetch,
)
from policies.plugin.factory import build_controller, check_plugin_fault
from policies.plugin.idle_writer import IdleWriter
from policies.plugin.labels import Labeled, RequestLabeler
from policies.plugin.metrics import GuardedMetrics, metrics_visible
from policies.plugin.prefix_guard import PrefixCacheGuard
from policies.plugin.stats import PluginStats

__all__ = ["PeagleAsyncScheduler", "PeagleScheduler"]

_FETCH_CHECK_EVERY = 64
"""Off-steps between two draft fetches that check the workers still skip (`PeagleScheduler._no_drafts_to_fetch`)."""

logger = init_logger("vllm.peagle_scheduler")

_Row = tuple[str, str, str, int, int]  # (request id, class, phase, drafted, accepted)


class _PerRequest:
    """Values cached per live request. An entry remembers the request object, so a reused request id never inherits
    a finished request's value; entries of finished requests are dropped once the cache outgrows the live set."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Any, Any]] = {}

    def get(self, req_id: str, request: Any) -> Any:
        entry = self._entries.get(req_id)
        return entry[1] if entry is not None and entry[0] is request else None

    def put(self, req_id: str, request: Any, value: Any) -> None:
        self._entries[req_id] = (request, value)

    def prune(self, live: Mapping[str, Any]) -> None:
        if len(self._entries) > 2 * len(live) + 256:
            self._entries = {r: e for r, e in self._entries.items() if live.get(r) is e[0]}


class PeagleScheduler(Scheduler):
    """vLLM's Scheduler plus per-request verified-depth control and step/acceptance statistics.

    See the module docstring for what is applied where, what is timed and how failures fall back.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        spec = self.vllm_config.speculative_config
        self._k = int(self.num_spec_tokens or 0)
        self._parallel = bool(getattr(spec, "parallel_drafting", False)) if spec is not None else False
        self._active = False
        self._config = PluginConfig()
        self._rules = DepthRules(self._k)
        self._stats: PluginStats | None = None
        self._planned_width = 0  # drafting width sent with the last schedule() (drafts longer than it: fallback)
        self._plan: PlanClock | None = None
        self._policy: RequestPolicy | None = None
        self._controller: DepthController | None = None
        self._batch = TrackedBatch()
        self._metrics = GuardedMetrics(logger)
        self._t0: dict[int, float] = {}  # id(SchedulerOutput) -> perf_counter at schedule() entry
        self._next_depth: dict[str, int] = {}  # verified depth of the next step per request
        self._drafting_depth = 0
        self._labels = _PerRequest()  # request id -> Labeled
        # request id -> (request, (class, phase), traced: `PluginStats.admit_trace` said to record its steps)
        self._class_phase: dict[str, tuple[Any, tuple[str, str], bool]] = {}
        # Last step's batch (request ids, request objects, controller views) and (decision or base depth, rules,
        # depths): a step with the same requests skips re-labelling and re-syncing the tracked batch, and reuses the
        # depths when the decision (or the static / plan base depth) and the rules are the same as last step's.
        self._last_ids: list[str] = []
        self._last_members: list[Any] = []
        self._last_views: list[Any] = []
        self._last_depths: tuple[Any, DepthRules, dict[str, int]] | None = None
        # The observation of the last off-step (no draft verified, no prompt token) of this batch, which every further
        # off-step of the same batch repeats (`_observe`), and the output whose decoding requests are `_last_ids`.
        self._off_observed: tuple[StepTally, list[_Row]] | None = None
        self._batch_output: SchedulerOutput | None = None
        self._between_from: float | None = None  # when the last step ended, while requests were unfinished
        self._labeler = RequestLabeler()
        self._last_flush = time.monotonic()
        self._idle_writer: IdleWriter | None = None  # writes the stats file once the engine stays idle
        self._fallback_logged = False
        self._fallback_depth: int | None = None  # trimming depth after the plugin turned itself off
        self._controller_fallbacks = 0
        self._async = isinstance(self, AsyncScheduler)
        self._width = HandshakeResult.refused("not attempted")  # what the workers proved (drafter width)
        self._executor: Any = None  # vLLM's model executor (found for the handshake)
        self._off_step = False  # the step last scheduled skips the drafter (no drafts to fetch after it)
        self._fetch_skipped = False  # the executor's draft fetch returns None after an off-step
        self._fetch_cost = DraftFetchCost()  # what the fetch after a step adds to it (learnt by the controller)
        self._off_steps_seen = 0
        self._drafting_for: Mapping[str, int] | None = None  # the depths `_drafting_set` was computed from
        self._drafting_set: frozenset[str] | None = None
        self._skip = False  # off-steps skip the drafter (every worker proved it)
        self._guard: PrefixCacheGuard | None = None  # keeps blocks of prompts the drafter left out uncached
        self._width_fallback_logged = False
        try:
            self._setup()
        except Exception as exc:  # a bad config must not stop the engine: run as plain vLLM and say why
            self._fail("setup", exc)

    # ------------------------------------------------------------------------------------------------ setup
    def _setup(self) -> None:
        config = PluginConfig.from_env()
        self._width = self._drafter_handshake(config)
        lower = DepthRules.lowers_drafting(config.lower_drafting_depth, self._parallel, self._k)
        if self._width.lower_width and config.lower_drafting_depth is not False:
            lower = self._k > 0  # every worker drafts only the planned width (parallel drafting included)
        self._skip = self._width.skip_drafter and lower
        if self._k > 0 and not self._async:  # the fetch is timed (a cost of drafting steps), skipped after off-steps
            if self._executor is None:
                self._executor = find_engine_executor()
            timed = wrap_draft_fetch(self._executor, self._no_drafts_to_fetch if self._skip else None,
                                     self._fetched)
            self._fetch_skipped = self._skip and timed
        self._config = config
        self._rules = DepthRules(self._k, config.static_depth, config.class_depths, lower)
        self._stats = PluginStats(max_samples_per_key=config.max_samples_per_key)
        if config.stats_path is not None and config.idle_write_delay_s > 0:
            self._idle_writer = IdleWriter(self._flush, delay_s=min(config.idle_write_delay_s, config.flush_every_s))
        if config.mode == "plan" and config.plan is not None:
            self._plan = PlanClock(config.plan.depth_at)
        spec = self.vllm_config.speculative_config
        async_on = bool(getattr(self.scheduler_config, "async_scheduling", False))
        self._stats.info = {
            "mode": config.mode,
            "num_speculative_tokens": self._k,
            "method": getattr(spec, "method", None) if spec is not None else None,
            "parallel_drafting": self._parallel,
            "lower_drafting_depth": lower,
            "async_scheduling": async_on or self._async,
            "drafter_width": {**self._width.info(), "skip_drafter": self._skip, "skip_fetch": self._fetch_skipped,
                              "prefix_cache_guard": None if self._guard is None else self._guard.counters},
            "max_num_seqs": self.scheduler_config.max_num_seqs,
        }
        if self._k == 0:
            logger.warning("PeagleScheduler: no speculative decoding configured; recording step times only.")
        if async_on and not self._async:
            raise RuntimeError(
                "PeagleScheduler needs synchronous scheduling: with async scheduling the drafts never pass through "
                "the scheduler, so it cannot trim them. Use the async variant (scheduler_cls="
                f"{ASYNC_SCHEDULER_CLS!r}, policies.plugin.engine_kwargs(async_scheduling=True)) or pass "
                "async_scheduling=False (--no-async-scheduling)."
            )
        if config.mode == "adaptive" and self._k > 0:
            self._policy, self._controller = build_controller(config, self._k)
            if self._skip:  # a step where every request is at depth 0 costs no drafter pass
                self._set_drafter_always_runs(False)
        # Request labels are resolved by the operator's policy when there is one (clients never raise their cap),
        # and bounded in number either way (`RequestLabeler`).
        label_policy = self._policy
        if label_policy is None and config.policy is not None:
            label_policy = RequestPolicy.from_dict(dict(config.policy), source="plugin config policy")
        self._labeler = RequestLabeler.from_env(label_policy)
        if self._k > 0 and metrics_visible():
            # The ``peagle:*`` series (`policies.plugin.metrics`), kept only where ``/metrics`` can show them (with
            # PROMETHEUS_MULTIPROC_DIR). A metrics problem disables the metrics only, never depth control.
            controller = self._controller
            static = controller.static_k if controller is not None else self._rules.reported_static_depth
            rank = getattr(self.parallel_config, "data_parallel_rank", 0)
            # Counters come from the stats' per-class counts when the series are pushed (nothing per step).
            self._metrics.start(self._k, static, engine=str(rank), counts_source=self._stats.class_counts)
            self._metrics.call("set_drafter_width", self._width.state)
        self._active = True
        logger.info(
            "PeagleScheduler: mode=%s K=%d parallel_drafting=%s lower_drafting_depth=%s skip_drafter=%s "
            "async=%s stats=%s metrics=%s drafter_width=%s%s",
            config.mode, self._k, self._parallel, lower, self._skip, self._async, config.stats_path,
            "on" if self._metrics.active else "off", self._width.state,
            "" if self._width.reason is None else (
                f" ({self._width.reason})" if self._width.lower_width
                else f" (depth applied by trimming drafts: {self._width.reason})"),
        )

    def _drafter_handshake(self, config: PluginConfig) -> HandshakeResult:
        """Install the worker-side drafter-width patch in every worker (``collective_rpc``) and read what they
        prove; anything short of every worker answering gives trimming only."""
        if self._k == 0:
            return HandshakeResult.refused("no speculative decoding configured", "no_speculation")
        if not config.drafter_width_enabled:
            return HandshakeResult.refused("drafter_width.enabled is false in the plugin config", "disabled")
        if getattr(self.vllm_config, "use_v2_model_runner", False):
            return HandshakeResult.refused(
                "vLLM runs its V2 model runner, whose drafter the worker patch does not handle; start the engine with "
                "VLLM_USE_V2_MODEL_RUNNER=0 (policies.plugin.config.engine_env)", "v2_runner")
        self._executor = find_engine_executor()
        settings = config.drafter_width_settings()
        guard = PrefixCacheGuard.for_scheduler(self) if settings.prefix_cache_guard else None
        if guard is None and settings.prefix_cache_guard:  # the workers read every prompt under prefix caching
            settings = dataclasses.replace(settings, prefix_cache_guard=False)
        result = handshake(self._executor, settings)
        # Only "catch_up" leaves prompts out of the drafter; with prefix caching off there is nothing to guard.
        self._guard = guard if result.off_steps == "catch_up" else None
        return result

    def _no_drafts_to_fetch(self) -> bool:
        """The step just executed skipped the drafter, so there are no drafts to fetch from the workers. Every
        `_FETCH_CHECK_EVERY`-th off-step fetches anyway: a worker whose patch failed drafts at full width, and the
        over-long drafts are what sends the plugin back to trimming (`update_draft_token_ids`)."""
        if not self._off_step:
            return False
        self._off_steps_seen += 1
        return self._off_steps_seen % _FETCH_CHECK_EVERY != 0

    def _fetched(self, ms: float) -> None:
        """The engine core fetched the drafts of the step just executed in ``ms`` (recorded in the stats)."""
        self._fetch_cost.observe(ms)
        if self._stats is not None:
            self._stats.observe_draft_fetch(ms)

    def _set_drafter_always_runs(self, always: bool) -> None:
        """Tell the controller whether a step at depth 0 still pays for the drafter (trimming) or not (off-steps)."""
        controller = self._controller
        if controller is not None and controller.settings.drafter_always_runs != always:
            controller.settings = dataclasses.replace(controller.settings, drafter_always_runs=always)
            controller.refresh()

    def _drafter_width_fallback(self, reason: str) -> None:
        """The workers stopped drafting the planned width (a worker-side fault): back to trimming at K."""
        self._rules = dataclasses.replace(self._rules, lower_drafting=DepthRules.lowers_drafting(
            False if self._parallel else self._config.lower_drafting_depth, self._parallel, self._k))
        self._skip = False
        self._set_drafter_always_runs(True)
        if self._stats is not None:
            info = self._stats.info.setdefault("drafter_width", {})
            info.update({"state": "fell_back", "fallback": reason, "lower_width": False, "skip_drafter": False})
            self._stats.info["lower_drafting_depth"] = self._rules.lower_drafting
        self._metrics.call("set_drafter_width", "fell_back")
        if not self._width_fallback_logged:
            self._width_fallback_logged = True
            logger.error("PeagleScheduler: %s; the drafter drafts K=%d again and depth is applied by trimming.",
                         reason, self._k)

    def _fail(self, where: str, exc: BaseException) -> None:
        """Log once, record, and turn the plugin off: from now on every request verifies ``static_depth`` drafts
        (vLLM's own behaviour, un-trimmed, when that is None or >= K)."""
        was_active = self._active
        self._active = False
        self._next_depth = {}
        self._fallback_depth = self._rules.fallback_depth
        message = f"{where}: {type(exc).__name__}: {exc}"
        if self._stats is None:
            self._stats = PluginStats()
        self._stats.record_error(message)
        self._metrics.call("set_fallback", True)
        if self._idle_writer is not None:  # from now on the engine's thread writes the file (below, and at shutdown)
            self._idle_writer.stop()
        if was_active or where == "setup":
            logger.error(
                "PeagleScheduler disabled after an error in %s; serving continues at the static depth K=%d%s. "
                "%s\n%s",
                where, self._k if self._fallback_depth is None else self._fallback_depth,
                " (no trimming)" if self._fallback_depth is None else " (drafts trimmed, no adaptation)",
                message, traceback.format_exc(),
            )
        self._flush(force=True)

    def _labeled(self, req_id: str) -> Labeled:
        """A live request's class, phase, cap and opt-out from ``sampling_params.extra_args`` (`RequestLabeler`),
        cached per request."""
        request = self.requests.get(req_id)
        labeled: Labeled | None = self._labels.get(req_id, request)
        if labeled is not None:
            return labeled
        params = getattr(request, "sampling_params", None) if request is not None else None
        labeler = self._labeler
        rejected = labeler.rejected
        labeled = labeler.label(req_id, getattr(params, "extra_args", None))
        if rejected == 0 and labeler.rejected:
            logger.warning("PeagleScheduler: request %s: %s; its own labels are ignored (logged once; counted in the "
                           "stats info as request_labels.rejected).", req_id, labeler.last_rejection)
        if request is not None:
            self._labels.put(req_id, request, labeled)
            self._labels.prune(self.requests)
        return labeled

    def _label(self, req_id: str) -> tuple[str, str]:
        """(class, phase) of a live request (`_labeled`), cached per request object: read for every request in
        every step."""
        request = self.requests.get(req_id)
        entry = self._class_phase.get(req_id)
        if entry is not None and entry[0] is request:
            return entry[1]
        labeled = self._labeled(req_id)
        label = (labeled.cls, labeled.phase)
        if request is not None:
            if len(self._class_phase) > 2 * len(self.requests) + 256:
                self._class_phase = {r: e for r, e in self._class_phase.items() if self.requests.get(r) is e[0]}
            stats = self._stats
            traced = stats is not None and stats.admit_trace(req_id, *label)
            self._class_phase[req_id] = (request, label, traced)
        return label

    # ---------------------------------------------------------------------------------------------- hooks
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        t0 = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        drafter_ran = not self._off_step and self._k > 0  # in the step before this one
        self._off_step = False
        if self._active:
            t1 = time.perf_counter()
            if self._idle_writer is not None:
                self._idle_writer.busy()  # the statistics change from here on (waits for a write in progress)
            try:
                if self._between_from is not None and self._stats is not None:
                    self._stats.observe_between_steps((t0 - self._between_from) * 1000.0, drafter_ran)
                self._between_from = None
                self._t0[id(output)] = t0
                self._decide(output)
            except Exception as exc:
                self._fail("schedule", exc)
            self._add_overhead(t1)
        return output

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        super().update_draft_token_ids(draft_token_ids)
        if not self._active:
            if self._fallback_depth is not None:
                self._trim_to_fallback(draft_token_ids)
            return
        if not self._next_depth:
            return
        t1 = time.perf_counter()
        try:
            if self._rules.lower_drafting and self._planned_width < self._k:
                drafted = max(map(len, draft_token_ids.draft_token_ids), default=0)
                if drafted > self._planned_width:
                    self._drafter_width_fallback(
                        f"the workers drafted {drafted} tokens per request where {self._planned_width} were planned"
                    )
            depths = self._next_depth
            self._trim(draft_token_ids.req_ids, depths.get)
        except Exception as exc:
            self._fail("update_draft_token_ids", exc)
        self._add_overhead(t1)

    def _trim(self, req_ids: Iterable[str], depth_of: Callable[[str], int | None]) -> None:
        """Cut each request's new drafts to ``depth_of(request id)`` (None: leave them)."""
        requests = self.requests
        for req_id in req_ids:
            request = requests.get(req_id)
            if request is None or not request.spec_token_ids:
                continue
            depth = depth_of(req_id)
            if depth is not None and len(request.spec_token_ids) > depth:
                request.spec_token_ids = request.spec_token_ids[:depth]

    def _trim_to_fallback(self, draft_token_ids: DraftTokenIds) -> None:
        """After the plugin turned itself off: every request verifies at most ``static_depth`` drafts. If even this
        fails, trimming stops for good (vLLM's own depth K)."""
        depth = self._fallback_depth
        try:
            self._trim(draft_token_ids.req_ids, lambda _: depth)
        except Exception as exc:
            self._fallback_depth = None
            logger.error("PeagleScheduler: static-depth trimming failed too (%s: %s); serving at K=%d untrimmed.",
                         type(exc).__name__, exc, self._k)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        observed: tuple[StepTally, list[_Row], int] | None = None
        if self._active:
            t1 = time.perf_counter()
            try:
                observed = self._observe(scheduler_output, model_runner_output)
            except Exception as exc:
                self._fail("update_from_output", exc)
            self._add_overhead(t1)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        t_end = time.perf_counter()
        t0 = self._t0.pop(id(scheduler_output), None)
        if self._active and observed is not None:
            try:
                self._record(observed, None if t0 is None else (t_end - t0) * 1000.0)
                idle = self.get_num_unfinished_requests() == 0
                writer = self._idle_writer
                if idle and writer is not None:  # written off this thread, unless a step starts first
                    writer.idle()
                elif idle or time.monotonic() - self._last_flush > self._config.flush_every_s:
                    self._flush()
                if idle:  # the last pushes were throttled: publish the final figures of the burst now
                    self._metrics.call("push")
            except Exception as exc:
                self._fail("update_from_output", exc)
                idle = True
            self._add_overhead(t_end)
            # The time to the next step is the engine core's (`PluginStats.between_steps`), unless it waits for work.
            self._between_from = None if idle or self._async else time.perf_counter()
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)
        if request_ids is None and self._stats is not None:
            # Every request finished at once: vLLM's shutdown without a drain timeout (the default) aborts them so,
            # then the API server kills the engine core at once, usually before `shutdown` below has run: write now.
            writer = self._idle_writer
            if writer is not None:
                writer.busy()  # waits for a write in progress
            self._flush(force=True)
            if writer is not None:
                writer.idle()  # no request is left
        return finished

    def shutdown(self) -> None:
        try:
            if self._idle_writer is not None:
                self._idle_writer.stop()
            self._flush(force=True)
            self._metrics.call("push", force=True)
        finally:
            super().shutdown()

    # --------------------------------------------------------------------------------------------- logic
    def _decide(self, output: SchedulerOutput) -> None:
        """Depths for the requests that will be drafted for in this step (they verify them in the next one)."""
        self._drafting_depth = self._k
        self._planned_width = output.num_spec_tokens_to_schedule
        self._batch_output = None
        if self._k == 0:
            return
        requests = self.requests
        ids = [r for r in output.num_scheduled_tokens if r in requests and not requests[r].is_prefill_chunk]
        self._next_depth = {}
        if not ids:
            return
        config, rules = self._config, self._rules
        if config.fault_class is not None:  # the test hook (a generator per step costs ~1 us otherwise)
            check_plugin_fault(config, (self._label(r)[0] for r in ids))
        members = [requests[r] for r in ids]
        same_batch = ids == self._last_ids and members == self._last_members
        if not same_batch:
            self._last_ids, self._last_members, self._last_views = ids, members, []
            self._off_observed = None
        self._batch_output = output
        # What the depths follow: the controller's decision (adaptive) or the base depth (static / plan).
        key: Any = self._adaptive_decision(ids, same_batch) if config.mode == "adaptive" else (
            self._plan.next_depth(len(ids)) if self._plan is not None else rules.static_base)
        last = self._last_depths
        if same_batch and last is not None and last[1] is rules and (last[0] is key or last[0] == key):
            depths = last[2]  # same requests, same decision (or base depth), same rules as last step: same depths
        else:
            if config.mode == "adaptive":
                chosen = {v.request_id: key.depth_for(v) for v in self._last_views}
            else:  # one base depth; opt-out and caps per request
                labeled = {r: self._labeled(r) for r in ids}
                chosen = rules.uniform(key, {r: not x.view.speculate for r, x in labeled.items()})
                chosen = {r: labeled[r].bound(d) for r, d in chosen.items()}
            classes = {r: self._label(r)[0] for r in ids} if rules.class_caps else {}
            depths = rules.apply_caps(chosen, classes)
            self._last_depths = (key, rules, depths)
        self._next_depth = depths
        drafting = rules.drafting_depth(depths)
        if rules.lower_drafting:
            output.num_spec_tokens_to_schedule = drafting
            # The requests that draft (and replay what they missed) in this step's drafter pass, sent to the workers
            # when not all of them: the others leave their prompt tokens out of it. None: every request.
            sent: frozenset[str] | None = None
            if self._skip:
                if drafting > 0 and depths is not self._drafting_for:
                    self._drafting_for, self._drafting_set = depths, drafting_requests(depths)
                sent = self._drafting_set if drafting > 0 else frozenset()
                if self._guard is not None and sent is not None:
                    # Blocks of prompts the drafter leaves out are evicted from the prefix cache, unless shared:
                    # the drafter reads those, so the next request with the prefix finds them cached.
                    shared = self._guard.settle(output, requests, sent)
                    if shared:
                        sent = sent | shared
            self._off_step = self._skip and not sent and is_off_step(output, drafting, self._width)
            if self._off_step:
                mark_off_step(output, True)
            elif sent:
                mark_drafting_requests(output, sent)
        self._planned_width = output.num_spec_tokens_to_schedule
        if self._async:  # the runner copies each request's first len(placeholders) drafts
            assign_placeholders(requests, output, depths)
        self._drafting_depth = drafting

    def _adaptive_decision(self, ids: list[str], same_batch: bool) -> Any:
        """The controller's `Decision` for this step's requests (``same_batch``: the same requests as last step, so
        the tracked batch is already in sync)."""
        policy, controller, batch = self._policy, self._controller, self._batch
        assert policy is not None and controller is not None
        if not same_batch or not self._last_views:
            views = [self._labeled(r).view for r in ids]  # built by the policy (`RequestLabeler`), cached per request
            batch.sync(views)
            self._last_views = views
        decision = controller.decide_or_fallback(batch)
        if self._metrics.active:
            self._metrics.call("observe_decision", decision, controller)
        if decision.fallback:
            self._controller_fallbacks += 1
            if self._stats is not None:
                self._stats.info["controller_fallbacks"] = self._controller_fallbacks
                self._stats.info.setdefault("controller_fallback_reason", decision.reason)
            if not self._fallback_logged:
                self._fallback_logged = True
                logger.warning("PeagleScheduler: controller fell back to static K=%d (logged once; counted in the "
                               "stats as controller_fallbacks): %s", decision.default_depth, decision.reason)
        return decision

    def _observe(
        self, output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> tuple[StepTally, list[_Row], int]:
        """The step's outcomes counted per (class, phase) (`StepTally`, what the controller, stats and metrics
        consume); per traced request (request id, class, phase, drafted, accepted) for the stats' traces; the
        drafting depth."""
        spec = output.scheduled_spec_decode_tokens
        scheduled_tokens = output.num_scheduled_tokens
        # An off-step of an unchanged batch (no draft verified, one token per request) observes exactly what the
        # last off-step of that batch did: reuse it (the tally and the rows are only read downstream).
        off_step = not spec and not self._async and output.total_num_scheduled_tokens == len(scheduled_tokens)
        known = self._batch_output is output and len(scheduled_tokens) == len(self._last_ids)
        if off_step and known and self._off_observed is not None:
            return *self._off_observed, self._drafting_depth
        sampled = runner_output.sampled_token_ids
        index = runner_output.req_id_to_index
        bonus = self.num_sampled_tokens_per_step
        rows = []
        tally = StepTally()
        prompt_tokens = 0
        # Async scheduling verifies the drafts behind its -1 placeholders (minus those structured output rejected).
        invalid = (getattr(output, "num_invalid_spec_tokens", None) or {}) if self._async else None
        label = self._label
        cached = self._class_phase
        requests = self.requests
        outcomes = tally.outcomes
        verified = deepest = size = 0
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
            # (class, phase), cached per request (`_label`): also the tally's key (`StepTally.add` inline)
            entry = cached.get(req_id)
            if entry is None or entry[0] is not requests.get(req_id):
                key = label(req_id)
                entry = cached.get(req_id)
                traced = entry is not None and entry[1] is key and entry[2]
            else:
                key, traced = entry[1], entry[2]
            per_key = outcomes.get(key)
            if per_key is None:
                per_key = outcomes[key] = {}
            pair = (drafted, accepted)
            per_key[pair] = per_key.get(pair, 0) + 1
            verified += drafted + 1
            if drafted > deepest:
                deepest = drafted
            if traced:  # the request's steps are recorded (`PluginStats.admit_trace`)
                rows.append((req_id, key[0], key[1], drafted, accepted))
            size += 1
        tally.size, tally.verified, tally.deepest, tally.prompt_tokens = size, verified, deepest, prompt_tokens
        if off_step and known and prompt_tokens == 0:
            self._off_observed = (tally, rows)
        return tally, rows, self._drafting_depth

    def _record(self, observed: tuple[StepTally, list[_Row], int], step_ms: float | None) -> None:
        tally, rows, drafting = observed
        if not tally.size:  # nothing was scheduled (an idle step): not an engine step worth recording
            return
        assert self._stats is not None
        self._stats.observe_tally(tally, step_ms=step_ms, drafting_depth=drafting, traces=rows)
        if self._controller is not None:
            # Decode steps are cost samples, with the drafts' fetch that follows the step (none after an off-step
            # whose fetch is skipped); the drafter's width in this step (not the depth verified in it) says whether
            # the drafter ran.
            learn_ms = None
            if step_ms is not None and tally.prompt_tokens == 0:
                learn_ms = self._fetch_cost.step_cost(step_ms, not (self._fetch_skipped and self._off_step))
            self._controller.observe_tally(tally, learn_ms, drafting)
        if self._metrics.active:
            self._metrics.call("maybe_push")

    def _add_overhead(self, since: float) -> None:
        if self._stats is not None:
            self._stats.overhead_ms += (time.perf_counter() - since) * 1000.0

    def _flush(self, force: bool = False) -> None:
        path = self._config.stats_path
        if path is None or self._stats is None:
            return
        labeler = self._labeler
        if labeler.rejected or any(labeler.folded.values()):
            self._stats.info["request_labels"] = {"rejected": labeler.rejected, **labeler.folded}
        try:
            self._stats.save(path)
            self._last_flush = time.monotonic()
        except Exception as exc:  # never let a full disk take the engine down
            if force or self._active:
                logger.error("PeagleScheduler: cannot write stats to %s (%s: %s); %s=%s", path,
                             type(exc).__name__, exc, CONFIG_ENV, path)


class PeagleAsyncScheduler(PeagleScheduler, AsyncScheduler):
    """The plugin under vLLM's async scheduling (`ASYNC_SCHEDULER_CLS`).

    vLLM's ``AsyncScheduler._update_after_schedule`` gives every decoding request ``num_spec_tokens_to_schedule``
    placeholder drafts, and the model runner copies the first ``len(placeholders)`` drafts of the request's row
    straight from the device; the drafts never reach the scheduler. So after ``schedule()`` the plugin sets each
    request's placeholders to its planned depth (`policies.plugin.drafting.assign_placeholders`) instead of trimming,
    and counts a request's placeholders as its verified drafts. Everything else is `PeagleScheduler`'s. Step times
    overlap under async scheduling (the next step is scheduled while the current one runs), so ``step_ms`` is the
    time between a step's schedule() and its update_from_output, not its cost alone.
    """
