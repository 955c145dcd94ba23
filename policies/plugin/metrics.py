"""Prometheus metrics of the scheduler plugin: chosen depth, estimated acceptance, predicted goodput, live counters.

Where they appear. The plugin runs in vLLM's engine-core process, but ``/metrics`` is served by the API-server
process. With ``PROMETHEUS_MULTIPROC_DIR`` set in the environment of ``vllm serve`` (``peagle-tune serve`` sets it
to a fresh directory per launch), prometheus_client runs in multiprocess mode in every vLLM process: each writes
its values to memory-mapped files in that directory and vLLM's ``/metrics`` (which then uses a
``MultiProcessCollector``, `vllm.v1.metrics.prometheus.get_prometheus_registry`) aggregates all of them, so the
``peagle:*`` series below sit next to vLLM's own. Without that variable nothing could read them from the engine
process, so the plugin does not keep them (`metrics_visible`): pushing them cost the engine 0.8 ms a second and
after every burst (12.8 us per step at batch 8 in an offline engine on the 2-core CPU box). Gauges use
``multiprocess_mode="mostrecent"`` as vLLM's do.

Series (label ``engine``: the data-parallel rank):

- ``peagle:depth{class}``: the controller's current depth per class, before per-request caps (predicted best);
- ``peagle:batch_depth``: the deepest verified depth of the last decision; ``peagle:static_depth``: the fallback;
- ``peagle:estimated_acceptance_length{class}``: AL at the class's current depth, tokens per request-step
  including the bonus token (the live estimate); ``peagle:estimated_survival{class,position}``: P(the first
  position+1 drafts are accepted), position 0-based like vLLM's ``spec_decode_num_accepted_tokens_per_pos``;
- ``peagle:predicted_goodput_tokens_per_second`` and ``peagle:predicted_step_seconds`` of the last decision;
- ``peagle:fallback``: 1 while the plugin serves at the static depth (controller error or plugin disabled);
- ``peagle:drafter_width_active``: 1 while the drafter drafts only the planned width, 0 while depth is applied by
  trimming; ``peagle:drafter_width_state{state}``: 1 for the state in effect, 0 for the others
  (`policies.plugin.drafter_width.DRAFTER_WIDTH_STATES`: active, disabled, no_speculation, v2_runner, unsupported,
  install_failed, fell_back);
- counters ``peagle:decisions_total``, ``peagle:fallback_decisions_total``, and per class the measured
  ``peagle:drafts_total``, ``peagle:draft_tokens_total``, ``peagle:accepted_tokens_total`` and
  ``peagle:accepted_tokens_per_pos_total{position}``.

Writes are batched: counters accumulate in memory and everything is pushed to Prometheus at most every
``min_interval_s`` (default 1 s), so a step pays a few dictionary updates, not file writes. The scheduler plugin
passes no per-step counts at all: it gives `PluginMetrics` a ``counts_source`` (the plugin statistics' cumulative
per-class counts, `policies.plugin.PluginStats.class_counts`), read only when the series are pushed.

Bounded: the ``class`` label takes at most ``max_classes`` values (default `MAX_CLASSES`; the first seen), later
classes are exported as "other" (`policies.plugin.labels.LabelBook`). Under a policy the classes are its known
classes anyway; the bound keeps ``/metrics`` small whatever labels requests carry (per class at most 2 K + 5 series).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from policies.plugin.drafter_width import DRAFTER_WIDTH_STATES
from policies.plugin.labels import MAX_CLASSES, LabelBook

__all__ = ["METRIC_NAMES", "GuardedMetrics", "PluginMetrics", "metrics_visible"]

METRIC_NAMES: tuple[str, ...] = (
    "peagle:depth",
    "peagle:batch_depth",
    "peagle:static_depth",
    "peagle:estimated_acceptance_length",
    "peagle:estimated_survival",
    "peagle:predicted_goodput_tokens_per_second",
    "peagle:predicted_step_seconds",
    "peagle:fallback",
    "peagle:decisions",
    "peagle:fallback_decisions",
    "peagle:drafts",
    "peagle:draft_tokens",
    "peagle:accepted_tokens",
    "peagle:accepted_tokens_per_pos",
    "peagle:drafter_width_active",
    "peagle:drafter_width_state",
)
"""Metric names (counters get ``_total`` appended in the exposition)."""

_SERIES: dict[str, Any] | None = None  # one set of metric objects per process (prometheus forbids re-registering)


def _series() -> dict[str, Any]:
    global _SERIES
    if _SERIES is None:
        from prometheus_client import Counter, Gauge

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return Gauge(name, doc, ["engine", *labels], multiprocess_mode="mostrecent")

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return Counter(name, doc, ["engine", *labels])

        _SERIES = {
            "depth": gauge(
                "peagle:depth", "Controller's verified depth per class before per-request caps.", ("class",)
            ),
            "batch_depth": gauge("peagle:batch_depth", "Deepest verified depth of the last decision."),
            "static_depth": gauge("peagle:static_depth", "Static (fallback) verified depth."),
            "al": gauge(
                "peagle:estimated_acceptance_length",
                "Estimated acceptance length at the class's current depth (tokens per request-step, bonus included).",
                ("class",),
            ),
            "survival": gauge(
                "peagle:estimated_survival",
                "Estimated probability that the first position+1 drafts are accepted.",
                ("class", "position"),
            ),
            "goodput": gauge(
                "peagle:predicted_goodput_tokens_per_second", "Predicted goodput of the last decision (tokens/s)."
            ),
            "step": gauge("peagle:predicted_step_seconds", "Predicted engine step time of the last decision (s)."),
            "fallback": gauge("peagle:fallback", "1 while the plugin serves at the static depth (fallback)."),
            "decisions": counter("peagle:decisions", "Depth decisions made by the controller."),
            "fallback_decisions": counter("peagle:fallback_decisions", "Decisions that fell back to the static depth."),
            "drafts": counter(
                "peagle:drafts", "Drafts verified (request-steps with >= 1 draft), measured.", ("class",)
            ),
            "draft_tokens": counter("peagle:draft_tokens", "Draft tokens verified, measured.", ("class",)),
            "accepted": counter("peagle:accepted_tokens", "Draft tokens accepted, measured.", ("class",)),
            "accepted_pos": counter(
                "peagle:accepted_tokens_per_pos", "Accepted draft tokens per position, measured.", ("class", "position")
            ),
            "width_active": gauge(
                "peagle:drafter_width_active", "1 while the drafter drafts only the planned width, 0 while depth is "
                "applied by trimming drafts (see peagle:drafter_width_state for why)."
            ),
            "width_state": gauge(
                "peagle:drafter_width_state", "1 for the drafter-width state in effect (active, or the trimming "
                "fallback and its cause), 0 for the others.", ("state",)
            ),
        }
    return _SERIES


class PluginMetrics:
    """The plugin's Prometheus series (see the module docstring); cheap to call every step.

    ``engine``: label value (the data-parallel rank). ``max_k``: positions of the survival gauges.
    ``max_classes``: distinct values of the ``class`` label (later classes are exported as "other").
    ``counts_source``: returns cumulative per-class counts ([drafts, draft tokens, accepted, accepted at position
    0, 1, ...]); read at every push, the differences since the last push are added to the counters (instead of
    `observe_tally` / `observe_requests` every step).
    """

    def __init__(
        self,
        max_k: int,
        static_depth: int,
        *,
        engine: str = "0",
        min_interval_s: float = 1.0,
        max_classes: int = MAX_CLASSES,
        counts_source: Callable[[], Mapping[str, Sequence[int]]] | None = None,
    ) -> None:
        self.max_k = int(max_k)
        self.counts_source = counts_source
        self._pulled: dict[str, list[int]] = {}  # counts_source's figures at the last push
        self._classes = LabelBook(max_classes)
        self.engine = str(engine)
        self.min_interval_s = float(min_interval_s)
        self._series = _series()
        self._next_push = 0.0
        self._decisions = 0
        self._fallbacks = 0
        self._counts: dict[str, list[int]] = {}  # class -> [drafts, draft tokens, accepted, acc pos 0, acc pos 1, ...]
        self._decision: Any = None
        self._controller: Any = None
        self._fallback = False
        self._series["static_depth"].labels(self.engine).set(static_depth)
        self._series["fallback"].labels(self.engine).set(0)

    def observe_decision(self, decision: Any, controller: Any = None) -> None:
        """Note a `policies.Decision` (and the controller whose estimates to export)."""
        self._decisions += 1
        if decision.fallback:
            self._fallbacks += 1
        self._fallback = bool(decision.fallback)
        self._decision = decision
        self._controller = controller

    def observe_requests(self, rows: Iterable[tuple[str, int, int]]) -> None:
        """One step's measured results: (class, drafted, accepted) per request."""
        counts = self._counts
        width = 3 + self.max_k
        admit = self._classes.admit
        for cls, drafted, accepted in rows:
            if drafted <= 0:
                continue
            cls = admit(cls)
            c = counts.get(cls)
            if c is None:
                c = counts[cls] = [0] * width
            c[0] += 1
            c[1] += drafted
            c[2] += accepted
            for i in range(min(accepted, self.max_k)):
                c[3 + i] += 1

    def observe_tally(self, tally: Any) -> None:
        """One step's measured results counted per class (a `policies.StepTally`): the same counters as
        `observe_requests`, with work per distinct outcome instead of per request."""
        counts = self._counts
        width = 3 + self.max_k
        admit = self._classes.admit
        for (cls, _phase), outcomes in tally.outcomes.items():
            c = None
            for (drafted, accepted), m in outcomes.items():
                if drafted <= 0:
                    continue
                if c is None:
                    label = admit(cls)
                    c = counts.get(label)
                    if c is None:
                        c = counts[label] = [0] * width
                c[0] += m
                c[1] += drafted * m
                c[2] += accepted * m
                for i in range(min(accepted, self.max_k)):
                    c[3 + i] += m

    def observe_cumulative(self, counts: Mapping[str, Sequence[int]]) -> None:
        """Cumulative per-class counts (see ``counts_source``): what grew since the last call is counted."""
        width = 3 + self.max_k
        admit = self._classes.admit
        pulled = self._pulled
        for cls, now in counts.items():
            before = pulled.get(cls)
            if before is None:
                before = pulled[cls] = [0] * len(now)
            elif len(before) < len(now):
                before += [0] * (len(now) - len(before))
            if now[0] == before[0]:
                continue  # no draft verified since (every count grows with the drafts)
            label = admit(cls)
            c = self._counts.get(label)
            if c is None:
                c = self._counts[label] = [0] * width
            for i in range(min(len(now), width)):
                c[i] += now[i] - before[i]
            before[:] = now

    def set_drafter_width(self, state: str) -> None:
        """Publish the drafter-width state (one of `DRAFTER_WIDTH_STATES`): ``peagle:drafter_width_active`` 1 for
        "active", else 0; ``peagle:drafter_width_state{state}`` 1 for `state`, 0 for every other state."""
        if state not in DRAFTER_WIDTH_STATES:
            raise ValueError(f"drafter-width state must be one of {DRAFTER_WIDTH_STATES}, but got {state!r}.")
        s, e = self._series, self.engine
        s["width_active"].labels(e).set(1 if state == "active" else 0)
        for name in DRAFTER_WIDTH_STATES:
            s["width_state"].labels(e, name).set(1 if name == state else 0)

    def set_fallback(self, on: bool = True) -> None:
        """Mark the plugin as serving at the static depth (e.g. after it disabled itself)."""
        self._fallback = on
        self.push(force=True)

    def maybe_push(self, now: float | None = None) -> None:
        """Push to Prometheus if ``min_interval_s`` has passed since the last push."""
        now = time.monotonic() if now is None else now
        if now >= self._next_push:
            self._next_push = now + self.min_interval_s
            self.push()

    def push(self, force: bool = False) -> None:
        """Write everything accumulated so far to the Prometheus series."""
        if self.counts_source is not None:
            self.observe_cumulative(self.counts_source())
        s, e = self._series, self.engine
        s["fallback"].labels(e).set(1 if self._fallback else 0)
        if self._decisions:
            s["decisions"].labels(e).inc(self._decisions)
            self._decisions = 0
        if self._fallbacks:
            s["fallback_decisions"].labels(e).inc(self._fallbacks)
            self._fallbacks = 0
        for cls, c in self._counts.items():
            if c[0] == 0:
                continue
            s["drafts"].labels(e, cls).inc(c[0])
            s["draft_tokens"].labels(e, cls).inc(c[1])
            if c[2]:
                s["accepted"].labels(e, cls).inc(c[2])
            for i, n in enumerate(c[3:]):
                if n:
                    s["accepted_pos"].labels(e, cls, str(i)).inc(n)
            for i in range(len(c)):
                c[i] = 0
        decision = self._decision
        if decision is None:
            return
        s["batch_depth"].labels(e).set(decision.batch_depth)
        if not decision.fallback:
            if math.isfinite(decision.predicted_goodput):
                s["goodput"].labels(e).set(decision.predicted_goodput)
            if math.isfinite(decision.predicted_step_ms):
                s["step"].labels(e).set(decision.predicted_step_ms / 1000.0)
            admit = self._classes.admit
            for cls, depth in decision.plan.items():
                s["depth"].labels(e, admit(cls)).set(depth)
        controller = self._controller
        if controller is None:
            return
        plan = decision.plan
        estimator = controller.estimator
        exported: set[str] = set()
        for cls in estimator.classes():
            label = self._classes.admit(cls)
            if label in exported:  # several classes folded into "other": export the first one's estimate
                continue
            exported.add(label)
            als = estimator.acceptance_lengths(cls, self.max_k)
            depth = plan.get(cls, decision.default_depth)
            s["al"].labels(e, label).set(float(als[min(depth, self.max_k)]))
            for i in range(self.max_k):
                s["survival"].labels(e, label, str(i)).set(float(als[i + 1] - als[i]))


def metrics_visible(environ: Mapping[str, str] | None = None) -> bool:
    """Can a ``/metrics`` endpoint show series written in this (engine-core) process? Yes with
    ``PROMETHEUS_MULTIPROC_DIR`` (every process writes to that directory; ``peagle-tune serve`` sets it, and so does
    ``vllm serve`` with more than one API server) or when the engine core runs inside the API server's process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); otherwise the series would live in a process nothing scrapes."""
    env = os.environ if environ is None else environ
    return bool(env.get("PROMETHEUS_MULTIPROC_DIR")) or env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"


class GuardedMetrics:
    """`PluginMetrics` behind a guard, as the plugin uses them: a metrics problem (prometheus_client missing, a bad
    label, a full disk in multiprocess mode) disables the metrics only, logged once; it never reaches the caller, so
    depth control goes on.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self.metrics: PluginMetrics | None = None
        """The live series, None before `start` or after an error."""

    @property
    def active(self) -> bool:
        return self.metrics is not None

    def start(
        self,
        max_k: int,
        static_depth: int,
        *,
        engine: str = "0",
        counts_source: Callable[[], Mapping[str, Sequence[int]]] | None = None,
    ) -> None:
        """Create the series (see `PluginMetrics`); on error the metrics stay off."""
        try:
            self.metrics = PluginMetrics(max_k, static_depth, engine=engine, counts_source=counts_source)
        except Exception as exc:
            self._failed("setup", exc)

    def call(self, name: str, *args: Any, **kwargs: Any) -> None:
        """``PluginMetrics.<name>(*args, **kwargs)`` if the metrics are on; an error turns them off."""
        metrics = self.metrics
        if metrics is None:
            return
        try:
            getattr(metrics, name)(*args, **kwargs)
        except Exception as exc:
            self._failed(name, exc)

    def _failed(self, where: str, exc: BaseException) -> None:
        self.metrics = None
        self._logger.warning(
            "PeagleScheduler: Prometheus metrics disabled after an error in %s: %s: %s", where, type(exc).__name__, exc
        )
