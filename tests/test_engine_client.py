"""The serve-mode client against a fake vLLM server (no engine): streaming parse, concurrency bound, counters."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from autotune.engine._client import PhaseLog, measure_over_http
from autotune.engine._process import free_port
from autotune.workloads import WorkloadRequest

web = pytest.importorskip("aiohttp.web", reason="aiohttp (installed with vLLM) is needed for the serve client")

TOKENS_PER_CHUNK = 2  # as with speculation: one engine step streams several tokens in one chunk


class FakeServer:
    """Streams max_tokens tokens in chunks of TOKENS_PER_CHUNK; every chunk counts as one accepted draft step."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.drafts = 0
        self.completions = 0
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    async def completions_handler(self, request: Any) -> Any:
        return await self._stream(request, chat=False)

    async def chat_handler(self, request: Any) -> Any:
        return await self._stream(request, chat=True)

    async def _stream(self, request: Any, chat: bool) -> Any:
        body = await request.json()
        self.bodies.append((request.path, body))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body["max_tokens"])
        if chat:  # vLLM announces the role before the first token (a chunk that carries no text)
            role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            await resp.write(f"data: {json.dumps(role)}\n\n".encode())
        for _ in range(n // TOKENS_PER_CHUNK):
            await asyncio.sleep(0.005)
            self.drafts += 1
            choice = {"index": 0, "delta": {"content": "ab"}} if chat else {"index": 0, "text": "ab"}
            chunk = {"choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.in_flight -= 1
        self.completions += 1
        await resp.write_eof()
        return resp

    async def metrics_handler(self, request: Any) -> Any:
        labels = 'engine="0",model_name="m"'
        text = (
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {self.drafts}.0\n"
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {3 * self.drafts}.0\n"
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {self.drafts}.0\n"
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} {self.drafts}.0\n'
        )
        return web.Response(text=text)

    async def reset_handler(self, request: Any) -> Any:
        return web.Response(text="ok")


def _run_client(job: dict[str, Any], tmp_path: Path) -> tuple[dict[str, Any], FakeServer]:
    server = FakeServer()

    async def main() -> dict[str, Any]:
        app = web.Application()
        app.router.add_post("/v1/completions", server.completions_handler)
        app.router.add_post("/v1/chat/completions", server.chat_handler)
        app.router.add_get("/metrics", server.metrics_handler)
        app.router.add_post("/reset_prefix_cache", server.reset_handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            timings: dict[str, float] = {}
            mark = PhaseLog(tmp_path / "log.txt")
            return await measure_over_http(job, f"http://127.0.0.1:{port}", timings, mark)
        finally:
            await runner.cleanup()

    return asyncio.run(main()), server


def _job(concurrency: int, request_rate: float | None = None, warmup: int = 0) -> dict[str, Any]:
    reqs = {
        "a": [WorkloadRequest(prompt=f"p{i}", max_tokens=8).to_dict() for i in range(6)],
        "b": [WorkloadRequest(prompt="q", max_tokens=4).to_dict()],
    }
    return {
        "model": "m",
        "classes": reqs,
        "concurrency": concurrency,
        "request_rate": request_rate,
        "warmup_requests": warmup,
    }


def test_client_counts_tokens_from_usage_and_deltas_counters_per_class(tmp_path: Path) -> None:
    per_class, server = _run_client(_job(concurrency=2, warmup=2), tmp_path)
    # Tokens come from the usage chunk, not the chunk count: 6 x 8 and 1 x 4.
    assert per_class["a"]["output_tokens"] == 48 and per_class["b"]["output_tokens"] == 4
    assert per_class["a"]["num_requests"] == 6
    # Counters are deltas per class: the warm-up (2 requests cut to 16 tokens = 8 tokens -> 4 chunks each)
    # is excluded; class a streams 6 x 4 chunks, class b 1 x 2.
    assert per_class["a"]["spec"]["num_drafts"] == 24 and per_class["b"]["spec"]["num_drafts"] == 2
    assert server.drafts == 24 + 2 + 2 * 4
    assert per_class["a"]["spec"]["accepted_per_position"] == [24]
    # One TTFT and TPOT per request; one inter-chunk gap per chunk after the first (3 per request of class a).
    assert len(per_class["a"]["ttft_ms"]) == 6 and len(per_class["a"]["tpot_ms"]) == 6
    assert len(per_class["a"]["itl_ms"]) == 6 * 3


@pytest.mark.parametrize("request_rate", [None, 1000.0])
def test_client_never_exceeds_the_scenario_concurrency(tmp_path: Path, request_rate: float | None) -> None:
    _, server = _run_client(_job(concurrency=2, request_rate=request_rate), tmp_path)
    assert server.completions == 7
    assert server.max_in_flight == 2  # 6 requests of class a, at most 2 at once, and the bound is reached


def test_client_sends_chat_requests_to_the_chat_endpoint_and_text_to_completions(tmp_path: Path) -> None:
    chat = WorkloadRequest(messages=({"role": "user", "content": "hi"},), max_tokens=6, temperature=0.5)
    job = {
        "model": "m", "concurrency": 1, "ignore_eos": True,
        "classes": {"chat": [chat.to_dict()], "raw": [WorkloadRequest(prompt="p", max_tokens=4).to_dict()]},
    }
    per_class, server = _run_client(job, tmp_path)
    by_path = dict(server.bodies)
    assert set(by_path) == {"/v1/chat/completions", "/v1/completions"}
    sent = by_path["/v1/chat/completions"]
    assert sent["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in sent
    assert (sent["max_tokens"], sent["temperature"], sent["ignore_eos"], sent["stream"]) == (6, 0.5, True, True)
    assert by_path["/v1/completions"]["prompt"] == "p" and "messages" not in by_path["/v1/completions"]
    # Same counters for both: 6 tokens in 3 chunks; the role-only chunk is no token, so 2 gaps, not 3.
    assert per_class["chat"]["output_tokens"] == 6 and len(per_class["chat"]["itl_ms"]) == 2
    assert per_class["chat"]["spec"]["num_drafts"] == 3 and per_class["raw"]["spec"]["num_drafts"] == 2
