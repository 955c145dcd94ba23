"""Issue 44.3, a stall is a failure: the rule on plain numbers, the watcher, and the serve client against a fake server
that stops streaming. The real engine stopped with SIGSTOP is in
`tests/test_reliability_engine_faults.py::test_engine_killed_mid_trial_fails_that_trial_and_the_search_goes_on`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.engine._client import PhaseLog, measure_over_http
from autotune.engine._failures import classify_failure
from autotune.engine._process import free_port
from autotune.engine._runs import LaunchResult
from autotune.engine._stall import (
    STALL_ENV,
    STALLED,
    EngineStalled,
    Progress,
    stall_bound,
    stall_in,
    start_stall_watch,
)
from autotune.workloads import WorkloadRequest


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_bound_is_twice_the_load_time_at_least_a_minute_unless_set() -> None:
    assert stall_bound(40.0, env={}) == 80.0  # 2 x 40 s
    assert stall_bound(10.0, env={}) == 60.0  # 2 x 10 s = 20 s is below the 60 s floor
    assert stall_bound(40.0, env={STALL_ENV: "5"}) == 5.0
    assert stall_bound(40.0, 3.0, env={STALL_ENV: "5"}) == 3.0  # the job's own value first
    with pytest.raises(ValueError, match=r"^PEAGLE_STALL_S='soon' is not a number of seconds\.$"):
        stall_bound(40.0, env={STALL_ENV: "soon"})
    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        stall_bound(40.0, env={STALL_ENV: "nan"})


def test_progress_measures_the_longest_gap_and_a_paused_wait_is_no_gap() -> None:
    clock = Clock()
    progress = Progress(clock)
    for dt in (0.01, 0.02, 3.0, 0.01):  # steps 10 ms, 20 ms, then 3 s without one, then 10 ms
        clock.t += dt
        progress.tick()
    assert progress.gap_s() == pytest.approx(3.0)
    clock.t += 5.0  # the gap still open counts too
    assert progress.idle_s() == pytest.approx(5.0) and progress.gap_s() == pytest.approx(5.0)
    progress.mark()
    assert progress.gap_s() == 0.0
    with progress.paused():
        clock.t += 100.0
        assert progress.idle_s() == 0.0
    assert progress.gap_s() == 0.0  # the wait for the other engine's turn is not counted


def test_a_measured_class_with_a_gap_past_the_bound_is_no_measurement(tmp_path: Path) -> None:
    # Issue 44.3: EngineCore stopped for 180 s then continued: the baseline was stored as complete (TTFT p99 95 s).
    raw = {"ok": True, "stall_s": 60.0, "classes": {"a": {"max_gap_s": 0.4}, "b": {"max_gap_s": 180.2}}}
    why = stall_in(raw)
    assert why is not None and why.startswith("no progress (no engine step, no token) for 180 s during measure "
                                              "(class 'b'); the stall bound is 60 s")
    assert stall_in({**raw, "classes": {"a": {"max_gap_s": 59.9}}}) is None
    assert stall_in({"ok": True, "classes": {"a": {"max_gap_s": 999}}}) is None  # no bound reported: not judged

    launch = LaunchResult(raw, 1, 0, False, tmp_path / "engine.log", time.perf_counter(), 600.0)
    failure = launch.failure()
    assert failure is not None and failure[0] == "stalled"
    assert failure[1].startswith("The engine made no progress (no engine step, no token) for 180 s during measure")
    healthy = LaunchResult({**raw, "classes": {"a": {"max_gap_s": 0.4}}}, 1, 0, False, tmp_path / "engine.log",
                           time.perf_counter(), 600.0)
    assert healthy.failure() is None


def test_a_stall_report_is_classified_stalled_not_died_or_timed_out() -> None:
    message = "no progress (no engine step, no token) for 6 s during warmup (worker pid 7); the stall bound is 5 s"
    kind, reason = classify_failure(phase="warmup", exc_types=[STALLED, "RuntimeError"], message=message,
                                    returncode=1, timed_out=False, log_text="", timeout_s=1800.0)
    assert kind == "stalled" and "\n" not in reason
    assert reason.startswith(f"The engine made {message}. Nothing was measured; ") and STALL_ENV in reason


def test_the_watch_fires_once_in_a_watched_phase_and_never_while_loading() -> None:
    progress = Progress()
    phase = {"now": "load"}
    stalls: list[str] = []
    start_stall_watch(progress, 0.3, lambda: phase["now"], stalls.append, "worker pid 1", poll_s=0.05)
    time.sleep(0.6)  # twice the bound while loading: loading has its own deadline
    assert stalls == []
    phase["now"] = "measure"
    deadline = time.monotonic() + 5
    while not stalls and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the watcher has returned: no second report
    assert len(stalls) == 1 and "during measure (worker pid 1); the stall bound is 0.3 s" in stalls[0]


def test_the_serve_client_fails_a_class_whose_stream_stops(tmp_path: Path) -> None:
    web = pytest.importorskip("aiohttp.web", reason="aiohttp (installed with vLLM) is needed for the serve client")

    release = asyncio.Event()  # set when the test ends, so the server stops at once, not after 30 s

    async def stream(request: Any) -> Any:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"data: {json.dumps({'choices': [{'index': 0, 'text': 'ab'}]})}\n\n".encode())
        if body["max_tokens"] > 4:  # the measured request: the engine stops after its first chunk
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(release.wait(), 30)
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    async def metrics(request: Any) -> Any:
        return web.Response(text="")

    async def main() -> float:
        app = web.Application()
        app.router.add_post("/v1/completions", stream)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        job = {"model": "m", "concurrency": 1, "request_rate": None, "warmup_requests": 0,
               "classes": {"a": [WorkloadRequest(prompt="p", max_tokens=8).to_dict()]}}
        started = time.monotonic()
        try:
            with pytest.raises(EngineStalled, match=r"^no progress \(no engine step, no token\) for \d+ s during "
                                                    r"measure \(vllm serve at http://127\.0\.0\.1:\d+\); the stall "
                                                    r"bound is 1 s"):
                await measure_over_http(job, f"http://127.0.0.1:{port}", {}, PhaseLog(tmp_path / "log"), 1.0)
            return time.monotonic() - started
        finally:
            release.set()
            await runner.cleanup()

    elapsed = asyncio.run(main())
    assert elapsed < 10  # the bound (1 s) plus a poll, not the 30 s the stream hangs
