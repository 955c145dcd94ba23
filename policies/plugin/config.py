"""The scheduler plugin's wire format: `PluginConfig` (what the plugin does), `DepthPlan`, and how to install it.

Pure Python (no vLLM import), so the parent process that starts an engine, the tests and the plugin share it.

How the pieces meet: the parent writes a `PluginConfig` as JSON (`PluginConfig.save`), names the file in the
environment variable ``PEAGLE_SCHEDULER_CONFIG`` (`CONFIG_ENV`), adds `engine_env()` (V1 model runner) and starts
vLLM with `engine_kwargs()` or `serve_args()` (``scheduler_cls`` and ``async_scheduling``: async where vLLM would
be, on a GPU). The engine-core process inherits the environment, its `PeagleScheduler` reads the config, controls the
verified depth and records a `PluginStats` (`policies.plugin.stats`), written as JSON to ``stats_path``; the parent
reads it back with `PluginStats.load`.

Modes:

- ``static``: verified depth ``static_depth`` (None: the engine's K, no trimming) for every request, capped per class
  by ``class_depths``; records statistics.
- ``plan``: a `DepthPlan` changes the verified depth over steps (for profiling: one launch measures the step cost at
  many (batch size, depth) points and acceptance at full depth).
- ``adaptive``: each step a `DepthController` chooses per-request depths (see `policies.plugin.build_controller`).

The JSON form is ``PluginConfig.to_dict()`` plus ``"version": 1``; unknown keys are errors naming the key.

Example::

    >>> cfg = PluginConfig(mode="plan", plan=DepthPlan.sweep(2, block_steps=1), class_depths={"chat": 1})
    >>> cfg.to_dict()["plan"], cfg.depth_cap("chat"), cfg.depth_cap("code")
    ({'depths': [2, 0, 2, 1], 'block_steps': 1}, 1, None)
    >>> PluginConfig.from_dict(cfg.to_dict()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from policies._files import load_json_text, read_text
from policies.errors import PluginConfigError
from policies.plugin.drafter_width import WORKER_EXTENSION_CLS as _WORKER_EXTENSION_CLS
from policies.plugin.drafter_width import DrafterWidthSettings

__all__ = [
    "ASYNC_SCHEDULER_CLS",
    "CONFIG_ENV",
    "CONFIG_VERSION",
    "FAULT_WHERE",
    "MAX_DEPTH",
    "MODES",
    "SCHEDULER_CLS",
    "V2_RUNNER_ENV",
    "WORKER_EXTENSION_CLS",
    "DepthPlan",
    "PluginConfig",
    "engine_env",
    "engine_kwargs",
    "serve_args",
]

Mode = Literal["static", "plan", "adaptive"]
MODES: tuple[str, ...] = ("static", "plan", "adaptive")
FAULT_WHERE: tuple[str, ...] = ("plugin", "controller")
CONFIG_ENV = "PEAGLE_SCHEDULER_CONFIG"
"""Environment variable naming the plugin's JSON config file (the engine core inherits the parent's environment)."""
SCHEDULER_CLS = "policies.scheduler.PeagleScheduler"
"""What to pass as vLLM's ``scheduler_cls`` (``LLM(scheduler_cls=...)`` or ``vllm serve --scheduler-cls``). Stored
configs and exported command lines name this path; `policies.scheduler` re-exports the adapter from
`policies.plugin.scheduler`."""
ASYNC_SCHEDULER_CLS = "policies.scheduler.PeagleAsyncScheduler"
"""The plugin under vLLM's async scheduling (GPU default): per-request depth through the draft placeholders."""
WORKER_EXTENSION_CLS = _WORKER_EXTENSION_CLS
"""What to pass as vLLM's ``worker_extension_cls``: the worker-side patch that makes the drafter draft only the
planned depth and skip off-steps (`policies.plugin.drafter_width`). Without it the plugin only trims drafts."""
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""vLLM's switch between its V1 ("0") and V2 ("1") model runners; `engine_env` pins V1."""
CONFIG_VERSION = 1
"""The plugin config format this peagle-tune reads and writes."""
MAX_DEPTH = 64
"""Deepest verified depth a plugin config may name (a sanity bound; the engine's K caps it at run time)."""


def engine_kwargs(*, async_scheduling: bool) -> dict[str, Any]:
    """``LLM(...)`` keyword arguments that install the plugin (and its worker-side drafter-width patch). Set
    ``PEAGLE_SCHEDULER_CONFIG`` and `engine_env` in the engine's environment too.

    ``async_scheduling`` has no default on purpose: pass what vLLM itself would run for the launch, so that the
    plugin's figures come from the engine a plain ``vllm serve`` runs. That is async on a GPU and synchronous on the
    CPU build (vllm/config/vllm.py:1585-1644; `autotune.engine.plugin_async_scheduling` decides it for peagle-tune's
    launches). True installs `ASYNC_SCHEDULER_CLS` (depth through vLLM's draft placeholders, decided from acceptance
    one step older); False installs `SCHEDULER_CLS` (depth by trimming the drafts), the explicit choice for profiling
    step costs: step times do not overlap, so each measured step cost is the step's own, and a drafter that falls back
    to its full width is noticed from the drafts.
    """
    cls = ASYNC_SCHEDULER_CLS if async_scheduling else SCHEDULER_CLS
    return {"scheduler_cls": cls, "async_scheduling": async_scheduling, "worker_extension_cls": WORKER_EXTENSION_CLS}


def engine_env() -> dict[str, str]:
    """Environment variables of the engine process that installs the plugin (besides `CONFIG_ENV`):
    ``VLLM_USE_V2_MODEL_RUNNER=0``, vLLM's V1 model runner.

    Why: the worker extension (`WORKER_EXTENSION_CLS`, `policies.plugin.drafter_width`) patches the V1 model runner
    (vllm/v1/worker/gpu_model_runner.py, whose ``propose_draft_token_ids`` calls ``drafter.propose``); vLLM 0.32 runs
    EAGLE-3 without parallel drafting on its V2 runner on a GPU with Triton, whose speculative decoding lives
    elsewhere (vllm/v1/worker/gpu/spec_decode/), so there the extension cannot install and the plugin only trims
    drafts. P-EAGLE and PARD (parallel drafting) run V1 anyway; the CPU build always does.
    """
    return {V2_RUNNER_ENV: "0"}


def serve_args(*, async_scheduling: bool) -> list[str]:
    """The same as `engine_kwargs`, as ``vllm serve`` arguments."""
    flag = "--async-scheduling" if async_scheduling else "--no-async-scheduling"
    cls = ASYNC_SCHEDULER_CLS if async_scheduling else SCHEDULER_CLS
    return ["--scheduler-cls", cls, flag, "--worker-extension-cls", WORKER_EXTENSION_CLS]


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
            if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_DEPTH:
                raise PluginConfigError(f"plan.depths[{i}] must be an integer in [0, {MAX_DEPTH}], but got {d!r}.")
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
        if isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= MAX_DEPTH:
            raise PluginConfigError(f"max_k must be an integer in [1, {MAX_DEPTH}], but got {max_k!r}.")
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
    step, so the drafter drafts nothing that would be trimmed. None: for sequential drafters, and for parallel
    drafting once every worker proved the drafter-width patch (``drafter_width``; without it parallel drafting must
    draft at its configured K, vLLM issue #45695). False: never (no off-steps either)."""
    flush_every_s: float = 5.0
    """Write the stats file at most this often while running (and when the engine goes idle, and at shutdown)."""
    idle_write_delay_s: float = 0.25
    """When the engine goes idle, write the stats file this long after (at most ``flush_every_s``), from a background
    thread and only if no step started meanwhile, so the outputs of the step that ended the burst are not held up
    (`policies.plugin.idle_writer`). 0: write it in that step, before its outputs go out, so the file is complete when
    the caller has them: for a process that ends right after its last request (the profiling job)."""
    max_samples_per_key: int = 512
    """Step times kept per (phase, batch size, depth) key for medians (reservoir sample beyond that)."""
    adaptive: Mapping[str, Any] | None = None
    """For "adaptive": {"policy": RequestPolicy dict, "cost_model": StepCostModel dict,
    "acceptance": {class: AcceptanceProfile dict}} (see `build_controller`)."""
    policy: Mapping[str, Any] | None = None
    """The operator's request policy (a policy-file dict, `policies.RequestPolicy.to_dict()`) for static and plan
    mode; adaptive mode uses ``adaptive.policy``. With a policy, request labels are resolved by it
    (`policies.plugin.RequestLabeler`): a client's ``peagle_class`` never raises its cap and unknown labels stay in
    the assigned class. None (the measuring harness, which labels its own requests): labels are taken as given,
    bounded in number."""
    fault_class: str | None = None
    """Test hook: an exception is raised when the depth of a request of this class is decided (see
    ``fault_where``), to test that the engine keeps serving."""
    drafter_width: Mapping[str, Any] | None = None
    """Drafter-width control (`policies.plugin.drafter_width`): None or {} = on when every worker proves the patch
    in the handshake (the drafter drafts only the deepest planned depth; a step where every request is at depth 0
    skips it); ``{"enabled": false}`` = trimming only. Other keys are `DrafterWidthSettings` fields
    (``off_steps``: "catch_up" (default; "catch_up_decode" under prefix caching without ``prefix_cache_guard``),
    "sync_pass" or "holes"; ``skip_sampler``; ``max_catch_up_tokens``; ``defer_idle_prompts``;
    ``prefix_cache_guard``; ``fault``: a worker-side test hook)."""
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
        if not (_number(self.idle_write_delay_s) and self.idle_write_delay_s >= 0):
            raise PluginConfigError(
                f"idle_write_delay_s must be a number of seconds >= 0 (0: in the step), but got "
                f"{self.idle_write_delay_s!r}."
            )
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
        if self.policy is not None and not isinstance(self.policy, Mapping):
            raise PluginConfigError(f"policy must be a policy object or null, but got {self.policy!r:.80}.")
        if self.fault_class is not None and (not isinstance(self.fault_class, str) or not self.fault_class):
            raise PluginConfigError(f"fault_class must be a class name or null, but got {self.fault_class!r}.")
        if self.drafter_width is not None:
            if not isinstance(self.drafter_width, Mapping):
                raise PluginConfigError(
                    f"drafter_width must be an object or null, but got {self.drafter_width!r:.80}."
                )
            self.drafter_width_settings()  # validates
        if self.fault_where not in FAULT_WHERE:
            raise PluginConfigError(
                f"fault_where must be one of {', '.join(FAULT_WHERE)}, but got {self.fault_where!r}."
            )

    @property
    def drafter_width_enabled(self) -> bool:
        """Whether the plugin asks the workers to draft only the planned depth (see ``drafter_width``)."""
        return bool((self.drafter_width or {}).get("enabled", True))

    def drafter_width_settings(self) -> DrafterWidthSettings:
        """The ``drafter_width`` settings sent to the workers in the handshake."""
        rest = {k: v for k, v in (self.drafter_width or {}).items() if k != "enabled"}
        enabled = (self.drafter_width or {}).get("enabled", True)
        if not isinstance(enabled, bool):
            raise PluginConfigError(f"drafter_width.enabled must be true or false, but got {enabled!r}.")
        try:
            return DrafterWidthSettings.from_dict(rest)
        except (TypeError, ValueError) as exc:
            raise PluginConfigError(f"drafter_width: {exc}") from None

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
        text = read_text(p, PluginConfigError, "plugin config")
        try:
            data = load_json_text(text)
        except json.JSONDecodeError as exc:
            raise PluginConfigError(f"{p}: not valid JSON: {exc}.") from exc
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginConfig:
        """The config named by ``PEAGLE_SCHEDULER_CONFIG``; without it, static mode that records nothing."""
        env = os.environ if environ is None else environ
        path = env.get(CONFIG_ENV)
        return cls() if not path else cls.load(path)



# ------------------------------------------------------------------------------------------------------- helpers
def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _depth(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DEPTH:
        raise PluginConfigError(f"{name} must be an integer depth in [0, {MAX_DEPTH}], but got {value!r}.")


def _unknown(path: str, data: Mapping[str, Any], known: set[str]) -> None:
    extra = sorted(str(k) for k in data if k not in known)
    if extra:
        where = f"{path}: " if path else ""
        raise PluginConfigError(f"{where}unknown key(s) {extra}; known keys are {sorted(known)}. Check the spelling.")
