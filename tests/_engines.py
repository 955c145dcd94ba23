"""Engines shared by the test session: a measurement that several tests only read is run once, on first use.

`EnginePool.measure` keys a `VLLMBackend` measurement by everything that decides it (mode, target, the backend's
options, the config: drafter, method, parallel drafting, K, the workload's content and the scenario); the pool is
the session fixture ``engine_pool`` (tests/conftest.py). Tests that kill, fault or reconfigure an engine launch
their own. The shared runs are named here, so that the tests reading them ask for the same key.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.vllm import VLLMBackend
from autotune.measurement import Measurement
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest, load_workload

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", REPO / "examples" / "workloads" / "fixture.jsonl"))


class EnginePool:
    """`VLLMBackend` measurements, each run once per session (a failed one too: every reader sees its failure)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._runs: dict[str, Measurement] = {}

    def measure(self, mode: str, config: SpecConfig, workload: Workload, scenario: Scenario, target: str = "target",
                **backend: Any) -> Measurement:
        key = json.dumps([mode, target, dataclasses.asdict(config), workload.content_hash(),
                          dataclasses.asdict(scenario), backend], sort_keys=True, default=str)
        if key not in self._runs:
            log_dir = self._root / f"run{len(self._runs)}-{mode}"
            engine = VLLMBackend(str(MODELS / target), mode=mode, log_dir=log_dir, **backend)
            self._runs[key] = engine.measure(config, workload, scenario)
        return self._runs[key]


# ------------------------------------------------------------------------------------------- shared runs
CHAT_K = 3
EAGLE3_K = 3


def needs(*names: str) -> None:
    """Skip unless the fixture models (and the fixture workload) are built."""
    for needed in [*(MODELS / n / "config.json" for n in names), WORKLOAD]:
        if not needed.is_file():
            pytest.skip(f"fixture {needed} is missing: run `python tests/fixtures/build_fixtures.py`")


def chat_workload() -> Workload:
    """The fixture workload, 2 requests per class: ``predictable`` as single user messages (the fixture template
    renders "<bos>user: <prompt>"), ``entropic`` as raw text, so one run takes both paths of each mode."""
    workload = load_workload(WORKLOAD, max_per_class=2)
    classes = {
        c: tuple(WorkloadRequest(messages=({"role": "user", "content": r.prompt or ""},), max_tokens=r.max_tokens,
                                 temperature=r.temperature) if c == "predictable" else r for r in reqs)
        for c, reqs in workload.classes.items()
    }
    return Workload(f"{workload.name}-chat", classes, workload.source)


def chat_run(pool: EnginePool, mode: str) -> tuple[Workload, Measurement]:
    """drafter-2l, draft_model + parallel drafting at K=3, one sequence at a time (concurrency 1: no batch
    composition differs between modes; the engine's cap stays 4, which serve keeps and offline lowers to 1), greedy
    float32 with outputs returned. Read by tests/test_prompts_as_served.py (offline and serve) and
    tests/test_vllm_backend_serve.py (serve)."""
    needs("target", "drafter-2l")
    workload = chat_workload()
    config = SpecConfig(method="draft_model", drafter=str(MODELS / "drafter-2l"), num_speculative_tokens=CHAT_K,
                        parallel_drafting=True, max_num_seqs=4)
    m = pool.measure(mode, config, workload, Scenario(concurrency=1), dtype="float32", timeout_s=600.0,
                     return_outputs=True, engine_extra={"enforce_eager": True},
                     env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    return workload, m


def eagle3_run(pool: EnginePool) -> Measurement:
    """The P-EAGLE path: eagle3 + parallel drafting at K=3 on the 8-layer config-only target with dummy weights
    (EAGLE-3 taps target layers 2, L/2 and L-3: eight layers keep them distinct), 2 requests per class at
    concurrency 2. Random weights: acceptance means nothing, only drafting is asserted. Read by
    tests/test_vllm_backend_offline.py and tests/test_fixtures_acceptance.py."""
    needs("target-deep", "eagle3-head")
    config = SpecConfig(method="eagle3", drafter=str(MODELS / "eagle3-head"), num_speculative_tokens=EAGLE3_K,
                        parallel_drafting=True, max_num_seqs=2)
    return pool.measure("offline", config, load_workload(WORKLOAD, max_per_class=2), Scenario(concurrency=2),
                        target="target-deep", load_format="dummy", dtype="float32", timeout_s=600.0,
                        warmup_requests=2, engine_extra={"enforce_eager": True}, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
