"""The vLLM scheduler plugin: runtime control of the verified draft depth, per step and per request.

Install it with ``LLM(..., **policies.plugin.engine_kwargs(async_scheduling=False))``
(``scheduler_cls="policies.scheduler.PeagleScheduler"``) or ``vllm serve ... --scheduler-cls
policies.scheduler.PeagleScheduler --no-async-scheduling``, with ``PEAGLE_SCHEDULER_CONFIG`` naming a `PluginConfig`
JSON file; where vLLM schedules async (a GPU), ``async_scheduling=True`` installs `PeagleAsyncScheduler` (below). A
`PeagleScheduler` constructed under async scheduling refuses to start, in one line, rather than serve without
speculation. This module imports vLLM and is imported only by the engine-core process (vLLM loads it by
that class path, which `policies.scheduler` re-exports); ``import policies`` and ``import policies.plugin`` never
import it. It is a thin adapter over parts that import no vLLM: the depth decision per step
(`_depth_step.DepthDecider`, with `policies.DepthRules` and the adaptive controller from
`policies.plugin.build_controller`), drafter-width control (`_width_control.WidthControl`), the request labels
(`_request_labels.RequestLabels`), and what a step records (`_step_record`: acceptance counted per (class, phase), fed
to `policies.plugin.PluginStats`, the controller and the metrics).

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
from collections.abc import Callable, Iterable
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

from policies import DepthRules, PlanClock, RequestPolicy
from policies.plugin._depth_step import DepthDecider
from policies.plugin._request_labels import RequestLabels
from policies.plugin._step_record import Observed, StepObserver, record_step
from policies.plugin._width_control import WidthControl
from policies.plugin.config import ASYNC_SCHEDULER_CLS, CONFIG_ENV, PluginConfig
from policies.plugin.drafting import assign_placeholders
from policies.plugin.factory import build_controller
from policies.plugin.idle_writer import IdleWriter
from policies.plugin.labels import RequestLabeler
from policies.plugin.metrics import GuardedMetrics, metrics_visible
from policies.plugin.stats import PluginStats

__all__ = ["PeagleAsyncScheduler", "PeagleScheduler"]

logger = init_logger("vllm.peagle_scheduler")


def _graph_mode(vllm_config: Any) -> str | None:
    """The engine's CUDA-graph mode name as vLLM settled it (``compilation_config.cudagraph_mode``, e.g.
    FULL_AND_PIECEWISE on a GPU, NONE on the CPU build); None when unknown."""
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    if mode is None:
        return None
    return str(getattr(mode, "name", mode))


class PeagleScheduler(Scheduler):
    """vLLM's Scheduler plus per-request verified-depth control and step/acceptance statistics.

    See the module docstring for what is applied where, what is timed and how failures fall back.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._async = isinstance(self, AsyncScheduler)
        if getattr(self.scheduler_config, "async_scheduling", False) and not self._async:
            # Refused, not served without the plugin: vLLM's async engine core never hands this scheduler the
            # drafts (vllm/v1/engine/core.py:693), so it could neither trim nor count them.
            raise RuntimeError(
                f"{type(self).__name__} runs only with synchronous scheduling, but this engine schedules async: "
                f"pass scheduler_cls={ASYNC_SCHEDULER_CLS!r} (policies.plugin.engine_kwargs(async_scheduling=True)) "
                "or --no-async-scheduling."
            )
        spec = self.vllm_config.speculative_config
        self._k = int(self.num_spec_tokens or 0)
        self._parallel = bool(getattr(spec, "parallel_drafting", False)) if spec is not None else False
        self._active = False
        self._config = PluginConfig()
        self._stats: PluginStats | None = None
        self._metrics = GuardedMetrics(logger)
        self._labels = RequestLabels(self.requests, logger)
        self._decider = DepthDecider(self._labels, self._metrics, logger, self._k)
        self._width = WidthControl()
        self._observer = StepObserver(self._labels, self.num_sampled_tokens_per_step, self._async)
        # id(SchedulerOutput) -> (perf_counter at schedule() entry, the step's drafting depth). Keyed by the output
        # because under async scheduling step n+1 is scheduled before step n's output is applied.
        self._scheduled: dict[int, tuple[float, int]] = {}
        self._next_depth: dict[str, int] = {}  # verified depth of the next step per request
        self._drafting_depth = 0
        self._between_from: float | None = None  # when the last step ended, while requests were unfinished
        self._last_flush = time.monotonic()
        self._idle_writer: IdleWriter | None = None  # writes the stats file once the engine stays idle
        self._fallback_depth: int | None = None  # trimming depth after the plugin turned itself off
        self._width_fallback_logged = False
        try:
            self._setup()
        except Exception as exc:  # a bad config must not stop the engine: run as plain vLLM and say why
            self._fail("setup", exc)

    @property
    def _controller(self) -> Any:
        """The adaptive mode's depth controller (None otherwise)."""
        return self._decider.controller

    @property
    def _rules(self) -> DepthRules:
        return self._decider.rules

    # ------------------------------------------------------------------------------------------------ setup
    def _setup(self) -> None:
        config = PluginConfig.from_env()
        k, width, decider = self._k, self._width, self._decider
        result = width.handshake(config, self, k)
        lower = DepthRules.lowers_drafting(config.lower_drafting_depth, self._parallel, k)
        if result.lower_width and config.lower_drafting_depth is not False:
            lower = k > 0  # every worker drafts only the planned width (parallel drafting included)
        width.skip = result.skip_drafter and lower
        if k > 0 and not self._async:  # the fetch is timed (a cost of drafting steps), skipped after off-steps
            width.time_fetch(self._fetched)
        self._config = config
        decider.rules = DepthRules(k, config.static_depth, config.class_depths, lower)
        decider.mode = config.mode
        decider.fault = config if config.fault_class is not None else None
        stats = self._stats = PluginStats(max_samples_per_key=config.max_samples_per_key)
        decider.info = stats.info
        if config.stats_path is not None and config.idle_write_delay_s > 0:
            self._idle_writer = IdleWriter(self._flush, delay_s=min(config.idle_write_delay_s, config.flush_every_s))
        if config.mode == "plan" and config.plan is not None:
            decider.plan = PlanClock(config.plan.depth_at)
        spec = self.vllm_config.speculative_config
        async_on = bool(getattr(self.scheduler_config, "async_scheduling", False))
        stats.info.update({
            "mode": config.mode,
            "num_speculative_tokens": k,
            "method": getattr(spec, "method", None) if spec is not None else None,
            "parallel_drafting": self._parallel,
            "lower_drafting_depth": lower,
            "async_scheduling": async_on or self._async,
            "drafter_width": width.info(),
            "max_num_seqs": self.scheduler_config.max_num_seqs,
            "cudagraph_mode": _graph_mode(self.vllm_config),
        })
        if k == 0:
            logger.warning("PeagleScheduler: no speculative decoding configured; recording step times only.")
        if config.mode == "adaptive" and k > 0:
            decider.policy, decider.controller = build_controller(config, k, _graph_mode(self.vllm_config))
            if width.skip:  # a step where every request is at depth 0 costs no drafter pass
                decider.set_drafter_always_runs(False)
        # Request labels are resolved by the operator's policy when there is one (clients never raise their cap),
        # and bounded in number either way (`RequestLabeler`).
        label_policy = decider.policy
        if label_policy is None and config.policy is not None:
            label_policy = RequestPolicy.from_dict(dict(config.policy), source="plugin config policy")
        self._labels.labeler = RequestLabeler.from_env(label_policy)
        self._labels.admit_trace = stats.admit_trace
        if k > 0 and metrics_visible():
            # The ``peagle:*`` series (`policies.plugin.metrics`), kept only where ``/metrics`` can show them (with
            # PROMETHEUS_MULTIPROC_DIR). A metrics problem disables the metrics only, never depth control.
            controller = decider.controller
            static = controller.static_k if controller is not None else decider.rules.reported_static_depth
            rank = getattr(self.parallel_config, "data_parallel_rank", 0)
            # Counters come from the stats' per-class counts when the series are pushed (nothing per step).
            self._metrics.start(k, static, engine=str(rank), counts_source=stats.class_counts)
            self._metrics.call("set_drafter_width", result.state)
        self._active = True
        logger.info(
            "PeagleScheduler: mode=%s K=%d parallel_drafting=%s lower_drafting_depth=%s skip_drafter=%s "
            "async=%s stats=%s metrics=%s drafter_width=%s%s",
            config.mode, k, self._parallel, lower, width.skip, self._async, config.stats_path,
            "on" if self._metrics.active else "off", result.state,
            "" if result.reason is None else (
                f" ({result.reason})" if result.lower_width
                else f" (depth applied by trimming drafts: {result.reason})"),
        )

    # ------------------------------------------------------------------------------------------------ hooks
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        t0 = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        width = self._width
        drafter_ran = not width.off_step and self._k > 0  # in the step before this one
        width.off_step = False
        if self._active:
            t1 = time.perf_counter()
            if self._idle_writer is not None:
                self._idle_writer.busy()  # the statistics change from here on (waits for a write in progress)
            try:
                if self._between_from is not None and self._stats is not None:
                    self._stats.observe_between_steps((t0 - self._between_from) * 1000.0, drafter_ran)
                self._between_from = None
                self._decide(output)
                self._scheduled[id(output)] = (t0, self._drafting_depth)
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
            if self._decider.rules.lower_drafting:
                reason = self._width.check_drafts(draft_token_ids.draft_token_ids, self._k)
                if reason is not None:
                    self._drafter_width_fallback(reason)
            self._trim(draft_token_ids.req_ids, self._next_depth.get)
        except Exception as exc:
            self._fail("update_draft_token_ids", exc)
        self._add_overhead(t1)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        observed: Observed | None = None
        if self._active:
            t1 = time.perf_counter()
            try:
                scheduled = self._scheduled.get(id(scheduler_output))
                drafting = self._drafting_depth if scheduled is None else scheduled[1]
                observed = self._observe(scheduler_output, model_runner_output, drafting)
            except Exception as exc:
                self._fail("update_from_output", exc)
            self._add_overhead(t1)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        t_end = time.perf_counter()
        scheduled = self._scheduled.pop(id(scheduler_output), None)
        t0 = None if scheduled is None else scheduled[0]
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

    # ------------------------------------------------------------------------------------------------ steps
    def _decide(self, output: SchedulerOutput) -> None:
        """Depths for the requests that will be drafted for in this step (they verify them in the next one)."""
        width = self._width
        self._drafting_depth = self._k
        width.planned_width = output.num_spec_tokens_to_schedule
        self._next_depth = {}
        if self._k == 0:
            self._decider.batch_output = None
            return
        requests = self.requests
        depths = self._next_depth = self._decider.decide(output, requests)
        if not depths:
            return
        rules = self._decider.rules
        drafting = rules.drafting_depth(depths)
        if rules.lower_drafting:
            width.mark(output, requests, depths, drafting)
        width.planned_width = output.num_spec_tokens_to_schedule
        if self._async:  # the runner copies each request's first len(placeholders) drafts
            assign_placeholders(requests, output, depths)
        self._drafting_depth = drafting

    def _observe(self, output: SchedulerOutput, runner_output: ModelRunnerOutput, drafting: int) -> Observed:
        """``drafting``: the drafting depth decided in ``output``'s own schedule() (under async scheduling the
        next step's decision has been made by the time ``output``'s result comes back)."""
        return self._observer.observe(output, runner_output, self._decider.batch_of(output), drafting)

    def _record(self, observed: Observed, step_ms: float | None) -> None:
        assert self._stats is not None
        width = self._width
        record_step(observed, step_ms, self._stats, self._decider.controller, self._metrics, width.fetch_cost,
                    not (width.fetch_skipped and width.off_step))

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

    def _add_overhead(self, since: float) -> None:
        if self._stats is not None:
            self._stats.overhead_ms += (time.perf_counter() - since) * 1000.0

    def _fetched(self, ms: float) -> None:
        """The engine core fetched the drafts of the step just executed in ``ms`` (recorded in the stats)."""
        self._width.fetch_cost.observe(ms)
        if self._stats is not None:
            self._stats.observe_draft_fetch(ms)

    def _flush(self, force: bool = False) -> None:
        path = self._config.stats_path
        if path is None or self._stats is None:
            return
        counts = self._labels.counts()
        if counts is not None:
            self._stats.info["request_labels"] = counts
        try:
            self._stats.save(path)
            self._last_flush = time.monotonic()
        except Exception as exc:  # never let a full disk take the engine down
            if force or self._active:
                logger.error("PeagleScheduler: cannot write stats to %s (%s: %s); %s=%s", path,
                             type(exc).__name__, exc, CONFIG_ENV, path)

    # -------------------------------------------------------------------------------------------- fallbacks
    def _drafter_width_fallback(self, reason: str) -> None:
        """The workers stopped drafting the planned width (a worker-side fault): back to trimming at K."""
        decider = self._decider
        decider.rules = dataclasses.replace(decider.rules, lower_drafting=DepthRules.lowers_drafting(
            False if self._parallel else self._config.lower_drafting_depth, self._parallel, self._k))
        self._width.skip = False
        decider.set_drafter_always_runs(True)
        if self._stats is not None:
            info = self._stats.info.setdefault("drafter_width", {})
            info.update({"state": "fell_back", "fallback": reason, "lower_width": False, "skip_drafter": False})
            self._stats.info["lower_drafting_depth"] = decider.rules.lower_drafting
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
        self._fallback_depth = self._decider.rules.fallback_depth
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


class PeagleAsyncScheduler(PeagleScheduler, AsyncScheduler):
    """The plugin under vLLM's async scheduling (`ASYNC_SCHEDULER_CLS`), vLLM's default on a GPU
    (vllm/config/vllm.py:1585-1644).

    vLLM's ``AsyncScheduler._update_after_schedule`` (vllm/v1/core/sched/async_scheduler.py:25-50) gives every
    decoding request ``num_spec_tokens_to_schedule`` placeholder drafts, and the model runner copies the first
    ``len(placeholders)`` drafts of the request's row straight from the device; the drafts never reach the scheduler
    (the engine core fetches them only when synchronous, vllm/v1/engine/core.py:693). So after ``schedule()`` the
    plugin sets each request's placeholders to its planned depth (`policies.plugin.drafting.assign_placeholders`)
    instead of trimming, and counts a request's placeholders as its verified drafts.

    Acceptance one step older: the engine core's batch queue (``step_with_batch_queue``, vllm/v1/engine/core.py:698)
    schedules step n+1 before it applies step n's output, so the depths decided in schedule(n+1) see acceptance up to
    step n-1, where the synchronous plugin's see step n. Each step's outcome is recorded with the drafting depth
    decided in its own schedule() (not the latest decision). Step times overlap (the next step is scheduled while
    the current one runs), so ``step_ms`` is the time from a step's schedule() to its update_from_output, which
    includes scheduling the next step, and ``between_steps`` and the draft fetch are not recorded. Under async
    scheduling an off-step runs the drafter over one slot (``sync_pass``, `policies._off_steps`), so no step skips
    the drafter and the controller prices depth 0 with a drafter pass. Everything else is `PeagleScheduler`'s.

    Tested against vLLM's real scheduler classes with a fake engine core on CPU (tests/test_async_depth.py); the CPU
    build forces async scheduling off, so no real engine has run it.
    """
