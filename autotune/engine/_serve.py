"""Serve-mode measurements: ``vllm serve`` in its own process group, measured by the streaming client.

`run_serve` starts the server on a free loopback port, waits for ``/health``, then the client (`_client`) sends a
warm-up and measures each workload class as its own sub-phase, scraping the speculative counters from
``/metrics`` before and after. The report has the offline worker's shape, so one function in
`autotune.backends.vllm` turns either into a Measurement. The server is always killed (its whole process group)
before `run_serve` returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.engine._client import PhaseLog, ServeRequestError, measure_over_http
from autotune.engine._constants import HEALTH_POLL_S, LOOPBACK, SERVER_SHUTDOWN_GRACE_S
from autotune.engine._observe import watch_launch
from autotune.engine._options import EngineOptions, serve_argv
from autotune.engine._process import free_port, is_healthy, kill_process_group, poll_until, start_process_group
from autotune.engine._runs import LaunchResult, temporary
from autotune.engine._stall import stall_bound

#: Enables ``POST /reset_prefix_cache`` after the warm-up (the server binds loopback only).
_SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def run_serve(job: Mapping[str, Any], run_dir: Path, options: EngineOptions) -> LaunchResult:
    """Run one serve-mode measurement; never raises for engine failures.

    `job` has the offline job's keys (``model``, ``engine_kwargs`` in ``LLM`` keyword names, ``classes``, ...)
    plus ``concurrency`` and ``request_rate``; the run is abandoned after ``options.timeout_s``.
    """
    log_path = run_dir / "engine.log"
    mark = PhaseLog(log_path)
    port = free_port()
    base = f"http://{LOOPBACK}:{port}"
    cmd = serve_argv(str(job["model"]), job["engine_kwargs"], port=port)
    started = time.perf_counter()
    deadline = time.monotonic() + options.timeout_s
    mark("load")
    with watch_launch("serve measurement", log_path, options.timeout_s) as watched:
        proc, raw, returncode, timed_out = _serve_and_measure(job, cmd, base, deadline, started, mark, options,
                                                              temporary(run_dir))
        watched["ok"] = bool(raw.get("ok"))
    return LaunchResult(raw, proc.pid, returncode, timed_out, log_path, started, options.timeout_s)


def _serve_and_measure(
    job: Mapping[str, Any],
    cmd: list[str],
    base: str,
    deadline: float,
    started: float,
    mark: PhaseLog,
    options: EngineOptions,
    remove: tuple[Path, ...] = (),
) -> tuple[Any, dict[str, Any], int | None, bool]:
    """Start the server, wait for health, measure; (process, raw report, own exit status, timed out)."""
    log_path = mark.log_path
    timings: dict[str, float] = {}
    proc = start_process_group(cmd, log_path, options.process_env(_SERVER_ENV), remove=remove)
    failure: dict[str, Any] = {"ok": False, "phase": "load", "exc_type": None, "exc_types": [], "message": ""}
    returncode: int | None = None
    timed_out = False
    try:
        outcome = poll_until(lambda: is_healthy(base), proc, deadline, interval_s=HEALTH_POLL_S)
        if outcome == "exited":
            raw, returncode = failure, proc.returncode
        elif outcome == "timeout":
            raw, timed_out = failure, True
        else:
            timings["startup_s"] = time.perf_counter() - started
            try:
                stall_s = stall_bound(timings["startup_s"], job.get("stall_s"))
                measured = measure_over_http(job, base, timings, mark, stall_s)
                per_class = asyncio.run(asyncio.wait_for(measured, max(1.0, deadline - time.monotonic())))
                raw = {"ok": True, "timings": timings, "stall_s": stall_s, "classes": per_class}
            except TimeoutError:
                raw, timed_out = {**failure, "phase": mark.phase}, True
            except Exception as exc:  # a request failed: tell a dead server from a rejected request
                died = proc.poll() is not None
                returncode = proc.returncode if died else None
                raw = {
                    **failure,
                    "phase": mark.phase,
                    "exc_type": type(exc).__name__,
                    "exc_types": [c.__name__ for c in type(exc).__mro__],
                    "message": str(exc),
                    # A dead engine core answers 500 while vLLM's API server still runs (it shuts down seconds
                    # later) and /health answers 503: that is no rejected config.
                    "kind_hint": "invalid_config"
                    if isinstance(exc, ServeRequestError) and not died and is_healthy(base)
                    else None,
                }
    finally:
        kill_process_group(proc, grace_s=SERVER_SHUTDOWN_GRACE_S)
    return proc, raw, returncode, timed_out
