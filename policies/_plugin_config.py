"""Configuration, depth plans and recorded statistics of the vLLM scheduler plugin (`policies.scheduler`).

Pure Python (no vLLM import), so the parent process that starts an engine, the tests and the plugin share it.

How the pieces meet: the parent writes a `PluginConfig` as JSON (`PluginConfig.save`), names the file in the
environment variable ``PEAGLE_SCHEDULER_CONFIG`` and starts vLLM with `engine_kwargs()` (``scheduler_cls`` and
``async_scheduling=False``). The engine-core process inherits the environment, its `PeagleScheduler` reads the
config, controls the verified depth and records a `PluginStats`, written as JSON to ``stats_path``; the parent reads
it back with `PluginStats.load`.

Modes:

- ``static``: verified depth ``static_depth`` (None: the engine's K, no trimming) for every request, capped per class
  by ``class_depths``; records statistics.
- ``plan``: a `DepthPlan` changes the verified depth over steps (for profiling: one launch measures the step cost at
  many (batch size, depth) points and acceptance at full depth).
- ``adaptive``: each step a `DepthController` chooses per-request depths (see `build_controller`).

Request labels read from ``SamplingParams.extra_args``: ``peagle_class`` (workload class; "default" without it) and
``peagle_phase`` (a label that separates the statistics of measured phases, e.g. "warmup" or "c4"; "default").
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from policies._acceptance import AcceptanceProfile
from policies._request_policy import CLASS_KEY, SPECULATE_KEY
from policies._step_cost import StepSample

if TYPE_CHECKING:
    from policies._controller import DepthController
    from policies._request_policy import RequestPolicy

__all__ = [
    "CLASS_KEY",
    "CONFIG_ENV",
    "DEFAULT_CLASS",
    "DEFAULT_PHASE",
    "FAULT_WHERE",
    "MODES",
    "PHASE_KEY",
    "SCHEDULER_CLS",
    "DepthPlan",
    "PluginConfig",
    "PluginConfigError",
    "PluginStats",
    "build_controller",
    "engine_kwargs",
    "normalize_extra_args",
    "opted_out",
    "serve_args",
]

Mode = Literal["static", "plan", "adaptive"]
MODES: tuple[str, ...] = ("static", "plan", "adaptive")
FAULT_WHERE: tuple[str, ...] = ("plugin", "controller")
CONFIG_ENV = "PEAGLE_SCHEDULER_CONFIG"
"""Environment variable naming the plugin's JSON config file (the engine core inherits the parent's environment)."""
SCHEDULER_CLS = "policies.scheduler.PeagleScheduler"
"""What to pass as vLLM's ``scheduler_cls`` (``LLM(scheduler_cls=...)`` or ``vllm serve --scheduler-cls``)."""
PHASE_KEY = "peagle_phase"
DEFAULT_CLASS = "default"
DEFAULT_PHASE = "default"
CONFIG_VERSION = 1
STATS_VERSION = 1
_MAX_DEPTH = 64


class PluginConfigError(ValueError):
    """A scheduler-plugin config or stats file that cannot be used; the message names the key and the fix."""


def engine_kwargs() -> dict[str, Any]:
    """``LLM(...)`` keyword arguments that install the plugin. Set ``PEAGLE_SCHEDULER_CONFIG`` in the environment too.

    ``async_scheduling=False``: with async scheduling (vLLM's GPU default) the drafts never pass through the
    scheduler (``update_draft_token_ids`` is not called), so they cannot be trimmed, and step times overlap.
    """
    return {"scheduler_cls": SCHEDULER_CLS, "async_scheduling": False}


def serve_args() -> list[str]:
    """The same as `engine_kwargs`, as ``vllm serve`` arguments."""
    return ["--scheduler-cls", SCHEDULER_CLS, "--no-async-scheduling"]


# ------------------------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class DepthPlan:
    """Verified depth as a function of the step index: ``depths`` in blocks of ``block_steps`` steps, cycled.

    The plugin keeps one step counter per batch size, so every batch size the workload produces walks through the
    whole cycle (a phase at concurrency 4 does not spend all its steps in the first block).

    Example: ``DepthPlan((4, 0, 4, 1), block_steps=2)`` gives depths 4, 4, 0, 0, 4, 4, 1, 1, 4, 4, ... for the
    steps 0, 1, 2, ... of one batch size.
    """

    depths: tuple[int, ...]
    """Verified depth of each block (0 = no draft verified; the drafter still runs)."""
    block_steps: int = 4
    """Consecutive steps (of one batch size) at the same depth. Blocks > 1 keep the drafting depth of sequential
    drafters equal to the verified depth in most steps (the drafter proposes one step ahead)."""

    def __post_init__(self) -> None:
        depths = tuple(self.depths)
        object.__setattr__(self, "depths", depths)
        if not depths:
            raise PluginConfigError("plan.depths must list at least one depth, e.g. [4, 0, 4, 1, 4, 2, 4, 3].")
        for i, d in enumerate(depths):
            if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= _MAX_DEPTH:
                raise PluginConfigError(f"plan.depths[{i}] must be an integer in [0, {_MAX_DEPTH}], but got {d!r}.")
        if isinstance(self.block_steps, bool) or not isinstance(self.block_steps, int) or self.block_steps < 1:
            raise PluginConfigError(f"plan.block_steps must be an integer >= 1, but got {self.block_steps!r}.")

    @property
    def cycle_steps(self) -> int:
        """Steps in one full cycle of the plan."""
        return len(self.depths) * self.block_steps

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def depth_at(self, step: int) -> int:
        """Verified depth for the ``step``-th step (0-based) of one batch size."""
        if step < 0:
            raise ValueError(f"step must be >= 0, but got {step}.")
        return self.depths[(step // self.block_steps) % len(self.depths)]

    @classmethod
    def sweep(cls, max_k: int, block_steps: int = 4, interleave_full: bool = True) -> DepthPlan:
        """Every depth 0..max_k. With ``interleave_full`` every other block is at ``max_k``, so half of the steps
        measure acceptance at every position while the other half cover the smaller depths.

        Example: ``sweep(3)`` -> depths (3, 0, 3, 1, 3, 2); ``sweep(3, interleave_full=False)`` -> (0, 1, 2, 3).
        """
        if isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= _MAX_DEPTH:
            raise PluginConfigError(f"max_k must be an integer in [1, {_MAX_DEPTH}], but got {max_k!r}.")
        if interleave_full:
            depths = [d for k in range(max_k) for d in (max_k, k)]
        else:
            depths = list(range(max_k + 1))
        return cls(tuple(depths), block_steps)

    def to_dict(self) -> dict[str, Any]:
        return {"depths": list(self.depths), "block_steps": self.block_steps}

    @classmethod
    def from_dict(cls, data: Any) -> DepthPlan:
        if not isinstance(data, Mapping):
            raise PluginConfigError(f"plan must be an object {{depths: [...], block_steps: n}}, but got {data!r:.80}.")
        _unknown("plan", data, {"depths", "block_steps"})
        if "depths" not in data or not isinstance(data["depths"], list | tuple):
            raise PluginConfigError("plan.depths is missing or not a list; give the depths, e.g. [4, 0, 4, 1].")
        return cls(tuple(data["depths"]), data.get("block_steps", 4))


# ---------------------------------------------------------------------------------------------------- the config
@dataclass(frozen=True)
class PluginConfig:
    """What the scheduler plugin does (see the module docstring for the modes)."""

    mode: Mode = "static"
    """"static", "plan" or "adaptive"."""
    stats_path: str | None = None
    """JSON file the plugin writes its `PluginStats` to (None: record nothing)."""
    static_depth: int | None = None
    """Verified depth in static mode and the fallback depth after a plugin error; None: the engine's K."""
    class_depths: Mapping[str, int] = field(default_factory=dict)
    """Cap on the verified depth per request class, applied in every mode (e.g. {"chat": 2})."""
    plan: DepthPlan | None = None
    """The depth plan of "plan" mode (required there, ignored otherwise)."""
    lower_drafting_depth: bool | None = None
    """Also lower vLLM's drafting depth (``num_spec_tokens_to_schedule``) to the deepest verified depth of the next
    step, so sequential drafters skip passes whose drafts would be trimmed. None: only for sequential drafters
    (parallel drafting must draft at its configured K, vLLM issue #45695)."""
    flush_every_s: float = 5.0
    """Write the stats file at most this often while running (and whenever the engine goes idle, and at shutdown)."""
    max_samples_per_key: int = 512
    """Step times kept per (phase, batch size, depth) key for medians (reservoir sample beyond that)."""
    adaptive: Mapping[str, Any] | None = None
    """For "adaptive": {"policy": RequestPolicy dict, "cost_model": StepCostModel dict,
    "acceptance": {class: AcceptanceProfile dict}} (see `build_controller`)."""
    fault_class: str | None = None
    """Test hook: an exception is raised when the depth of a request of this class is decided (see
    ``fault_where``), to test that the engine keeps serving."""
    fault_where: str = "plugin"
    """Where the ``fault_class`` hook raises: "plugin" (the plugin's own logic: the plugin turns itself off and
    serves at ``static_depth``, un-trimmed when that is None) or "controller" (`DepthController.decide`, adaptive
    mode: that step falls back to the controller's static depth, the next steps are adaptive again)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PluginConfigError(f"mode must be one of {', '.join(MODES)}, but got {self.mode!r}.")
        if self.stats_path is not None and not isinstance(self.stats_path, str | os.PathLike):
            raise PluginConfigError(f"stats_path must be a file path or null, but got {self.stats_path!r}.")
        if self.static_depth is not None:
            _depth("static_depth", self.static_depth)
        if not isinstance(self.class_depths, Mapping):
            raise PluginConfigError(f"class_depths must map class name to depth, but got {self.class_depths!r:.80}.")
        for name, depth in self.class_depths.items():
            if not isinstance(name, str) or not name:
                raise PluginConfigError(f"class_depths keys must be non-empty class names, but got {name!r}.")
            _depth(f"class_depths.{name}", depth)
        object.__setattr__(self, "class_depths", dict(self.class_depths))
        if isinstance(self.plan, Mapping):
            object.__setattr__(self, "plan", DepthPlan.from_dict(self.plan))
        if self.mode == "plan" and self.plan is None:
            raise PluginConfigError(
                "mode 'plan' needs a plan, e.g. {\"depths\": [4, 0, 4, 1, 4, 2, 4, 3], \"block_steps\": 4} "
                "(DepthPlan.sweep(max_k) builds one)."
            )
        if self.lower_drafting_depth is not None and not isinstance(self.lower_drafting_depth, bool):
            raise PluginConfigError(
                f"lower_drafting_depth must be true, false or null (auto), but got {self.lower_drafting_depth!r}."
            )
        if not (_number(self.flush_every_s) and self.flush_every_s > 0):
            raise PluginConfigError(f"flush_every_s must be a number of seconds > 0, but got {self.flush_every_s!r}.")
        if isinstance(self.max_samples_per_key, bool) or not isinstance(self.max_samples_per_key, int) or (
            self.max_samples_per_key < 1
        ):
            raise PluginConfigError(
                f"max_samples_per_key must be an integer >= 1, but got {self.max_samples_per_key!r}."
            )
        if self.mode == "adaptive":
            if not isinstance(self.adaptive, Mapping):
                raise PluginConfigError(
                    "mode 'adaptive' needs an 'adaptive' object with keys policy, cost_model and acceptance."
                )
            _unknown("adaptive", self.adaptive, {"policy", "cost_model", "acceptance"})
            for key in ("policy", "cost_model"):
                if not isinstance(self.adaptive.get(key), Mapping):
                    raise PluginConfigError(f"adaptive.{key} is missing or not an object.")
        if self.fault_class is not None and (not isinstance(self.fault_class, str) or not self.fault_class):
            raise PluginConfigError(f"fault_class must be a class name or null, but got {self.fault_class!r}.")
        if self.fault_where not in FAULT_WHERE:
            raise PluginConfigError(
                f"fault_where must be one of {', '.join(FAULT_WHERE)}, but got {self.fault_where!r}."
            )

    def depth_cap(self, cls: str) -> int | None:
        """The class's cap from ``class_depths`` (None: uncapped)."""
        return self.class_depths.get(cls)

    # -- (de)serialising --
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": CONFIG_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, DepthPlan):
                value = value.to_dict()
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, os.PathLike):
                value = os.fspath(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "plugin config") -> PluginConfig:
        """Validate and build; errors are `PluginConfigError` naming ``source`` and the key."""
        if not isinstance(data, Mapping):
            raise PluginConfigError(f"{source}: must be a JSON object, but got {type(data).__name__}.")
        known = {f.name for f in dataclasses.fields(cls)} | {"version"}
        try:
            _unknown("", data, known)
            version = data.get("version", CONFIG_VERSION)
            if version != CONFIG_VERSION:
                raise PluginConfigError(
                    f"version must be {CONFIG_VERSION} (the only plugin config format this peagle-tune reads), "
                    f"but got {version!r}."
                )
            kwargs = {k: v for k, v in data.items() if k != "version"}
            if kwargs.get("plan") is not None:
                kwargs["plan"] = DepthPlan.from_dict(kwargs["plan"])
            return cls(**kwargs)
        except PluginConfigError as exc:
            raise PluginConfigError(f"{source}: {exc}") from None

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | Path) -> PluginConfig:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise PluginConfigError(f"{p}: cannot read the plugin config ({exc.strerror or exc}).") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PluginConfigError(f"{p}: not valid JSON: {exc}.") from exc
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginConfig:
        """The config named by ``PEAGLE_SCHEDULER_CONFIG``; without it, static mode that records nothing."""
        env = os.environ if environ is None else environ
        path = env.get(CONFIG_ENV)
        return cls() if not path else cls.load(path)


_FALSE_WORDS = frozenset({"false", "0", "no", "off"})
_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})


def normalize_extra_args(extra: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``extra_args`` with ``peagle_speculate`` as a bool when it arrived as a number or a word.

    vLLM's OpenAI server validates ``vllm_xargs`` as str/int/float values, so a JSON ``false`` reaches the engine as
    ``0``; clients may also send "false". 0/1 and true/false/yes/no/on/off (any case) become booleans; anything else
    is left for `RequestPolicy.speculate` to reject. Returns ``extra`` itself when nothing changes.

    Example: ``normalize_extra_args({"peagle_speculate": 0})`` -> ``{"peagle_speculate": False}``.
    """
    if not extra or SPECULATE_KEY not in extra:
        return extra or {}
    value = extra[SPECULATE_KEY]
    if isinstance(value, bool):
        return extra
    flag: bool | None = None
    if isinstance(value, int | float) and value in (0, 1):
        flag = bool(value)
    elif isinstance(value, str) and value.strip().lower() in _FALSE_WORDS | _TRUE_WORDS:
        flag = value.strip().lower() in _TRUE_WORDS
    if flag is None:
        return extra
    return {**extra, SPECULATE_KEY: flag}


def opted_out(extra: Mapping[str, Any] | None) -> bool:
    """True when ``extra_args`` opt the request out of speculation (``peagle_speculate`` false, 0 or "false")."""
    return normalize_extra_args(extra).get(SPECULATE_KEY, True) is False


def build_controller(config: PluginConfig, max_k: int) -> tuple[RequestPolicy, DepthController]:
    """The request policy and depth controller of an adaptive config, for a drafter with K = ``max_k``.

    ``adaptive.policy``: a policy-file dict (`RequestPolicy.from_dict`); its max_k is clipped to the engine's K.
    ``adaptive.cost_model``: `StepCostModel.to_dict()` (e.g. a stored profile's ``cost_model``).
    ``adaptive.acceptance``: {class: AcceptanceProfile dict} seeding the estimator (may be empty).
    """
    from policies._controller import DepthController
    from policies._estimator import AcceptanceEstimator
    from policies._request_policy import RequestPolicy
    from policies._step_cost import StepCostModel

    if config.adaptive is None:
        raise PluginConfigError("build_controller needs a config with an 'adaptive' section.")
    policy = RequestPolicy.from_dict(dict(config.adaptive["policy"]), source="adaptive.policy")
    if policy.max_k > max_k:
        policy = dataclasses.replace(policy, max_k=max_k, static_k=min(policy.static_k, max_k))
    cost = StepCostModel.from_dict(config.adaptive["cost_model"])
    profiles = {
        str(name): AcceptanceProfile.from_dict(p) for name, p in (config.adaptive.get("acceptance") or {}).items()
    }
    settings = policy.controller
    if profiles:
        est = AcceptanceEstimator.from_profiles(
            profiles, max_k=policy.max_k, prior_strength=settings.prior_strength, decay=settings.decay
        )
    else:
        est = AcceptanceEstimator(max(policy.max_k, 1), decay=settings.decay)
    controller = DepthController(cost, est, policy.max_k, policy.static_k, settings=settings)
    if config.fault_class is not None and config.fault_where == "controller":
        _inject_controller_fault(controller, config.fault_class)
    return policy, controller


class ControllerFault(RuntimeError):
    """Raised on purpose by the ``fault_class`` test hook with ``fault_where="controller"``."""


def _inject_controller_fault(controller: DepthController, fault_class: str) -> None:
    """Make ``controller.decide`` raise whenever the batch holds a request of ``fault_class`` (test hook)."""
    decide = controller.decide

    def faulty_decide(batch: Any) -> Any:
        if any(view.cls == fault_class for view in batch):
            raise ControllerFault(f"fault_class={fault_class!r} test hook (controller)")
        return decide(batch)

    controller.decide = faulty_decide  # type: ignore[method-assign]


# ----------------------------------------------------------------------------------------------------- the stats
@dataclass
class _CostKey:
    samples: list[float]
    n: int = 0
    sum_ms: float = 0.0


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
    """

    def __init__(self, *, max_samples_per_key: int = 512, seed: int = 0) -> None:
        self.max_samples_per_key = max_samples_per_key
        self.info: dict[str, Any] = {}
        """Engine facts the plugin saw (K, method, parallel drafting, drafting-depth lowering, mode)."""
        self.steps = 0
        """Engine steps seen (every update_from_output with scheduled tokens)."""
        self.decode_steps = 0
        self.mixed_steps = 0
        """Steps that also computed prompt tokens (excluded from the step-cost samples)."""
        self.fallback = False
        self.errors: list[str] = []
        self.overhead_ms = 0.0
        """Wall time spent in the plugin's own logic (decisions, trimming, bookkeeping), ms."""
        self._acceptance: dict[tuple[str, str, int], list[int]] = {}  # -> [num_drafts, acc_0, ..., acc_{d-1}]
        self._costs: dict[tuple[str, int, int | None, int, int], _CostKey] = {}
        self._totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self._total_per_pos: list[int] = []
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
    ) -> None:
        """One engine step: ``requests`` = (class, phase, verified drafts, accepted drafts) per scheduled request.

        ``prompt_tokens``: prompt (prefill) tokens computed in the step; a step with any is "mixed" and gives no
        step-cost sample. ``drafting_depth``: drafts the drafter proposed per request in the step.
        """
        self.steps += 1
        verified = 0
        depths = set()
        phases = set()
        for cls, phase, drafted, accepted in requests:
            if not 0 <= accepted <= drafted:
                raise ValueError(f"accepted drafts must be in [0, drafted={drafted}], but got {accepted}.")
            verified += drafted + 1
            depths.add(drafted)
            phases.add(phase)
            self._depth_hist[drafted] = self._depth_hist.get(drafted, 0) + 1
            if drafted == 0:
                continue
            key = (phase, cls, drafted)
            row = self._acceptance.get(key)
            if row is None:
                row = self._acceptance[key] = [0] * (drafted + 1)
            row[0] += 1
            for i in range(accepted):
                row[i + 1] += 1
            self._totals["num_drafts"] += 1
            self._totals["num_draft_tokens"] += drafted
            self._totals["num_accepted_tokens"] += accepted
            if len(self._total_per_pos) < drafted:
                self._total_per_pos += [0] * (drafted - len(self._total_per_pos))
            for i in range(accepted):
                self._total_per_pos[i] += 1
        if prompt_tokens > 0 or not requests:
            self.mixed_steps += 1
            return
        self.decode_steps += 1
        if step_ms is None or not math.isfinite(step_ms) or step_ms <= 0:
            return
        phase = phases.pop() if len(phases) == 1 else "mixed"
        uniform = next(iter(depths)) if len(depths) == 1 else None
        ckey = (phase, len(requests), uniform, verified, drafting_depth)
        entry = self._costs.get(ckey)
        if entry is None:
            entry = self._costs[ckey] = _CostKey([])
        entry.n += 1
        entry.sum_ms += step_ms
        if len(entry.samples) < self.max_samples_per_key:
            entry.samples.append(step_ms)
        else:  # reservoir sampling keeps a uniform sample of all steps
            j = self._rng.randrange(entry.n)
            if j < self.max_samples_per_key:
                entry.samples[j] = step_ms

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

    def step_samples(
        self, phases: Iterable[str] | None = None, *, sequential: bool = False, uniform_only: bool = True
    ) -> list[StepSample]:
        """Measured step times as `StepSample`s, one per (batch size, depth[, drafting depth]) with the median.

        Phases are pooled. ``sequential``: the drafting depth (drafter passes) is the sample's depth and only steps
        whose drafting depth equals the verified depth are kept, so each sample has one K; otherwise (parallel
        drafting, one drafter pass at the configured K) the verified depth is. The drafter ran in every step
        (depth is applied by trimming), so ``drafter_ran=True``, unless the engine had no speculative decoding
        (``info["num_speculative_tokens"] == 0``: a no-speculation baseline, ``drafter_ran=False``).
        """
        ran = self.info.get("num_speculative_tokens", 1) != 0
        pooled: dict[tuple[int, int, int], tuple[list[float], int]] = {}
        for e in self.step_costs(phases):
            d = e["depth"]
            if d is None:
                if uniform_only:
                    continue
                d = e["drafting_depth"] if sequential else max(0, e["verified_tokens"] // e["batch_size"] - 1)
            if sequential and e["drafting_depth"] != d:
                continue
            key = (e["batch_size"], d, e["verified_tokens"])
            samples, n = pooled.get(key, ([], 0))
            pooled[key] = (samples + e["samples_ms"], n + e["n"])
        out = []
        for (b, d, v), (samples, n) in sorted(pooled.items()):
            samples.sort()
            mid = len(samples) // 2
            median = samples[mid] if len(samples) % 2 else 0.5 * (samples[mid - 1] + samples[mid])
            out.append(StepSample(b, d, float(median), n=n, verified_tokens=v, drafter_ran=ran))
        return out

    def totals(self) -> dict[str, Any]:
        """Drafts, draft tokens, accepted tokens and accepted per position over every step (all phases)."""
        return {**self._totals, "accepted_per_position": list(self._total_per_pos)}

    def depth_histogram(self) -> dict[int, int]:
        """Verified depth -> request-steps at that depth (all steps)."""
        return dict(sorted(self._depth_hist.items()))

    # -- (de)serialising --
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATS_VERSION,
            "info": dict(self.info),
            "steps": self.steps,
            "decode_steps": self.decode_steps,
            "mixed_steps": self.mixed_steps,
            "fallback": self.fallback,
            "errors": list(self.errors),
            "overhead_ms": self.overhead_ms,
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
            ],
        }

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
            totals = data["totals"]
            stats._totals = {k: int(totals[k]) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
            stats._total_per_pos = [int(x) for x in totals["accepted_per_position"]]
            stats._depth_hist = {int(k): int(v) for k, v in (data.get("depth_histogram") or {}).items()}
            for a in data["acceptance"]:
                per_pos = [int(x) for x in a["accepted_per_position"]]
                if len(per_pos) != int(a["depth"]):
                    raise ValueError(f"acceptance entry has depth {a['depth']} but {len(per_pos)} positions")
                akey = (str(a["phase"]), str(a["class"]), int(a["depth"]))
                stats._acceptance[akey] = [int(a["num_drafts"]), *per_pos]
            for c in data["step_costs"]:
                depth = None if c["depth"] is None else int(c["depth"])
                key = (
                    str(c["phase"]), int(c["batch_size"]), depth, int(c["verified_tokens"]), int(c["drafting_depth"])
                )
                stats._costs[key] = _CostKey([float(x) for x in c["samples_ms"]], int(c["n"]), float(c["sum_ms"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PluginConfigError(f"{source}: malformed plugin stats ({type(exc).__name__}: {exc}).") from None
        return stats

    def save(self, path: str | Path) -> None:
        """Write atomically (a reader never sees half a file)."""
        p = Path(path)
        tmp = p.with_name(p.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict()), encoding="utf-8")
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


# ------------------------------------------------------------------------------------------------------- helpers
def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _depth(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_DEPTH:
        raise PluginConfigError(f"{name} must be an integer depth in [0, {_MAX_DEPTH}], but got {value!r}.")


def _unknown(path: str, data: Mapping[str, Any], known: set[str]) -> None:
    extra = sorted(str(k) for k in data if k not in known)
    if extra:
        where = f"{path}: " if path else ""
        raise PluginConfigError(f"{where}unknown key(s) {extra}; known keys are {sorted(known)}. Check the spelling.")
