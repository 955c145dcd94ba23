"""The vLLM scheduler plugin's public contract: what a process that starts an engine writes, sets and reads back.

- `config`: `PluginConfig` (the JSON file named by `CONFIG_ENV`), `DepthPlan`, `engine_kwargs` / `serve_args`
  (``scheduler_cls`` = `ASYNC_SCHEDULER_CLS` with async scheduling, vLLM's default on a GPU, or `SCHEDULER_CLS`
  with synchronous scheduling, as on CPU; ``worker_extension_cls`` = `WORKER_EXTENSION_CLS`);
- `drafter_width` (worker process) and `drafting` (engine core): the drafter drafts only the planned depth and skips
  steps where every request is at depth 0, once every worker proved the patch in a handshake;
- `stats`: `PluginStats`, what the plugin measured (the stats.json at ``PluginConfig.stats_path``);
- `labels`: the per-request ``extra_args`` keys (`CLASS_KEY`, `PHASE_KEY`, `SPECULATE_KEY`, `MAX_K_KEY`, and the
  middleware's authenticated `ROUTE_KEY`) and their bounded reading (`RequestLabeler`);
- `metrics`: the ``peagle:*`` Prometheus series (`METRIC_NAMES`);
- `factory`: the adaptive mode's controller (`build_controller`) and the ``fault_class`` test hooks;
- `scheduler`: `PeagleScheduler`, the thin vLLM adapter. It imports vLLM, so this package does not import it; vLLM
  loads it in the engine-core process by the class path `SCHEDULER_CLS` ("policies.scheduler.PeagleScheduler").

Example: install the plugin in plan mode and read what it measured::

    config = PluginConfig(mode="plan", plan=DepthPlan.sweep(4), stats_path="stats.json")
    os.environ[CONFIG_ENV] = str(config.save("plugin.json"))
    llm = vllm.LLM(model, speculative_config=..., **engine_kwargs(async_scheduling=on_a_gpu))
    ...
    stats = PluginStats.load("stats.json")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policies.errors import ControllerFault, PluginConfigError, PluginFault
    from policies.plugin.config import (
        ASYNC_SCHEDULER_CLS,
        CONFIG_ENV,
        FAULT_WHERE,
        MODES,
        SCHEDULER_CLS,
        WORKER_EXTENSION_CLS,
        DepthPlan,
        PluginConfig,
        engine_kwargs,
        serve_args,
    )
    from policies.plugin.factory import build_controller
    from policies.plugin.labels import (
        CLASS_KEY,
        DEFAULT_CLASS,
        DEFAULT_PHASE,
        LABEL_KEY_ENV,
        MAX_K_KEY,
        OTHER_LABEL,
        PHASE_KEY,
        ROUTE_KEY,
        SPECULATE_KEY,
        RequestLabeler,
        normalize_extra_args,
        opted_out,
        request_label,
        route_stamp,
    )
    from policies.plugin.metrics import METRIC_NAMES, PluginMetrics
    from policies.plugin.stats import PluginStats

#: Where each public name lives: imported on first use (PEP 562), so importing one module of the package does not
#: load them all.
_HOMES = {
    "ControllerFault": "policies.errors",
    "PluginConfigError": "policies.errors",
    "PluginFault": "policies.errors",
    "ASYNC_SCHEDULER_CLS": "policies.plugin.config",
    "CONFIG_ENV": "policies.plugin.config",
    "FAULT_WHERE": "policies.plugin.config",
    "MODES": "policies.plugin.config",
    "SCHEDULER_CLS": "policies.plugin.config",
    "WORKER_EXTENSION_CLS": "policies.plugin.config",
    "DepthPlan": "policies.plugin.config",
    "PluginConfig": "policies.plugin.config",
    "engine_kwargs": "policies.plugin.config",
    "serve_args": "policies.plugin.config",
    "build_controller": "policies.plugin.factory",
    "CLASS_KEY": "policies.plugin.labels",
    "DEFAULT_CLASS": "policies.plugin.labels",
    "DEFAULT_PHASE": "policies.plugin.labels",
    "LABEL_KEY_ENV": "policies.plugin.labels",
    "MAX_K_KEY": "policies.plugin.labels",
    "OTHER_LABEL": "policies.plugin.labels",
    "PHASE_KEY": "policies.plugin.labels",
    "ROUTE_KEY": "policies.plugin.labels",
    "SPECULATE_KEY": "policies.plugin.labels",
    "RequestLabeler": "policies.plugin.labels",
    "normalize_extra_args": "policies.plugin.labels",
    "opted_out": "policies.plugin.labels",
    "request_label": "policies.plugin.labels",
    "route_stamp": "policies.plugin.labels",
    "METRIC_NAMES": "policies.plugin.metrics",
    "PluginMetrics": "policies.plugin.metrics",
    "PluginStats": "policies.plugin.stats",
}

__all__ = [
    "ASYNC_SCHEDULER_CLS",
    "CLASS_KEY",
    "CONFIG_ENV",
    "DEFAULT_CLASS",
    "DEFAULT_PHASE",
    "FAULT_WHERE",
    "LABEL_KEY_ENV",
    "MAX_K_KEY",
    "METRIC_NAMES",
    "MODES",
    "OTHER_LABEL",
    "PHASE_KEY",
    "ROUTE_KEY",
    "SCHEDULER_CLS",
    "SPECULATE_KEY",
    "WORKER_EXTENSION_CLS",
    "ControllerFault",
    "DepthPlan",
    "PluginConfig",
    "PluginConfigError",
    "PluginFault",
    "PluginMetrics",
    "PluginStats",
    "RequestLabeler",
    "build_controller",
    "engine_kwargs",
    "normalize_extra_args",
    "opted_out",
    "request_label",
    "route_stamp",
    "serve_args",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'policies.plugin' has no attribute {name!r}")
