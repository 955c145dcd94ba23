"""Running the launched server: start ``vllm serve``, forward signals, record live profiles, shut down cleanly.

A server that stops without being asked to (its engine core died: vLLM's API server then shuts itself down, with
exit code 0; or it failed to start) is an error, `ServerExitedError`, with one line saying when and how it ended.
It is not restarted: a restart would hide a crash that recurs, and the user's supervisor (systemd, Kubernetes) is
the place for restart policies.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from autotune.engine import (
    HEALTH_POLL_S,
    is_healthy,
    kill_process_group,
    signal_process_group,
    start_process_group,
)
from autotune.errors import ServerExitedError
from autotune.serving._launch import ServeLaunch
from policies.plugin import LABEL_KEY_ENV

__all__ = ["run_server"]

_SHUTDOWN_GRACE_S = 60.0
"""How long a signalled server may take to stop (vLLM drains requests, the plugin flushes) before it is killed."""


def run_server(
    launch: ServeLaunch,
    recorder: Any | None = None,
    *,
    record_every_s: float = 600.0,
    log: Callable[[str], None] = print,
    shutdown_grace_s: float = _SHUTDOWN_GRACE_S,
    stop: threading.Event | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> int:
    """Launch ``vllm serve`` and supervise it until it exits; returns its exit code when it was asked to stop.

    The server runs in its own process group with this process's stdout/stderr, and ends if this process dies
    (`start_process_group`'s leash). SIGINT/SIGTERM received here are forwarded to the whole group, SIGHUP (a
    closed terminal) as SIGTERM: vLLM shuts down gracefully and the plugin flushes its statistics. A second
    signal, or no exit within ``shutdown_grace_s``, kills the group. Every ``record_every_s`` seconds and once
    after the server exits, ``recorder.record()`` (a `LiveRecorder`) stores the live profile.

    ``stop``: setting this event stops the server like a SIGTERM (for callers that run the server from code).
    Signal handlers are installed only when called from the main thread. ``extra_env``: more environment variables
    for the server (e.g. ``VLLM_CPU_KVCACHE_SPACE``).

    Raises `PrivateDirectoryError` when the run directory cannot be used (nothing is started then), and
    `ServerExitedError` when the server stops on its own (after the final record and cleanup).
    """
    launch.write_files()
    env = dict(os.environ)
    env.update(launch.env)
    # A fresh secret per launch: the middleware stamps each request's class with it and the engine trusts only
    # stamped classes (`policies.plugin.labels`), so a client cannot claim a class the operator did not give it.
    env[LABEL_KEY_ENV] = secrets.token_hex(32)
    env.update(extra_env or {})
    proc = start_process_group(launch.argv, None, env)
    stopping: dict[str, float] = {}

    def forward(signum: int, frame: FrameType | None) -> None:
        if "since" in stopping:
            log("peagle-tune serve: second signal, killing the server.")
            signal_process_group(proc, signal.SIGKILL)
            return
        stopping["since"] = time.monotonic()
        # A closed terminal (SIGHUP) stops the server as SIGTERM does: gracefully, the plugin writing its statistics.
        signal_process_group(proc, signal.SIGTERM if signum == signal.SIGHUP else signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    started = time.monotonic()
    next_record = started + record_every_s
    ready_at: float | None = None
    try:
        while proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=HEALTH_POLL_S)
            now = time.monotonic()
            if stop is not None and stop.is_set() and "since" not in stopping:
                forward(signal.SIGTERM, None)
            if ready_at is None and proc.poll() is None and is_healthy(launch.base_url):
                ready_at = time.monotonic()
                log(
                    f"peagle-tune serve: ready at {launch.base_url}/v1 (metrics, with peagle:* gauges: "
                    f"{launch.base_url}/metrics; plugin statistics: {launch.stats_path})."
                )
            if "since" in stopping and now - stopping["since"] > shutdown_grace_s:
                log(f"peagle-tune serve: the server did not stop within {shutdown_grace_s:.0f} s; killing it.")
                signal_process_group(proc, signal.SIGKILL)
            if recorder is not None and now >= next_record:
                next_record = now + record_every_s
                _safe_record(recorder, log)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        kill_process_group(proc)  # the server if it still runs, and engine processes left behind by an unclean exit
        if recorder is not None:
            _safe_record(recorder, log)
        launch.cleanup()
    code = int(proc.returncode or 0)
    if "since" not in stopping:
        raise ServerExitedError(_unasked_exit(code, started, ready_at))
    return code


def _unasked_exit(code: int, started: float, ready_at: float | None) -> str:
    """One line for a server that stopped on its own: when, its exit status, the likely cause."""
    status = f"exit code {code}"
    if code < 0:
        with contextlib.suppress(ValueError):
            status = f"killed by {signal.Signals(-code).name}"
    now = time.monotonic()
    if ready_at is None:
        return f"vllm serve exited before it was ready ({status}, after {now - started:.0f} s); see its log above."
    return (
        f"vllm serve stopped on its own after {now - ready_at:.0f} s of serving ({status}): its engine died or it "
        "shut itself down; see its log above (peagle-tune serve does not restart it)."
    )


def _safe_record(recorder: Any, log: Callable[[str], None]) -> None:
    """Recording must never take serving down: log store errors and carry on."""
    try:
        profile_id = recorder.record()
    except Exception as exc:  # noqa: BLE001 - a full disk or a down database must not stop the server
        log(f"peagle-tune serve: could not record the live profile ({type(exc).__name__}: {exc}); will retry.")
        return
    if profile_id is not None:
        log(f"peagle-tune serve: stored live profile #{profile_id}.")
