"""Which vLLM variant a launch runs (model runner, CUDA-graph mode, async scheduling), predicted without vLLM, and
recorded in every measured provenance; launches that install the plugin pin the V1 model runner.

The GPU cases are plain data (no GPU here); the prediction of V2's unsupported features is checked against vLLM's
own list on real configs of the fixture models, and the CPU prediction against the config vLLM builds here.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from autotune.engine import EngineOptions, measured_provenance, plugin_async_scheduling, predict_variant
from autotune.errors import ConfigError
from autotune.measurement import Provenance
from autotune.profiling._plugin_run import plugin_provenance
from autotune.spec import SpecConfig
from policies.plugin import engine_kwargs
from policies.plugin.config import engine_env

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
P_EAGLE = {"method": "eagle3", "model": "amazon/gpt-oss-120b-p-eagle", "num_speculative_tokens": 5,
           "parallel_drafting": True}
EAGLE3 = {"method": "eagle3", "model": "nvidia/gpt-oss-120b-Eagle3", "num_speculative_tokens": 3}


def gpu(args: dict[str, Any], env: dict[str, str] | None = None, triton: bool = True) -> Any:
    return predict_variant(args, env or {}, device="cuda", triton=triton)


def test_on_a_gpu_p_eagle_runs_v1_and_eagle3_without_parallel_drafting_runs_v2() -> None:
    p_eagle = gpu({"speculative_config": P_EAGLE})
    assert (p_eagle.model_runner, p_eagle.cudagraph_mode, p_eagle.async_scheduling) == (
        "v1", "FULL_AND_PIECEWISE", True)
    assert "parallel drafting" in p_eagle.runner_reason
    eagle3 = gpu({"speculative_config": EAGLE3})
    assert (eagle3.model_runner, eagle3.cudagraph_mode, eagle3.async_scheduling) == ("v2", "FULL_AND_PIECEWISE", True)
    assert gpu({"speculative_config": EAGLE3}, triton=False).model_runner == "v1"  # V2 needs Triton
    assert gpu({}).model_runner == "v2"  # no speculation: nothing V2 lacks


def test_the_environment_variable_decides_first() -> None:
    pinned = gpu({"speculative_config": EAGLE3}, {"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert pinned.model_runner == "v1" and "VLLM_USE_V2_MODEL_RUNNER=0" in pinned.runner_reason
    forced = gpu({"speculative_config": P_EAGLE}, {"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert forced.model_runner == "v2"  # vLLM then refuses parallel drafting at start-up; the variable still wins
    assert "refuses" in gpu({}, {"VLLM_USE_V2_MODEL_RUNNER": "1"}, triton=False).runner_reason
    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER='yes' is not an integer"):
        gpu({}, {"VLLM_USE_V2_MODEL_RUNNER": "yes"})


def test_cuda_graphs_follow_eager_mode_explicit_modes_and_the_batch_size_schedule() -> None:
    assert gpu({"speculative_config": P_EAGLE, "enforce_eager": True}).cudagraph_mode == "NONE"
    assert gpu({"compilation_config": {"cudagraph_mode": "piecewise"}}).cudagraph_mode == "PIECEWISE"
    assert gpu({"optimization_level": 0}).cudagraph_mode == "NONE"
    schedule = {**P_EAGLE, "num_speculative_tokens_per_batch_size": [[1, 5], [64, 2]]}
    assert gpu({"speculative_config": schedule}).cudagraph_mode == "PIECEWISE"  # V1 drops full graphs (DESIGN.md)
    on_v2 = {**EAGLE3, "num_speculative_tokens_per_batch_size": [[1, 3], [64, 1]]}
    assert gpu({"speculative_config": on_v2}).cudagraph_mode == "FULL_AND_PIECEWISE"  # V2 keeps them


def test_on_the_cpu_build_everything_runs_v1_eagerly_and_synchronously() -> None:
    variant = predict_variant({"speculative_config": EAGLE3, "async_scheduling": True}, {}, device="cpu",
                              triton=False)
    assert (variant.model_runner, variant.cudagraph_mode, variant.async_scheduling, variant.device) == (
        "v1", "NONE", False, "cpu")
    assert variant.to_dict()["runner_reason"].startswith("CPU build")


def test_launches_that_install_the_plugin_pin_v1_so_the_drafter_width_patch_can_install() -> None:
    args = {"speculative_config": EAGLE3, **engine_kwargs(async_scheduling=False)}
    variant = gpu(args, engine_env())
    assert (variant.model_runner, variant.async_scheduling) == ("v1", False)
    assert variant.deployment == "peagle-tune serve (sync, V1)"


def test_plugin_launches_schedule_async_where_vllm_would_and_sync_on_request() -> None:
    # vLLM's own choice for the launch (vllm/config/vllm.py:1585-1644): async on a GPU, off on the CPU build.
    assert plugin_async_scheduling({"speculative_config": P_EAGLE}, {}, device="cuda", triton=True) is True
    assert plugin_async_scheduling({"speculative_config": P_EAGLE}, {}, device="cpu", triton=False) is False
    # The override: a user forcing synchronous scheduling (step costs that do not overlap).
    forced = {"speculative_config": P_EAGLE, "async_scheduling": False}
    assert plugin_async_scheduling(forced, {}, device="cuda", triton=True) is False
    # Where vLLM itself turns async off, the plugin follows: pipeline parallelism on V1 (the plugin pins V1), and
    # a drafter batch without padding.
    assert plugin_async_scheduling({"pipeline_parallel_size": 2}, {}, device="cuda", triton=True) is False
    unpadded = {**P_EAGLE, "disable_padded_drafter_batch": True}
    assert plugin_async_scheduling({"speculative_config": unpadded}, {}, device="cuda", triton=True) is False
    # The plugin's own arguments do not change vLLM's choice; installed, they name the plugin's deployment.
    args = {"speculative_config": EAGLE3, **engine_kwargs(async_scheduling=True)}
    assert plugin_async_scheduling(args, {}, device="cuda", triton=True) is True
    on_gpu = gpu(args, engine_env())
    assert on_gpu.deployment == "peagle-tune serve (async, V1)"
    assert gpu({"speculative_config": EAGLE3}).deployment == "vllm serve (async, V2)"  # plain: vLLM's V2 runner


def test_peagle_tune_serve_pins_v1_in_the_engine_environment(tmp_path: Path) -> None:
    from test_serve_launch import MODEL, add_recommendation

    from autotune.serving import build_launch, resolve_tuned_config
    from store import Store

    with Store(f"sqlite:///{tmp_path / 'peagle.db'}") as store:
        add_recommendation(store)
        tuned = resolve_tuned_config(store, MODEL, device="cpu")
    launch = build_launch(tuned, run_dir=tmp_path / "run")
    assert launch.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in launch.describe()  # what --dry-run shows


def test_provenance_records_the_variant_and_old_rows_still_load() -> None:
    old = {"kind": "measured", "backend": "vllm", "device": "NVIDIA H200", "vllm_version": "0.16.0",
           "torch_version": "2.9.0", "profile": None, "date": "2026-01-02T03:04:05+00:00"}
    loaded = Provenance.from_dict(old)
    assert loaded.model_runner is None and loaded.cudagraph_mode is None and loaded.async_scheduling is None
    assert loaded.describe() == "measured on NVIDIA H200 (vLLM 0.16.0, 2026-01-02)"

    options = EngineOptions(engine_extra={"enforce_eager": True})
    args = options.llm_kwargs(SpecConfig("draft_model", "some/drafter", 3, True))
    recorded = measured_provenance(args, options.process_env())
    assert Provenance.from_dict(recorded.to_dict()) == recorded
    assert (recorded.model_runner, recorded.cudagraph_mode) == ("v1", "NONE")  # this machine: the CPU build or no GPU
    assert recorded.deployment == "vllm serve (sync, V1)"  # a plain launch on this machine
    assert "in vllm serve (sync, V1)" in recorded.describe()
    # What a profile records for its plugin launch: the plugin's deployment, scheduling as vLLM does here (sync).
    plugin = plugin_provenance(args, options)
    assert (plugin.async_scheduling, plugin.deployment) == (False, "peagle-tune serve (sync, V1)")
    assert loaded.deployment is None  # old rows: not recorded


requires_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def _vllm_config(spec: dict[str, Any] | None, **args: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(MODELS / "target"), dtype="float32", max_model_len=256, enforce_eager=True,
                      speculative_config=spec, **args).create_engine_config()


@requires_vllm
@pytest.mark.parametrize("parallel", [True, False])
def test_the_v2_features_we_mirror_agree_with_vllms_own_list(parallel: bool) -> None:
    spec = {"method": "draft_model", "model": str(MODELS / "drafter-1l"), "num_speculative_tokens": 3,
            "parallel_drafting": parallel}
    config = _vllm_config(spec)
    vllm_says_v1 = bool(config._get_v2_model_runner_unsupported_features())
    assert vllm_says_v1 is parallel
    assert gpu({"speculative_config": spec}).model_runner == ("v1" if vllm_says_v1 else "v2")


@requires_vllm
def test_the_cpu_prediction_is_the_config_vllm_builds_here() -> None:
    spec = {"method": "draft_model", "model": str(MODELS / "drafter-1l"), "num_speculative_tokens": 3}
    config = _vllm_config(spec)
    variant = predict_variant({"speculative_config": spec, "enforce_eager": True})
    assert variant.model_runner == ("v2" if config.use_v2_model_runner else "v1") == "v1"
    assert variant.cudagraph_mode == config.compilation_config.cudagraph_mode.name
    assert variant.async_scheduling is bool(config.scheduler_config.async_scheduling)
