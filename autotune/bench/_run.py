"""Run a `BenchPlan`: the server in its own process group until ``/health`` answers, then ``vllm bench serve``
against it; the server (its whole group) is always ended before `run_bench` returns."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.bench._figures import figures_from_result
from autotune.bench._plan import DATASET_FILE, RESULT_FILE, BenchPlan
from autotune.engine import HEALTH_POLL_S, is_healthy, kill_process_group, start_process_group
from autotune.engine._constants import SERVER_SHUTDOWN_GRACE_S
from autotune.engine._process import poll_until
from autotune.engine._runs import temporary

#: Lines of a log a failure shows.
TAIL_LINES = 15


@dataclass
class BenchRun:
    """What one benchmark gave: the figures (our names, `figures_from_result`) or why there are none."""

    figures: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    """One line saying what went wrong (None: the benchmark completed requests)."""
    log_tail: str = ""
    """The last lines of the log of the process that failed."""
    wall_s: float = 0.0
    """Seconds from starting the server to the end of the benchmark (start-up included)."""

    @property
    def ok(self) -> bool:
        return self.failure is None


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-TAIL_LINES:])
    except OSError:
        return ""


def run_bench(plan: BenchPlan, run_dir: Path, *, timeout_s: float, env: Mapping[str, str],
              progress: Callable[[str], None] | None = None) -> BenchRun:
    """Serve `plan.serve`, benchmark it with `plan.bench`, and read vLLM's result file; never raises for a server
    or benchmark that fails (the `BenchRun` says why). Everything is abandoned after `timeout_s` seconds."""
    say = progress or (lambda _line: None)
    with open(run_dir / DATASET_FILE, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in plan.dataset)
    server_log, bench_log = run_dir / "server.log", run_dir / "bench.log"
    started = time.monotonic()
    deadline = started + timeout_s
    server = start_process_group(plan.serve, server_log, env, remove=temporary(run_dir))
    try:
        say(f"starting the server ({plan.mode}) on {plan.base_url}")
        outcome = poll_until(lambda: is_healthy(plan.base_url), server, deadline, interval_s=HEALTH_POLL_S)
        if outcome == "exited":
            return BenchRun(failure=f"The server exited with code {server.returncode} before it answered /health.",
                            log_tail=_tail(server_log), wall_s=time.monotonic() - started)
        if outcome == "timeout":
            return BenchRun(failure=f"The server did not answer /health within {timeout_s:.0f} s (--timeout).",
                            log_tail=_tail(server_log), wall_s=time.monotonic() - started)
        say(f"server ready after {time.monotonic() - started:.0f} s; vllm bench serve: {plan.num_prompts} prompts "
            f"at concurrency {plan.concurrency}")
        return _benchmark(plan, run_dir, bench_log, server, env, deadline, started)
    finally:
        kill_process_group(server, grace_s=SERVER_SHUTDOWN_GRACE_S)


def _benchmark(plan: BenchPlan, run_dir: Path, bench_log: Path, server: Any, env: Mapping[str, str],
               deadline: float, started: float) -> BenchRun:
    """Run ``vllm bench serve`` to its end (or the deadline) and read its result file."""
    client = start_process_group(plan.bench, bench_log, env)
    try:
        outcome = poll_until(lambda: False, client, deadline, interval_s=HEALTH_POLL_S)
    finally:
        kill_process_group(client)
    wall = time.monotonic() - started
    if outcome == "timeout":
        return BenchRun(failure="vllm bench serve did not finish before --timeout.", log_tail=_tail(bench_log),
                        wall_s=wall)
    result_path = run_dir / RESULT_FILE
    if client.returncode != 0 or not result_path.is_file():
        dead = server.poll() is not None
        who = "the server died during the benchmark" if dead else f"vllm bench serve exited with {client.returncode}"
        return BenchRun(failure=f"No result: {who}.", log_tail=_tail(bench_log), wall_s=wall)
    result = json.loads(result_path.read_text(encoding="utf-8"))
    figures = figures_from_result(result)
    if not figures.get("completed"):
        return BenchRun(figures, failure=f"No request of {plan.num_prompts} completed (see the benchmark log).",
                        log_tail=_tail(bench_log), wall_s=wall)
    return BenchRun(figures, wall_s=wall)


def bench_provenance(mode: str) -> dict[str, Any]:
    """Where and when a benchmark measured: this machine's device and vLLM (`detect_environment`), today (UTC),
    and what served the requests."""
    import datetime as dt

    from autotune.environment import detect_environment

    environment = detect_environment()
    return {
        "kind": "measured",
        "backend": "vllm bench serve",
        "device": environment["device"],
        "gpu_count": environment["gpu_count"],
        "vllm_version": environment["vllm_version"],
        "torch_version": environment["torch_version"],
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "deployment": "vllm serve (static)" if mode == "static" else "peagle-tune serve (adaptive)",
    }
