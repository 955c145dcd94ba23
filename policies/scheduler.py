"""The vLLM scheduler plugin: runtime control of the verified draft depth, per step and per request.

Install it with ``LLM(..., **policies.engine_kwargs())`` (``scheduler_cls="policies.scheduler.PeagleScheduler"``,
``async_scheduling=False``) or ``vllm serve ... --scheduler-cls policies.scheduler.PeagleScheduler
--no-async-scheduling``, with ``PEAGLE_SCHEDULER_CONFIG`` naming a `PluginConfig` JSON file. This module imports vLLM
and is imported only by the engine-core process; ``import policies`` never imports it.

How depth is applied (vLLM 0.32, synchronous scheduling). Step n: ``schedule()`` builds the batch, whose draft
tokens were proposed during step n-1; the model runner verifies them, samples, and the drafter proposes drafts for
step n+1 (``num_spec_tokens_to_schedule`` of them per request); ``update_from_output()`` applies the result;
``update_draft_token_ids()`` hands the new drafts to the scheduler. The plugin decides the depths for step n+1 right
after ``schedule()`` of step n, and

1. trims each request's ``spec_token_ids`` to its depth after ``Scheduler.update_draft_token_ids`` (the verified
   depth of step n+1; greedy outputs are unchanged because a shorter verified prefix only produces fewer tokens per
   step, never different ones);
2. when ``lower_drafting_depth`` (default: sequential drafters only), sets ``num_spec_tokens_to_schedule`` of step n
   to the deepest depth of step n+1, so a sequential drafter runs no passes whose drafts would be trimmed. Parallel
   drafting (P-EAGLE, PARD) drafts all K in one pass and must keep its configured K (vLLM issue #45695), so only
   verification is saved there.

What is timed (``step_ms``): ``time.perf_counter()`` from the entry of `PeagleScheduler.schedule` to the return of
vLLM's ``Scheduler.update_from_output`` for the same step: scheduling (including the plugin's decision), the model
forward over the verified tokens, rejection sampling, the drafter's proposal for the next step, and the scheduler's
output processing. Not included: ``update_draft_token_ids`` (where the trimming happens), sending outputs to the
frontend, and idle time between steps. Only decode-only steps (no prompt token computed) become step-cost samples.

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
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

from policies._plugin_config import (
    CLASS_KEY,
    CONFIG_ENV,
    DEFAULT_CLASS,
    DEFAULT_PHASE,
    PHASE_KEY,
    PluginConfig,
    PluginStats,
    build_controller,
    normalize_extra_args,
    opted_out,
)

__all__ = ["PeagleScheduler"]

logger = init_logger("vllm.peagle_scheduler")


class PluginFault(RuntimeError):
    """Raised on purpose by the ``fault_class`` test hook."""


class PeagleScheduler(Scheduler):
    """vLLM's Scheduler plus per-request verified-depth control and step/acceptance statistics.

    See the module docstring for what is applied where, what is timed and how failures fall back.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._active = False
        self._stats: PluginStats | None = None
        self._config = PluginConfig()
        self._t0: dict[int, float] = {}
        self._next_depth: dict[str, int] = {}
        self._drafting_depth = 0
        self._lower = False
        self._labels: dict[str, tuple[Any, tuple[str, str]]] = {}
        self._plan_counters: dict[int, int] = {}
        self._decisions = 0
        self._last_flush = time.monotonic()
        self._policy: Any = None
        self._controller: Any = None
        self._batch: Any = None
        self._views: dict[str, tuple[Any, Any]] = {}
        self._fallback_logged = False
        self._fallback_depth: int | None = None  # trimming depth after the plugin turned itself off
        self._controller_fallbacks = 0
        self._metrics: Any = None
        spec = self.vllm_config.speculative_config
        self._k = int(self.num_spec_tokens or 0)
        self._parallel = bool(getattr(spec, "parallel_drafting", False)) if spec is not None else False
        try:
            self._setup()
        except Exception as exc:  # a bad config must not stop the engine: run as plain vLLM and say why
            self._fail("setup", exc)

    # ------------------------------------------------------------------------------------------------ setup
    def _setup(self) -> None:
        config = PluginConfig.from_env()
        self._config = config
        self._stats = PluginStats(max_samples_per_key=config.max_samples_per_key)
        spec = self.vllm_config.speculative_config
        async_on = bool(getattr(self.scheduler_config, "async_scheduling", False))
        lower = config.lower_drafting_depth
        if lower is None:
            lower = not self._parallel
        self._lower = bool(lower) and self._k > 0
        self._stats.info = {
            "mode": config.mode,
            "num_speculative_tokens": self._k,
            "method": getattr(spec, "method", None) if spec is not None else None,
            "parallel_drafting": self._parallel,
            "lower_drafting_depth": self._lower,
            "async_scheduling": async_on,
            "max_num_seqs": self.scheduler_config.max_num_seqs,
        }
        if self._k == 0:
            logger.warning("PeagleScheduler: no speculative decoding configured; recording step times only.")
        if async_on:
            raise RuntimeError(
                "PeagleScheduler needs synchronous scheduling: with async scheduling the drafts never pass through "
                "the scheduler, so depth cannot be controlled. Pass async_scheduling=False to LLM(...) or "
                "--no-async-scheduling to vllm serve (policies.engine_kwargs() / serve_args() do)."
            )
        if config.mode == "adaptive" and self._k > 0:
            from policies._controller import TrackedBatch

            self._policy, self._controller = build_controller(config, self._k)
            self._batch = TrackedBatch()
        if self._k > 0:
            self._start_metrics()
        self._active = True
        logger.info(
            "PeagleScheduler: mode=%s K=%d parallel_drafting=%s lower_drafting_depth=%s stats=%s",
            config.mode, self._k, self._parallel, self._lower, config.stats_path,
        )

    # ----------------------------------------------------------------------------------------- prometheus
    def _start_metrics(self) -> None:
        """The ``peagle:*`` Prometheus series (`policies._metrics`); visible in ``/metrics`` when vLLM runs with
        ``PROMETHEUS_MULTIPROC_DIR``. A metrics problem disables the metrics only, never depth control."""
        try:
            from policies._metrics import PluginMetrics

            config = self._config
            if config.mode == "adaptive" and self._controller is not None:
                static = self._controller.static_k
            else:
                static = self._k if config.static_depth is None else min(config.static_depth, self._k)
            rank = getattr(self.parallel_config, "data_parallel_rank", 0)
            self._metrics = PluginMetrics(self._k, static, engine=str(rank))
        except Exception as exc:
            self._metrics_failed("setup", exc)

    def _metrics_call(self, name: str, *args: Any, **kwargs: Any) -> None:
        metrics = self._metrics
        if metrics is None:
            return
        try:
            getattr(metrics, name)(*args, **kwargs)
        except Exception as exc:
            self._metrics_failed(name, exc)

    def _metrics_failed(self, where: str, exc: BaseException) -> None:
        self._metrics = None
        logger.warning("PeagleScheduler: Prometheus metrics disabled after an error in %s: %s: %s",
                       where, type(exc).__name__, exc)

    def _fail(self, where: str, exc: BaseException) -> None:
        """Log once, record, and turn the plugin off: from now on every request verifies ``static_depth`` drafts
        (vLLM's own behaviour, un-trimmed, when that is None or >= K)."""
        was_active = self._active
        self._active = False
        self._next_depth = {}
        static = self._config.static_depth
        self._fallback_depth = static if static is not None and static < self._k else None
        message = f"{where}: {type(exc).__name__}: {exc}"
        if self._stats is None:
            self._stats = PluginStats()
        self._stats.record_error(message)
        self._metrics_call("set_fallback", True)
        if was_active or where == "setup":
            logger.error(
                "PeagleScheduler disabled after an error in %s; serving continues at the static depth K=%d%s. "
                "%s\n%s",
                where, self._k if self._fallback_depth is None else self._fallback_depth,
                " (no trimming)" if self._fallback_depth is None else " (drafts trimmed, no adaptation)",
                message, traceback.format_exc(),
            )
        self._flush(force=True)

    # ---------------------------------------------------------------------------------------------- labels
    def _label(self, req_id: str) -> tuple[str, str]:
        """(class, phase) of a request from ``sampling_params.extra_args``; cached per live request (the cache
        entry remembers the request object, so a reused request id never inherits a finished request's label)."""
        request = self.requests.get(req_id)
        cached = self._labels.get(req_id)
        if cached is not None and cached[0] is request:
            return cached[1]
        cls, phase = DEFAULT_CLASS, DEFAULT_PHASE
        params = getattr(request, "sampling_params", None) if request is not None else None
        extra = getattr(params, "extra_args", None) or {}
        value = extra.get(CLASS_KEY)
        if isinstance(value, str) and value:
            cls = value
        value = extra.get(PHASE_KEY)
        if isinstance(value, str) and value:
            phase = value
        label = (cls, phase)
        if request is not None:
            self._labels[req_id] = (request, label)
            if len(self._labels) > 2 * len(self.requests) + 256:
                self._labels = {r: v for r, v in self._labels.items() if self.requests.get(r) is v[0]}
        return label

    # ---------------------------------------------------------------------------------------------- hooks
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        t0 = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        if self._active:
            t1 = time.perf_counter()
            try:
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
            depths = self._next_depth
            for req_id in draft_token_ids.req_ids:
                request = self.requests.get(req_id)
                if request is None or not request.spec_token_ids:
                    continue
                depth = depths.get(req_id)
                if depth is not None and len(request.spec_token_ids) > depth:
                    request.spec_token_ids = request.spec_token_ids[:depth]
        except Exception as exc:
            self._fail("update_draft_token_ids", exc)
        self._add_overhead(t1)

    def _trim_to_fallback(self, draft_token_ids: DraftTokenIds) -> None:
        """After the plugin turned itself off: every request verifies at most ``static_depth`` drafts. If even this
        fails, trimming stops for good (vLLM's own depth K)."""
        depth = self._fallback_depth
        assert depth is not None
        try:
            for req_id in draft_token_ids.req_ids:
                request = self.requests.get(req_id)
                if request is not None and len(request.spec_token_ids) > depth:
                    request.spec_token_ids = request.spec_token_ids[:depth]
        except Exception as exc:
            self._fallback_depth = None
            logger.error("PeagleScheduler: static-depth trimming failed too (%s: %s); serving at K=%d untrimmed.",
                         type(exc).__name__, exc, self._k)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        observed: Any = None
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
                if idle or time.monotonic() - self._last_flush > self._config.flush_every_s:
                    self._flush()
                if idle:  # the last pushes were throttled: publish the final figures of the burst now
                    self._metrics_call("push")
            except Exception as exc:
                self._fail("update_from_output", exc)
            self._add_overhead(t_end)
        return outputs

    def shutdown(self) -> None:
        try:
            self._flush(force=True)
            self._metrics_call("push", force=True)
        finally:
            super().shutdown()

    # --------------------------------------------------------------------------------------------- logic
    def _decide(self, output: SchedulerOutput) -> None:
        """Depths for the requests that will be drafted for in this step (they verify them in the next one)."""
        self._drafting_depth = self._k
        if self._k == 0:
            return
        requests = self.requests
        ids = [r for r in output.num_scheduled_tokens if r in requests and not requests[r].is_prefill_chunk]
        self._next_depth = {}
        if not ids:
            return
        self._decisions += 1
        config = self._config
        if (
            config.fault_class is not None
            and config.fault_where == "plugin"
            and any(self._label(r)[0] == config.fault_class for r in ids)
        ):
            raise PluginFault(f"fault_class={config.fault_class!r} test hook")
        k = self._k
        depths: dict[str, int] = {}
        if config.mode == "adaptive":
            depths = self._adaptive_depths(ids)
        else:
            if config.mode == "plan":
                assert config.plan is not None
                b = len(ids)
                step = self._plan_counters.get(b, 0)
                self._plan_counters[b] = step + 1
                base = config.plan.depth_at(step)
            else:
                base = k if config.static_depth is None else config.static_depth
            for r in ids:
                extra = getattr(requests[r].sampling_params, "extra_args", None)
                depths[r] = 0 if extra and opted_out(extra) else base
        caps = config.class_depths
        for r in ids:
            d = depths[r]
            if caps:
                cap = caps.get(self._label(r)[0])
                if cap is not None and cap < d:
                    d = cap
            depths[r] = min(max(d, 0), k)
        self._next_depth = depths
        drafting = k
        if self._lower:
            drafting = max(depths.values())
            output.num_spec_tokens_to_schedule = drafting
        self._drafting_depth = drafting

    def _adaptive_depths(self, ids: list[str]) -> dict[str, int]:
        policy, controller, batch = self._policy, self._controller, self._batch
        views = []
        for r in ids:
            request = self.requests[r]
            cached = self._views.get(r)
            if cached is not None and cached[0] is request:
                view = cached[1]
            else:
                # vLLM's OpenAI server delivers a JSON false in vllm_xargs as 0: normalise before the policy reads it.
                extra = normalize_extra_args(getattr(request.sampling_params, "extra_args", None))
                try:
                    view = policy.view(r, extra)
                except ValueError as exc:  # a bad label on one request: default class, not a plugin failure
                    logger.warning("PeagleScheduler: request %s: %s; using the default class.", r, exc)
                    view = policy.view(r, None)
                self._views[r] = (request, view)
            views.append(view)
        if len(self._views) > 2 * len(self.requests) + 256:
            self._views = {r: v for r, v in self._views.items() if self.requests.get(r) is v[0]}
        batch.sync(views)
        decision = controller.decide_or_fallback(batch)
        self._metrics_call("observe_decision", decision, controller)
        if decision.fallback:
            self._controller_fallbacks += 1
            if self._stats is not None:
                self._stats.info["controller_fallbacks"] = self._controller_fallbacks
                self._stats.info.setdefault("controller_fallback_reason", decision.reason)
            if not self._fallback_logged:
                self._fallback_logged = True
                logger.warning("PeagleScheduler: controller fell back to static K=%d (logged once; counted in the "
                               "stats as controller_fallbacks): %s", decision.default_depth, decision.reason)
        return {v.request_id: decision.depth_for(v) for v in views}

    def _observe(
        self, output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> tuple[list[tuple[str, str, str, int, int]], int, int]:
        """Per scheduled request: (request id, class, phase, drafted, accepted); prompt tokens; drafting depth."""
        sampled = runner_output.sampled_token_ids
        index = runner_output.req_id_to_index
        spec = output.scheduled_spec_decode_tokens
        bonus = self.num_sampled_tokens_per_step
        rows = []
        prompt_tokens = 0
        for req_id, n in output.num_scheduled_tokens.items():
            scheduled = spec.get(req_id) or ()
            drafted = sum(1 for t in scheduled if t >= 0)
            extra = n - bonus - len(scheduled)
            if extra > 0:
                prompt_tokens += extra
            accepted = 0
            if drafted and sampled:
                i = index.get(req_id)
                if i is not None:
                    accepted = min(max(len(sampled[i]) - bonus, 0), drafted)
            cls, phase = self._label(req_id)
            rows.append((req_id, cls, phase, drafted, accepted))
        return rows, prompt_tokens, self._drafting_depth

    def _record(self, observed: tuple[list[tuple[str, str, str, int, int]], int, int], step_ms: float | None) -> None:
        rows, prompt_tokens, drafting = observed
        if not rows:  # nothing was scheduled (an idle step): not an engine step worth recording
            return
        assert self._stats is not None
        self._stats.observe_step(
            step_ms=step_ms,
            prompt_tokens=prompt_tokens,
            requests=[(c, p, d, a) for _, c, p, d, a in rows],
            drafting_depth=drafting,
        )
        if self._controller is not None:
            results = [(r, c, d, a) for r, c, _, d, a in rows]
            self._controller.observe_step(results, step_ms if prompt_tokens == 0 else None)
        if self._metrics is not None:
            self._metrics_call("observe_requests", [(c, d, a) for _, c, _, d, a in rows])
            self._metrics_call("maybe_push")

    def _add_overhead(self, since: float) -> None:
        if self._stats is not None:
            self._stats.overhead_ms += (time.perf_counter() - since) * 1000.0

    def _flush(self, force: bool = False) -> None:
        path = self._config.stats_path
        if path is None or self._stats is None:
            return
        try:
            self._stats.save(path)
            self._last_flush = time.monotonic()
        except Exception as exc:  # never let a full disk take the engine down
            if force or self._active:
                logger.error("PeagleScheduler: cannot write stats to %s (%s: %s); %s=%s", path,
                             type(exc).__name__, exc, CONFIG_ENV, path)
