"""`peagle-tune simulate`: labelled PREDICTED with GPU, model, acceptance and cost sources; JSON; 80 columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.cli.simulate import simulate

SMALL = ["--model", "gpt-oss-120b", "--gpu", "h200", "--workload", "mixed", "--classes", "chat,code",
         "--concurrency", "1,4", "--requests-per-phase", "4", "--output-tokens", "24", "--static-k", "2,4",
         "--no-store"]


def test_table_is_labelled_predicted_names_its_sources_and_fits_80_columns() -> None:
    result = CliRunner().invoke(simulate, [*SMALL, "--verbose"])  # every config (the default is a summary)
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


def test_simulates_a_stored_profile(tmp_path: Path) -> None:
    # A measured profile in the store (fixture-like: predictable accepts almost everything, entropic almost nothing)
    # drives the simulation; the device comes from the profile's environment.
    from policies import StepCostModel
    from store import Store

    db = tmp_path / "peagle.db"
    store = Store(f"sqlite:///{db}")
    env = store.environment_id({"device": "cpu", "gpu_count": 0, "driver": None, "vllm_version": "0.32.0",
                                "torch_version": "2.13.0"})
    cost = StepCostModel({"base": 4.0, "per_request": 0.3, "per_verified_token": 0.12, "drafter_fixed": 2.5})
    pid = store.add_profile(
        "target", method="draft_model", max_k=4, environment_id=env, drafter="drafter-2l", parallel_drafting=True,
        acceptance={"predictable": {"num_drafts": 500, "accepted_per_position": [490, 455, 449, 439]},
                    "entropic": {"num_drafts": 500, "accepted_per_position": [123, 0, 0, 0]}},
        step_costs=[], cost_model=cost.to_dict(),
    )
    store.close()
    workload = Path(__file__).resolve().parent.parent / "examples" / "workloads" / "fixture.jsonl"
    result = CliRunner().invoke(simulate, ["--profile", str(pid), "--db", str(db), "--workload", str(workload),
                                           "--chars-per-token", "1", "--concurrency", "4", "--requests-per-phase", "8",
                                           "--shape", "shifting", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["device"] == "cpu"
    assert f"measured profile #{pid}" in data["acceptance_source"]
    assert "fitted step-cost model" in data["step_cost_source"]
    assert "fit on per-shape medians" in data["step_cost_source"]  # stored without per-shape means: the stored fit
    rows = {r["config"]: r for r in data["rows"]}
    none, k4, k1 = rows["no speculation"], rows["static K=4"], rows["static K=1"]
    # A wave of 4 requests (~100 prompt tokens, 48 output tokens each) at B=4. No speculation: ~55 ms of prefill
    # (400 prompt tokens x 0.12 ms + base) then 47 steps of 4 + 1.2 + 0.48 = 5.68 ms: ~322 ms. Predictable at K=4:
    # the same prefill (+ 2.5 ms drafter) then ~10.5 steps (AL 4.67) of 4 + 1.2 + 2.4 + 2.5 = 10.1 ms: ~163 ms, so
    # ~2.0x. Entropic at K=1: AL 1.25 for 8.66 ms per step, 6.9 ms per token against 5.68: slower.
    phases = data["settings"]["workloads"]["shifting"]  # one phase per class (sorted), then mixed
    pred, ent = phases.index("predictable"), phases.index("entropic")
    assert k4["phase_tokens_per_s"][pred] > 1.8 * none["phase_tokens_per_s"][pred]
    assert k1["phase_tokens_per_s"][ent] < none["phase_tokens_per_s"][ent]


def test_a_stored_profile_with_per_shape_means_is_priced_at_their_refit(tmp_path: Path) -> None:
    # Two stored profiles: A keeps the fit on medians (every coefficient / 1.1) and per-shape means that follow
    # `means` exactly; B's stored fit is `means` itself, without means. Simulated from A, every step costs what the
    # refit on A's means prices, i.e. `means`: the configs whose depths do not come from the controller (which
    # starts from the stored fit, as in production) simulate exactly as from B.
    from policies import StepCostModel
    from store import Store

    means = StepCostModel({"base": 4.0, "per_request": 0.3, "per_verified_token": 0.12, "drafter_fixed": 2.5,
                           "drafter_per_request": 0.2})
    medians = StepCostModel({k: v / 1.1 for k, v in means.coefficients.items()})

    def sample(b: int, k: int, ran: bool) -> dict[str, object]:
        return {"batch_size": b, "depth": k, "step_ms": means.predict_tokens(b, b * (k + 1), ran, k), "n": 20,
                "verified_tokens": b * (k + 1), "drafter_ran": ran}

    step_means = {"speculative": [sample(b, k, True) for b in (1, 2, 4) for k in range(5)],
                  "baseline": [sample(b, 0, False) for b in (1, 2, 4)]}
    db = tmp_path / "peagle.db"
    store = Store(f"sqlite:///{db}")
    env = store.environment_id({"device": "cpu", "gpu_count": 0, "driver": None, "vllm_version": "0.32.0",
                                "torch_version": "2.13.0"})
    common: dict[str, Any] = {
        "method": "draft_model", "max_k": 4, "environment_id": env, "drafter": "drafter-2l", "parallel_drafting": True,
        "step_costs": [],
        "acceptance": {"predictable": {"num_drafts": 500, "accepted_per_position": [490, 455, 449, 439]},
                       "entropic": {"num_drafts": 500, "accepted_per_position": [123, 0, 0, 0]}},
    }
    with_means = store.add_profile("target", cost_model=medians.to_dict(), notes={"step_means": step_means}, **common)
    refit = store.add_profile("target", cost_model=means.to_dict(), **common)
    store.close()
    workload = Path(__file__).resolve().parent.parent / "examples" / "workloads" / "fixture.jsonl"

    def run(pid: int) -> Any:
        result = CliRunner().invoke(simulate, [
            "--profile", str(pid), "--db", str(db), "--workload", str(workload), "--chars-per-token", "1",
            "--concurrency", "4", "--requests-per-phase", "8", "--shape", "shifting", "--configs", "none,static",
            "--json", "--no-store"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    a, b = run(with_means), run(refit)
    assert "fit on per-shape means" in a["step_cost_source"]
    assert "fit on per-shape medians" in b["step_cost_source"]
    rows_a = {r["config"]: r["output_tokens_per_s"] for r in a["rows"]}
    rows_b = {r["config"]: r["output_tokens_per_s"] for r in b["rows"]}
    assert rows_a.keys() == rows_b.keys() and len(rows_a) == 6  # no speculation, static K = 1..4, their oracle
    for config, tps in rows_b.items():
        assert rows_a[config] == pytest.approx(tps, rel=1e-6), config
