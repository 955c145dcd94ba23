"""The vllm backend's logic that needs no engine: validation, request selection, counter sums and environment
detection (the engine layer's own logic is in test_engine_unit.py)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.backends.vllm import VLLMBackend, select_requests, sum_counters, vllm_available
from autotune.engine import MASK_TOKEN_KEYS
from autotune.environment import detect_environment, package_version
from autotune.errors import ConfigError
from autotune.measurement import SpecCounters
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest


def _drafter(tmp_path: Path, name: str, extra: dict[str, object]) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **extra}))
    return str(d)


# --- validation -----------------------------------------------------------------------------------------------


def test_validate_rejects_parallel_drafting_without_mask_token_naming_the_keys(tmp_path: Path) -> None:
    drafter = _drafter(tmp_path, "no-mask", {})
    config = SpecConfig(method="draft_model", drafter=drafter, num_speculative_tokens=3, parallel_drafting=True)
    with pytest.raises(ConfigError) as err:
        VLLMBackend("target").validate(config)
    for key in MASK_TOKEN_KEYS:
        assert key in str(err.value)
    # The same drafter is fine for sequential drafting, and with a mask token for parallel drafting.
    VLLMBackend("target").validate(config.with_(parallel_drafting=False))
    ok = _drafter(tmp_path, "with-mask", {"pard_token": 259})
    VLLMBackend("target").validate(config.with_(drafter=ok))


def test_validate_rejects_a_missing_local_drafter(tmp_path: Path) -> None:
    config = SpecConfig(method="eagle3", drafter=str(tmp_path / "nope"), num_speculative_tokens=3)
    with pytest.raises(ConfigError, match="not a directory"):
        VLLMBackend("target").validate(config)


@pytest.mark.skipif(not vllm_available(), reason="measure() needs vLLM installed (it raises otherwise)")
def test_measure_returns_invalid_config_before_launching_an_engine(tmp_path: Path) -> None:
    drafter = _drafter(tmp_path, "no-mask", {})
    config = SpecConfig(method="draft_model", drafter=drafter, num_speculative_tokens=3, parallel_drafting=True)
    workload = Workload("w", {"a": (WorkloadRequest(prompt="x"),)})
    m = VLLMBackend("target").measure(config, workload, Scenario())
    assert not m.ok and m.failure_kind == "invalid_config"
    assert "pard_token" in (m.failure_reason or "")
    assert "worker_pid" not in m.extra  # no engine process was started
    assert m.provenance.kind == "measured" and m.provenance.backend == "vllm"


@pytest.mark.skipif(not vllm_available(), reason="measure() needs vLLM installed (it raises otherwise)")
def test_offline_mode_rejects_open_loop_scenarios() -> None:
    workload = Workload("w", {"a": (WorkloadRequest(prompt="x"),)})
    m = VLLMBackend("target").measure(SpecConfig(), workload, Scenario(request_rate=2.0))
    assert m.failure_kind == "invalid_config" and "mode='serve'" in (m.failure_reason or "")


# --- aggregation ----------------------------------------------------------------------------------------------


def test_sum_counters_pads_positions() -> None:
    total = sum_counters([SpecCounters(2, 6, 3, [2, 1, 0]), SpecCounters(1, 2, 1, [1])])
    assert total == SpecCounters(3, 8, 4, [3, 1, 0])


# --- requests, command line, environment ----------------------------------------------------------------------


def test_select_requests_groups_by_class_and_cycles() -> None:
    a1, a2, b1 = (WorkloadRequest(prompt=p) for p in ("a1", "a2", "b1"))
    w = Workload("w", {"a": (a1, a2), "b": (b1,), "empty": ()})
    assert select_requests(w, None) == {"a": [a1, a2], "b": [b1]}
    # requests() interleaves classes: a1, b1, a2; four prompts wrap around to a1.
    assert select_requests(w, 4) == {"a": [a1, a2, a1], "b": [b1]}
    assert select_requests(w, 1) == {"a": [a1]}


def test_detect_environment_reads_versions_from_metadata() -> None:
    env = detect_environment()
    assert set(env) >= {"device", "gpu_count", "driver", "vllm_version", "torch_version"}
    if env["gpu_count"] == 0:
        assert env["device"] == "cpu" and env["driver"] is None
    torch_version = package_version("torch")
    assert env["torch_version"] == torch_version
    if vllm_available():
        dists = importlib.metadata.packages_distributions()["vllm"]
        assert env["vllm_version"] == importlib.metadata.version(dists[0])


def test_importing_the_backend_does_not_import_vllm_or_torch() -> None:
    code = (
        "import sys, autotune.backends.vllm, autotune.environment;"
        "autotune.environment.detect_environment();"
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
