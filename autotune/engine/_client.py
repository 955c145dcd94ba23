"""The streaming client of serve-mode measurements: ``/v1/chat/completions`` or ``/v1/completions`` (streaming) and
``/metrics``.

Prompts go as they are served (`WorkloadRequest.is_chat`): chat requests to ``/v1/chat/completions`` (the model's
chat template applies on the server), raw text to ``/v1/completions``, both streamed with the same ``max_tokens``,
``temperature`` and ``ignore_eos``. Per request, on the client's clock (HTTP and detokenisation included): TTFT
(sent -> first chunk), TPOT ((last - first chunk) / (completion tokens - 1)) and ITL (gaps between chunks: one
engine step streams one chunk, so with speculation ITL is per step, not per token). Load: closed loop at
``concurrency`` in flight, or Poisson arrivals at ``request_rate`` with at most ``concurrency`` in flight. A class
with no streamed chunk for ``stall_s`` raises `EngineStalled` (`autotune.engine._stall`); each class reports its
longest gap between chunks (``max_gap_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.engine._constants import WARMUP_MAX_TOKENS
from autotune.engine._counters import snapshot_from_prometheus, spec_delta
from autotune.engine._harness import request_from_dict
from autotune.engine._stall import STALL_POLL_S, EngineStalled, Progress, stall_message
from autotune.workloads import WorkloadRequest

#: Poisson arrivals use a fixed seed so two runs of one scenario offer the same load.
_ARRIVAL_SEED = 0
#: vLLM updates its counters just after it streams the final tokens: scrape until two reads this far apart agree.
_SCRAPE_SETTLE_S = 0.2
_SCRAPE_MAX_READS = 10


class ServeRequestError(Exception):
    """The server answered a request with an HTTP error (the message carries endpoint, status and body)."""

    def __init__(self, status: int, body: str, endpoint: str = "/v1/completions") -> None:
        super().__init__(f"HTTP {status} from {endpoint}: {body[:300]}")
        self.status = status


class PhaseLog:
    """Writes the phase into the server log, as the offline worker does, so a timeout names the phase."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.phase = "load"

    def __call__(self, phase: str) -> None:
        self.phase = phase
        with open(self.log_path, "a") as f:
            f.write(f"[peagle-serve] phase={phase}\n")


def request_payload(
    model: str, request: WorkloadRequest, max_tokens: int, ignore_eos: bool
) -> tuple[str, dict[str, Any]]:
    """(endpoint, JSON body) of one streamed request: chat messages to ``/v1/chat/completions``, raw text to
    ``/v1/completions`` (`WorkloadRequest.is_chat`), the sampling fields the same for both."""
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    if request.is_chat:
        return "/v1/chat/completions", {**payload, "messages": list(request.messages or ())}
    return "/v1/completions", {**payload, "prompt": request.text()}


def _chunk_text(choice: Mapping[str, Any]) -> str | None:
    """The text a streamed choice carries (completions: ``text``; chat: the delta's ``content`` or reasoning), or
    None for a chat chunk that carries none (the role announcement vLLM streams before the first token)."""
    if "delta" not in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    parts = [delta.get(k) for k in ("content", "reasoning_content", "reasoning")]
    text = "".join(p for p in parts if isinstance(p, str))
    if text or delta.get("tool_calls") or choice.get("finish_reason"):
        return text
    return None


async def _one_request(
    session: Any,
    base: str,
    model: str,
    request: WorkloadRequest,
    max_tokens: int,
    ignore_eos: bool,
    progress: Progress | None = None,
) -> dict[str, Any]:
    endpoint, payload = request_payload(model, request, max_tokens, ignore_eos)
    chunk_times: list[float] = []
    text_parts: list[str] = []
    completion_tokens: int | None = None
    sent = time.perf_counter()
    async with session.post(f"{base}{endpoint}", json=payload) as resp:
        if resp.status != 200:
            raise ServeRequestError(resp.status, await resp.text(), endpoint)
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
            text = _chunk_text(choices[0]) if choices else None
            if text is not None:
                chunk_times.append(time.perf_counter())
                text_parts.append(text)
            if progress is not None:
                progress.tick()
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
    progress: Progress | None = None,
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
            return await _one_request(session, base, model, r, cap, ignore_eos, progress)

    return list(await asyncio.gather(*(run(i, r) for i, r in enumerate(requests))))


async def _unless_stalled(run: Awaitable[Any], progress: Progress, stall_s: float, mark: PhaseLog, base: str) -> Any:
    """Await `run`; cancel it and raise `EngineStalled` when `progress` stays idle for more than `stall_s`."""
    progress.mark()
    task = asyncio.ensure_future(run)
    while True:
        done, _ = await asyncio.wait({task}, timeout=STALL_POLL_S)
        if task in done:
            return task.result()
        idle = progress.idle_s()
        if idle > stall_s:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise EngineStalled(stall_message(mark.phase, idle, stall_s, f"vllm serve at {base}"))


async def _scrape_spec(session: Any, base: str) -> dict[str, Any]:
    """Counters after the engine has recorded the last step (at most ~2 s of re-reads)."""
    last: dict[str, Any] | None = None
    for _ in range(_SCRAPE_MAX_READS):
        async with session.get(f"{base}/metrics") as resp:
            snap = snapshot_from_prometheus(await resp.text())
        if snap == last:
            break
        last = snap
        await asyncio.sleep(_SCRAPE_SETTLE_S)
    assert last is not None
    return last


async def measure_over_http(
    job: Mapping[str, Any],
    base: str,
    timings: dict[str, float],
    mark: PhaseLog,
    stall_s: float = float("inf"),
) -> dict[str, Any]:
    """Warm up, then measure each class of ``job["classes"]`` as its own sub-phase against the server at `base`.

    Returns ``{class: {"wall_s", "num_requests", "output_tokens", "ttft_ms", "tpot_ms", "itl_ms", "max_gap_s",
    "spec", "outputs"?}}`` (the offline worker's shape plus ITL) and adds ``warmup_s``/``measure_s`` to `timings`.
    Raises `EngineStalled` when no chunk streams for `stall_s` during the warm-up or a class.
    """
    import aiohttp  # installed with vLLM; serve mode needs vLLM anyway

    classes = {c: [request_from_dict(r) for r in reqs] for c, reqs in job["classes"].items()}
    concurrency = int(job["concurrency"])
    rate = job.get("request_rate")
    ignore_eos = bool(job.get("ignore_eos", False))
    model = job["model"]
    progress = Progress()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        mark("warmup")
        t = time.perf_counter()
        warm = [r for reqs in classes.values() for r in reqs][: int(job.get("warmup_requests", 0))]
        if warm:
            await _unless_stalled(
                _run_requests(session, base, model, warm, concurrency, None, ignore_eos, WARMUP_MAX_TOKENS, progress),
                progress, stall_s, mark, base,
            )
            with contextlib.suppress(Exception):  # dev-mode endpoint; without it the cache just stays warm
                async with session.post(f"{base}/reset_prefix_cache"):
                    pass
        timings["warmup_s"] = time.perf_counter() - t
        mark("measure")
        per_class: dict[str, Any] = {}
        for name, reqs in classes.items():
            before = await _scrape_spec(session, base)
            t = time.perf_counter()
            results = await _unless_stalled(
                _run_requests(session, base, model, reqs, concurrency, rate, ignore_eos, None, progress),
                progress, stall_s, mark, base,
            )
            wall = time.perf_counter() - t
            max_gap_s = progress.gap_s()
            after = await _scrape_spec(session, base)
            entry: dict[str, Any] = {
                "wall_s": wall,
                "num_requests": len(results),
                "output_tokens": sum(r["tokens"] for r in results),
                "ttft_ms": [r["ttft_ms"] for r in results if r["ttft_ms"] is not None],
                "tpot_ms": [r["tpot_ms"] for r in results if r["tpot_ms"] is not None],
                "itl_ms": [x for r in results for x in r["itl_ms"]],
                "max_gap_s": max_gap_s,
                "spec": spec_delta(before, after),
            }
            if job.get("return_outputs"):
                entry["outputs"] = [{"text": r["text"]} for r in results]
            per_class[name] = entry
    timings["measure_s"] = sum(c["wall_s"] for c in per_class.values())
    return per_class
