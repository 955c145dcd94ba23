"""`peagle-tune search` through click's CliRunner (plus one console-script smoke test): JSON on stdout, objectives
and SLOs, strategies, space options and files, resumption, hypothetical drafters, usage errors (exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from autotune.cli import main

BASE = ["search", "--model", "gpt-oss-120b", "--backend", "model", "--gpu", "h200"]


def invoke(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(main, [*BASE, "--db", str(tmp_path / "peagle.db"), *args])


def as_json(result: Result) -> dict[str, Any]:
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_json_is_the_only_thing_on_stdout(tmp_path: Path) -> None:
    result = invoke(tmp_path, "--concurrency", "1,8", "--max-k", "3", "--json")
    assert result.exit_code == 0, result.output
    doc = as_json(result)
    assert [s["concurrency"] for s in doc["scenarios"]] == [1, 8]
    for s in doc["scenarios"]:
        assert s["feasible"] and s["recommendation_id"] is not None
        assert s["best_config"]["num_speculative_tokens"] <= 3
        assert s["provenance"]["kind"] == "predicted"
        assert s["trials"]["finished"] == s["trials"]["complete"] > 0
    assert doc["objective"]["name"] == "throughput"
    assert "Backend: model" in result.stderr  # the notes and progress go to stderr


def test_goodput_with_an_slo_and_policy_export(tmp_path: Path) -> None:
    # First the unconstrained best at concurrency 64, then an SLO just below its TPOT p99: it must be excluded.
    free = as_json(invoke(tmp_path, "--concurrency", "64", "--strategy", "grid", "--json"))["scenarios"][0]
    slo = free["metrics"]["tpot_ms_p99"] * 0.99
    result = invoke(
        tmp_path, "--concurrency", "64", "--strategy", "grid", "--objective", "goodput", "--slo-tpot-p99", f"{slo}",
        "--json",
    )
    assert result.exit_code == 0, result.output
    scenario = as_json(result)["scenarios"][0]
    assert scenario["metrics"]["tpot_ms_p99"] <= slo
    assert scenario["best_config"] != free["best_config"]
    assert "among configs meeting TPOT p99" in scenario["rule"]

    from policies import load_policy

    out = tmp_path / "policy.yaml"
    # Two searches are stored (throughput, goodput under the SLO): export lists them and asks which ...
    args = ["export", "--format", "policy", "--db", str(tmp_path / "peagle.db"), "--out", str(out)]
    ambiguous = CliRunner().invoke(main, args)
    assert ambiguous.exit_code == 2 and "--objective" in ambiguous.output
    # ... and --objective goodput picks the SLO run.
    exported = CliRunner().invoke(main, [*args, "--objective", "goodput"])
    assert exported.exit_code == 0, exported.output
    assert load_policy(out).static_k == scenario["best_config"]["num_speculative_tokens"]


def test_unmeetable_slo_exits_1_and_recommends_nothing(tmp_path: Path) -> None:
    result = invoke(tmp_path, "--concurrency", "8", "--max-k", "2", "--objective", "goodput",
                    "--slo-tpot-p99", "0.01", "--json")
    assert result.exit_code == 1
    assert "No config met the SLOs at c=8" in result.stderr
    scenario = json.loads(result.stdout)["scenarios"][0]
    assert scenario["feasible"] is False and scenario["recommendation_id"] is None
    assert json.loads(result.stdout)["warnings"] == [{"concurrency": 8, "message": "no config met the SLOs; nothing "
                                                      "was recommended at this concurrency"}]


def test_slo_met_at_some_concurrencies_exits_0_with_a_warning(tmp_path: Path) -> None:
    """TPOT p99 <= 5 ms with max_num_seqs fixed at 64: c=1 meets it (about 2.3 ms predicted on an H200), c=64 cannot
    (about 14 ms: 64 sequences per step, no smaller max_num_seqs to queue behind). c=1's recommendation is stored,
    so the search succeeds; c=64 is a warning line, and --json lists it."""
    args = ["--concurrency", "1,64", "--max-k", "3", "--max-num-seqs", "64", "--objective", "latency",
            "--slo-tpot-p99", "5"]
    table = invoke(tmp_path, *args)
    assert table.exit_code == 0, table.output
    assert "Warning: No config met the SLOs at c=64" in table.stderr
    assert "c=1" not in table.stderr.split("Warning:")[1].split(";")[0]
    doc = as_json(invoke(tmp_path, *args, "--json"))
    assert [w["concurrency"] for w in doc["warnings"]] == [64]
    feasible = {s["concurrency"]: s["recommendation_id"] is not None for s in doc["scenarios"]}
    assert feasible == {1: True, 64: False}


def test_pareto_front_in_table_and_json(tmp_path: Path) -> None:
    args = ["--concurrency", "64", "--max-num-seqs", "32,64", "--strategy", "grid", "--objective", "pareto"]
    table = invoke(tmp_path, *args)
    assert table.exit_code == 0, table.output
    assert "Pareto front" in table.output
    scenario = as_json(invoke(tmp_path, *args, "--json"))["scenarios"][0]
    front = scenario["pareto"]
    assert len(front) >= 2
    fastest = max(front, key=lambda p: p["metrics"]["output_tokens_per_s"])
    assert scenario["best_config"] == fastest["config"]


def test_grid_strategy_defaults_to_the_whole_grid_and_space_options_apply(tmp_path: Path) -> None:
    args = ["--concurrency", "16", "--strategy", "grid", "--k-min", "2", "--max-k", "4", "--max-num-seqs", "16",
            "--max-num-batched-tokens", "4096,8192", "--parallel-drafting", "on", "--drafter",
            "amazon/gpt-oss-120b-p-eagle", "--json"]
    scenario = as_json(invoke(tmp_path, *args))["scenarios"][0]
    # One P-EAGLE head (the catalog's EAGLE-3 heads have no mask token, so `on` would refuse them):
    # 2 max_num_batched_tokens x (1 baseline + 3 parallel K) = 8 configs, all measured.
    assert scenario["trials"]["finished"] == 8
    best = scenario["best_config"]
    assert 2 <= best["num_speculative_tokens"] <= 4 and best["parallel_drafting"] is True
    assert best["max_num_seqs"] == 16 and best["max_num_batched_tokens"] in (4096, 8192)


def test_space_file_with_command_line_override(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("k_max: 6\nmax_num_seqs: [4]\nparallel_drafting: off\n")
    scenario = as_json(invoke(tmp_path, "--concurrency", "4", "--space", str(space), "--max-k", "2", "--json"))
    best = scenario["scenarios"][0]["best_config"]
    assert best["max_num_seqs"] == 4 and best["num_speculative_tokens"] <= 2 and best["parallel_drafting"] is False


def test_rerun_with_the_same_study_resumes_it(tmp_path: Path) -> None:
    args = ["--concurrency", "8", "--max-k", "4", "--study", "mine", "--trials", "6"]
    first = invoke(tmp_path, *args)
    assert first.exit_code == 0, first.output
    second = invoke(tmp_path, *args)
    assert "Resuming study mine-c8: 6 of 6 trials already finished" in second.output


def test_hypothetical_drafter_is_labelled(tmp_path: Path) -> None:
    result = invoke(tmp_path, "--concurrency", "1", "--max-k", "3", "--drafter", "amazon/gpt-oss-120b-p-eagle:2-layer")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # rich wraps long lines at the terminal width
    assert "HYPOTHETICAL" in text and "no checkpoint exists" in text
    scenario = as_json(invoke(tmp_path, "--concurrency", "1", "--max-k", "3", "--include-hypothetical",
                              "--strategy", "grid", "--json"))["scenarios"][0]
    # With --include-hypothetical the grid holds both heads; whichever wins, the label follows the drafter.
    assert (scenario["hypothetical"] is not None) == scenario["best_config"]["drafter"].endswith(":2-layer")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--objective", "goodput"], "--slo-tpot-p99 MS and/or --slo-ttft-p99 MS"),
        (["--strategy", "model-guided"], "model-guided"),
        (["--strategy", "random", "--sampler", "gp"], "applies to --strategy blackbox only"),
        (["--k-min", "5", "--max-k", "3"], "--k-min must be <= --max-k"),
        (["--max-k", "17"], "--max-k takes an integer from 1 to 16, but got 17."),
        (["--trials", "0"], "--trials takes an integer from 1 to 100,000, but got 0."),
        (["--slo-tpot-p99", "-3"], "--slo-tpot-p99 takes a number of milliseconds in (0, 3600000], but got -3."),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = invoke(tmp_path, "--concurrency", "1", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_space_file_names_the_file_and_key(tmp_path: Path) -> None:
    space = tmp_path / "space.json"
    space.write_text('{"max_num_seqs": [8], "max_k": 4}')
    result = invoke(tmp_path, "--space", str(space))
    assert result.exit_code == 2
    assert f"{space}: unknown key(s) ['max_k']" in result.output


def test_console_script_smoke(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "peagle-tune"
    proc = subprocess.run(
        [str(script), *BASE, "--db", str(tmp_path / "peagle.db"), "--concurrency", "8", "--max-k", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["scenarios"][0]["concurrency"] == 8
    assert "Backend: model" in proc.stderr
