"""`peagle-tune simulate`: labelled PREDICTED with GPU, model, acceptance and cost sources; JSON; 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from autotune.cli.simulate import simulate

SMALL = ["--model", "gpt-oss-120b", "--gpu", "h200", "--classes", "chat,code", "--concurrency", "1,4",
         "--requests-per-phase", "4", "--output-tokens", "24", "--static-k", "2,4"]


def test_table_is_labelled_predicted_names_its_sources_and_fits_80_columns() -> None:
    result = CliRunner().invoke(simulate, SMALL)
    assert result.exit_code == 0, result.output
    out = result.stdout  # progress lines go to stderr
    assert out.startswith("PREDICTED")
    for needed in ("H200", "openai/gpt-oss-120b", "amazon/gpt-oss-120b-p-eagle", "published AL", "i.i.d.",
                   "model backend", "no speculation", "static K=2", "vLLM schedule", "adaptive (trim)",
                   "adaptive (drafter width)", "per-phase oracle", "shifting, c=1", "stationary, c=4"):
        assert needed in out, needed
    assert max(len(line) for line in out.splitlines()) <= 80


def test_json_carries_provenance_and_one_row_per_config() -> None:
    result = CliRunner().invoke(simulate, [*SMALL, "--shape", "shifting", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["label"] == "PREDICTED"
    assert data["provenance"]["kind"] == "predicted"
    assert "H200" in data["provenance"]["device"]
    assert "acceptance:" in data["provenance"]["profile"] and "step cost:" in data["provenance"]["profile"]
    kinds = [r["kind"] for r in data["rows"] if r["concurrency"] == 1]
    assert kinds == ["none", "static", "static", "schedule", "adaptive", "adaptive", "oracle"]
    none = next(r for r in data["rows"] if r["kind"] == "none" and r["concurrency"] == 4)
    assert none["speedup_vs_no_spec"] == 1.0
    # Conservation: every row serves every requested token (3 phases x 4 requests x 24 tokens).
    assert {r["output_tokens"] for r in data["rows"]} == {3 * 4 * 24}


def test_policy_file_settings_reach_the_controller(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nstatic_k: 3\nmax_k: 8\ncontroller: {hysteresis: 0.1, explore_every: 0}\n")
    result = CliRunner().invoke(simulate, [*SMALL, "--configs", "none,adaptive", "--policy", str(policy), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["settings"]["controller"]["hysteresis"] == 0.1


def test_usage_errors() -> None:
    runner = CliRunner()
    result = runner.invoke(simulate, ["--gpu", "h200"])
    assert result.exit_code == 2 and "--model" in result.output
    result = runner.invoke(simulate, [*SMALL, "--shape", "sideways"])
    assert result.exit_code == 2 and "shifting" in result.output
    result = runner.invoke(simulate, [*SMALL, "--autocorrelation", "auto"])
    assert result.exit_code == 2 and "--traces" in result.output
