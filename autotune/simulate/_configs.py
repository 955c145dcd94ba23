"""The serving configs the simulator compares, as depth rules: per step, each decoding request's verified depth and
the drafter's depth.

- `NoSpeculation`: no drafter (K = 0, nothing drafted).
- `StaticDepth(k)`: vLLM with ``num_speculative_tokens = k``: every request verifies k drafts, the drafter drafts k.
- `BatchSizeSchedule(entries)`: vLLM's ``num_speculative_tokens_per_batch_size``: the depth of a step is the entry
  covering the number of scheduled requests (0 outside every range).
- `Adaptive(policy, ...)`: the real `policies.DepthController` (built by ``RequestPolicy.make_controller``, the same
  code the scheduler plugin runs), fed the running batch as a `policies.TrackedBatch` and each step's outcome with
  ``observe_step``, exactly as the plugin does. ``drafter_width=False`` is the shipped plugin with parallel drafting
  (depth applied by trimming: the drafter drafts K_max every step); ``drafter_width=True`` lets the drafter draft
  only the deepest planned depth (issue 10's drafter-width control), and ``off_steps`` says what a step where every
  planned depth is 0 does with the drafter, as the plugin's workers do (`policies.plugin.drafter_width`, see
  `off_step_mode`): ``catch_up`` skips it (prompt steps too) and replays what it missed when a request drafts again,
  ``sync_pass`` runs it over one slot, ``holes`` skips it in decode-only steps without replay.

A config is stateless; `start` returns a fresh `DepthRule` for one simulation run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from autotune.errors import UsageError
from autotune.search.schedule import ScheduleEntry
from policies import (
    OFF_STEP_MODES,
    AcceptanceEstimator,
    AcceptanceProfile,
    RequestPolicy,
    RequestView,
    StepCostModel,
    TrackedBatch,
)
from policies import off_step_mode as _worker_off_step_mode

__all__ = [
    "OFF_STEP_MODES",
    "Adaptive",
    "BatchSizeSchedule",
    "DepthRule",
    "NoSpeculation",
    "ServingConfig",
    "StaticDepth",
    "off_step_mode",
]

def off_step_mode(method: str | None, requested: str = "catch_up", *, async_scheduling: bool = False) -> str:
    """The off-step mode the plugin's workers run for a drafter of vLLM speculative ``method``: their own rule
    (`policies.plugin.drafter_width.off_step_mode`), with ``draft_model`` (e.g. PARD) the one token-only method;
    an EAGLE head (``eagle``, ``eagle3``, P-EAGLE) drafts from the target's hidden states."""
    try:
        return _worker_off_step_mode(requested, token_only=method == "draft_model",
                                     async_scheduling=async_scheduling)[0]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


StepResult = tuple[str, str, int, int]
"""(request id, class, verified drafts, accepted drafts) of one decoding request in a step."""


class DepthRule(Protocol):
    """One run's depth decisions. The engine calls `join` when a request's prompt completes (it decodes from the
    next step), `leave` when it finishes, `plan` once per step and `observe` after it."""

    def join(self, request_id: str, cls: str) -> None: ...

    def leave(self, request_id: str) -> None: ...

    def plan(self, request_ids: Sequence[str], scheduled: int) -> tuple[list[int], int]:
        """(depth each request verifies in the NEXT step, in order; drafter depth D of THIS step, 0: no pass).

        ``request_ids``: the requests that will decode next (this step's decoding requests and those whose prompt
        completes in this step), all joined. ``scheduled``: requests in this step (decoding + prefilling), what
        vLLM's batch-size schedule keys on.
        """
        ...

    def observe(self, results: Sequence[StepResult], step_ms: float | None) -> None: ...

    def summary(self) -> dict[str, Any]: ...


class ServingConfig(Protocol):
    """A config compared by the simulator: a label, whether the engine has a drafter, and fresh depth rules."""

    @property
    def label(self) -> str: ...

    @property
    def kind(self) -> str:
        """"none", "static", "schedule" or "adaptive"."""
        ...

    @property
    def speculative(self) -> bool: ...

    @property
    def graph_depth(self) -> int | None:
        """The depth whose uniform decode steps replay FULL CUDA graphs in this config's launch (its K; 0 without
        speculation), on a device that has them; None: no step does (vLLM captures a batch-size schedule
        PIECEWISE only, `policies._graphs`)."""
        ...

    def start(self) -> DepthRule: ...


class _FixedRule:
    """Depth from the batch size only (no state). ``zero_drafting``: the drafter's depth in a step at K = 0."""

    def __init__(self, depth_for: Any, zero_drafting: int = 0) -> None:
        self._depth_for = depth_for
        self._zero_drafting = zero_drafting

    def join(self, request_id: str, cls: str) -> None:
        pass

    def leave(self, request_id: str) -> None:
        pass

    def plan(self, request_ids: Sequence[str], scheduled: int) -> tuple[list[int], int]:
        k = self._depth_for(scheduled)
        return [k] * len(request_ids), k if k > 0 else self._zero_drafting

    def observe(self, results: Sequence[StepResult], step_ms: float | None) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class NoSpeculation:
    """Serving without speculative decoding."""

    label: str = "no speculation"
    kind: str = "none"
    speculative: bool = False
    graph_depth: int | None = 0

    def start(self) -> DepthRule:
        return _FixedRule(lambda b: 0)


@dataclass(frozen=True)
class StaticDepth:
    """vLLM at a fixed ``num_speculative_tokens`` = k (k >= 1)."""

    k: int
    kind: str = "static"
    speculative: bool = True

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UsageError(f"a static depth is >= 1 (use NoSpeculation for K=0), but got K={self.k}.")

    @property
    def label(self) -> str:
        return f"static K={self.k}"

    @property
    def graph_depth(self) -> int | None:
        return self.k

    def start(self) -> DepthRule:
        k = self.k
        return _FixedRule(lambda b: k)


@dataclass(frozen=True)
class BatchSizeSchedule:
    """vLLM's ``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges -> K.

    A step at K = 0 verifies no draft, but vLLM 0.32 still calls the drafter in every step of a speculative engine
    (``GPUModelRunner.propose_draft_token_ids`` has no K = 0 exit), and a parallel drafter's slot layout is fixed at
    the configured K, so it runs a full K-slot pass (`policies.plugin.drafter_width`; measured: the CPU fixtures'
    schedule [[1, 7, 4], [8, 8, 0]] served c = 8 at 778-786 tok/s, below static K = 4 and no speculation).
    ``zero_depth_drafting``: the drafter's depth in such a step; None: the schedule's largest K, the configured K of
    a parallel drafter (a sequential drafter runs its first pass: 1).
    """

    entries: tuple[ScheduleEntry, ...]
    zero_depth_drafting: int | None = None
    kind: str = "schedule"
    speculative: bool = True

    def __post_init__(self) -> None:
        if not self.entries:
            raise UsageError("a batch-size schedule needs at least one [batch_min, batch_max, K] entry.")
        if self.zero_depth_drafting is not None and self.zero_depth_drafting < 1:
            raise UsageError(f"zero_depth_drafting is a drafter depth >= 1, but got {self.zero_depth_drafting}.")

    @property
    def label(self) -> str:
        return "vLLM schedule " + " ".join(f"{e.batch_min}-{e.batch_max}:{e.k}" for e in self.entries)

    @property
    def graph_depth(self) -> int | None:
        return None  # vLLM forces PIECEWISE for a batch-size schedule

    def depth_at(self, batch_size: int) -> int:
        for e in self.entries:
            if e.batch_min <= batch_size <= e.batch_max:
                return e.k
        return 0

    def start(self) -> DepthRule:
        zero = self.zero_depth_drafting or max(1, max(e.k for e in self.entries))
        return _FixedRule(self.depth_at, zero)


@dataclass(frozen=True)
class Adaptive:
    """The depth controller of `policies`, driven through its public API (see the module docstring).

    ``policy``: classes, caps, static fallback and `ControllerSettings` (``policy.controller``); its
    ``drafter_always_runs`` is False when the drafter skips off-steps (``drafter_width`` with ``off_steps``
    ``catch_up`` or ``holes``) and True otherwise, as the plugin sets it. ``off_steps``: see the module docstring
    (ignored without ``drafter_width``; `off_step_mode` gives the one the plugin runs for a drafter).
    ``cost_model``: the controller's step-cost model (a copy is
    refined online in each run). ``priors``: class profiles seeding the estimator (a stored profile in production).
    ``plugin_ms_per_step``: the scheduler plugin's own host time per engine step, ms, added to every step of the
    simulation (only this config installs the plugin); the caller says where it comes from (measured in an engine
    run as ``PluginStats.overhead_ms / steps``, or 0 when unknown).
    """

    policy: RequestPolicy
    cost_model: StepCostModel
    priors: Mapping[str, AcceptanceProfile] = field(default_factory=dict)
    drafter_width: bool = False
    name: str | None = None
    plugin_ms_per_step: float = 0.0
    off_steps: str = "catch_up"
    async_scheduling: bool = False
    """The plugin runs under async scheduling (`PeagleAsyncScheduler`, vLLM's GPU default): a step's depths are
    planned before the previous step's outcome is known, so the controller learns of each outcome one step late."""
    kind: str = "adaptive"
    speculative: bool = True

    def __post_init__(self) -> None:
        ms = self.plugin_ms_per_step
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms < float("inf"):
            raise UsageError(f"plugin_ms_per_step must be a finite number >= 0 ms, but got {ms!r}.")
        if self.off_steps not in OFF_STEP_MODES:
            raise UsageError(f"off_steps must be one of {OFF_STEP_MODES}, but got {self.off_steps!r}.")

    @property
    def graph_depth(self) -> int | None:
        return self.policy.max_k  # the launch's K: the controller's deepest depth

    @property
    def skips_drafter(self) -> bool:
        """Whether a step where every planned depth is 0 skips the drafter (the plugin's ``skip_drafter``)."""
        return self.drafter_width and self.off_steps != "sync_pass"

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return "adaptive (drafter width)" if self.drafter_width else "adaptive (trim)"

    def start(self) -> DepthRule:
        settings = replace(self.policy.controller, drafter_always_runs=not self.skips_drafter)
        policy = replace(self.policy, controller=settings)
        cost = StepCostModel.from_dict(self.cost_model.to_dict())
        if self.priors:
            estimator = AcceptanceEstimator.from_profiles(
                self.priors, max_k=policy.max_k, prior_strength=settings.prior_strength, decay=settings.decay
            )
        else:
            estimator = AcceptanceEstimator(max(policy.max_k, 1), decay=settings.decay)
        off = self.off_steps if self.drafter_width else None
        return _AdaptiveRule(policy, policy.make_controller(cost, estimator), self.drafter_width, off,
                             lag=1 if self.async_scheduling else 0)


class _AdaptiveRule:
    def __init__(self, policy: RequestPolicy, controller: Any, drafter_width: bool, off_steps: str | None,
                 lag: int = 0) -> None:
        self.lag = lag
        self._late: list[tuple[Sequence[StepResult], float | None]] = []
        self.policy = policy
        self.controller = controller
        self.drafter_width = drafter_width
        self.off_steps = off_steps
        self.batch = TrackedBatch()
        self.views: dict[str, RequestView] = {}
        self.fallbacks = 0
        self.fallback_reason = ""
        self.steps = 0

    def join(self, request_id: str, cls: str) -> None:
        view = self.policy.view(request_id, assigned=cls)  # the workload's class is ground truth, not a client label
        self.views[request_id] = view
        self.batch.add(view)

    def leave(self, request_id: str) -> None:
        self.views.pop(request_id, None)
        self.batch.remove(request_id)

    def plan(self, request_ids: Sequence[str], scheduled: int) -> tuple[list[int], int]:
        max_k = self.controller.max_k
        if not request_ids:  # a prefill-only step: trimming drafts K_max anyway, width control drafts nothing
            return [], 0 if self.drafter_width else max_k
        self.steps += 1
        decision = self.controller.decide_or_fallback(self.batch)
        if decision.fallback:
            self.fallbacks += 1
            self.fallback_reason = self.fallback_reason or decision.reason
        views = self.views
        depths = [decision.depth_for(views[r]) for r in request_ids]
        if not self.drafter_width:
            return depths, max_k
        return depths, max(depths, default=0)

    def observe(self, results: Sequence[StepResult], step_ms: float | None) -> None:
        if self.lag:
            self._late.append((results, step_ms))
            if len(self._late) <= self.lag:
                return
            results, step_ms = self._late.pop(0)
        if results:
            self.controller.observe_step(results, step_ms)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "plan_switches": self.controller.switches,
            "final_plan": dict(self.controller.plan),
            "controller_steps": self.steps,
        }
        if self.off_steps is not None:
            out["off_steps"] = self.off_steps  # what a step where every depth is 0 did with the drafter
        if self.fallbacks:
            out["controller_fallbacks"] = self.fallbacks
            out["fallback_reason"] = self.fallback_reason
        return out
