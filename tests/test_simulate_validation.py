"""benchmarks/validate_simulate.py: the comparison logic on a synthetic bundle, and (opt-in, slow) the real run."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autotune.simulate import FittedStepCost, Phase, SimRequest, profile_setup, simulate
from autotune.workloads import load_workload
from policies import StepCostModel
from policies.plugin import PluginStats

REPO = Path(__file__).resolve().parent.parent


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"benchmarks.{name}")


COST = StepCostModel({"base": 4.0, "per_request": 0.3, "per_verified_token": 0.12, "drafter_fixed": 2.5,
                      "drafter_per_request": 0.2})
PROFILE = {
    "id": 1, "model": "target", "drafter": "drafter-2l", "max_k": 4, "parallel_drafting": True,
    "acceptance": {"predictable": {"num_drafts": 1000, "accepted_per_position": [984, 909, 898, 878]},
                   "entropic": {"num_drafts": 1000, "accepted_per_position": [247, 0, 0, 0]}},
    "cost_model": COST.to_dict(),
}
SLOWER = 1.1  # the 'measured' engine runs every step 10% slower than the profile's fit


def _synthetic_bundle(validate: ModuleType) -> dict[str, Any]:
    """A bundle whose 'measured' runs are the simulator itself with every step SLOWER times the profile's fit."""
    bench = _module("bench_runtime")
    workloads = bench.build_workloads(load_workload(REPO / "examples" / "workloads" / "fixture.jsonl"), 1)
    phases = validate.bundle_phases(workloads, None)
    setup = profile_setup(PROFILE, phases)
    configs = {"no speculation": {"kind": "none"}, "static K=2": {"kind": "static", "k": 2},
               "vLLM schedule": {"kind": "schedule", "entries": [[1, 4, 4], [5, 8, 2]]}}
    runs: dict[str, list[dict[str, Any]]] = {}
    for label, meta in configs.items():
        result: dict[str, Any] = {}
        for name, ph in phases.items():
            cost = FittedStepCost(StepCostModel({k: v * SLOWER for k, v in COST.coefficients.items()}))
            run = simulate(ph, validate._sim_config(meta, setup), cost, setup.acceptance, concurrency=8,
                           max_num_seqs=8)
            result[f"c8:{name}"] = [
                {"phase": p.name, "wall_s": (end - start) / 1000.0, "output_tokens": tok,
                 "outputs": [[0] * r.output_tokens for r in p.requests]}
                for p, (start, end, tok) in zip(ph, run.phase_spans, strict=True)
            ]
        runs[label] = [result]
    return {"date": "synthetic", "load_average": {"before": "0.00", "after": "0.00"}, "concurrencies": [8],
            "max_k": 4, "c1_requests": 12, "profile": PROFILE, "traces": [], "workloads": workloads,
            "configs": configs, "runs": runs}


def test_comparison_recovers_the_step_time_scale_and_reports_every_config() -> None:
    validate = _module("validate_simulate")
    lines, rows = validate.compare(_synthetic_bundle(validate), prefix_cache_block=None)  # measured without one
    assert f"step-time scale fitted on no speculation alone: {SLOWER:.3f}" in "\n".join(lines)
    assert {(r["config"], r["workload"]) for r in rows} == {
        (c, w) for c in ("no speculation", "static K=2", "vLLM schedule") for w in ("shifting", "stationary")}
    for r in rows:
        assert abs(r["error"]) < 0.005, r
        assert r["error_raw"] == pytest.approx(SLOWER - 1.0, abs=0.005)  # unscaled, the simulator is 10% fast
    assert lines[-1].startswith("Scaled: 4 of 4 configs other than no speculation within 10%")
    assert "every config within 10%: met" in lines[-1]
    assert any(line.startswith("Fit as is: ") and "of 4 configs" in line for line in lines)


@pytest.mark.vllm
@pytest.mark.skipif(os.environ.get("PEAGLE_VALIDATE_SIMULATE") != "1",
                    reason="~30 min of engine runs on a quiet machine: set PEAGLE_VALIDATE_SIMULATE=1")
def test_simulated_tokens_per_s_within_10_percent_of_measured(tmp_path: Path) -> None:
    validate = _module("validate_simulate")
    bundle = tmp_path / "bundle.json"
    assert validate.main(["--engine", "--bundle", str(bundle), "--rounds", "3", "--workdir", str(tmp_path)]) == 0
    import json

    _, rows = validate.compare(json.loads(bundle.read_text()))
    assert all(r["measured"] is not None for r in rows)
    assert max(abs(r["error"]) for r in rows) <= 0.10, rows


def test_bundle_takes_each_adaptive_runs_plugin_time_per_step(tmp_path: Path) -> None:
    import json

    validate = _module("validate_simulate")
    configs = {"no speculation": {"kind": "none"}, "adaptive (new)": {"kind": "adaptive", "drafter_width": True},
               "adaptive, trimming only": {"kind": "adaptive", "drafter_width": False}}
    bench = {"date": "d", "load_before": "0", "load_after": "0", "concurrencies": [8], "max_k": 4, "c1_requests": 12,
             "workloads": {}, "configs": configs}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "profile.json").write_text(json.dumps(PROFILE))
    (tmp_path / "rounds.json").write_text("{}")
    (tmp_path / "adaptive-new-stats.json").write_text(json.dumps(
        {"steps": 400, "overhead_ms": 126.0, "info": {"drafter_width": {"off_steps": "catch_up"}}}))
    bundle = validate.bundle_from_runtime(tmp_path)
    # 126 ms over 400 steps; the trimming run wrote no statistics, so it gets none (priced 0).
    assert bundle["plugin_host_time"] == {"adaptive (new)": {"overhead_ms": 126.0, "steps": 400, "ms_per_step": 0.315,
                                                             "source": "adaptive-new-stats.json"}}
    assert bundle["model_configs"] == {"target": None, "drafter": None}  # PROFILE names no local directories
    assert bundle["off_steps"] == {"adaptive (new)": "catch_up"}  # what the workers agreed on, drafter width only


def test_profile_setup_takes_the_off_step_mode_of_the_profiles_drafter() -> None:
    phases = {"w": [Phase("p", (SimRequest(0, "predictable", 10, 20),))]}
    assert profile_setup({**PROFILE, "method": "draft_model"}, phases).off_steps == "catch_up"  # token-only
    assert profile_setup({**PROFILE, "method": "eagle3"}, phases).off_steps == "sync_pass"
    assert profile_setup(PROFILE, phases, off_steps="holes").off_steps == "holes"  # as an engine recorded it


def _means(model: StepCostModel) -> dict[str, list[dict[str, Any]]]:
    """Per-shape means as bundle_from_runtime stores them, exact for ``model`` (speculative and baseline launch)."""
    def sample(b: int, k: int, ran: bool) -> dict[str, Any]:
        return {"batch_size": b, "depth": k, "step_ms": model.predict_tokens(b, b * (k + 1), ran, k), "n": 20,
                "verified_tokens": b * (k + 1), "drafter_ran": ran}

    return {"speculative": [sample(b, k, True) for b in (1, 2, 4, 8) for k in range(5)],
            "baseline": [sample(b, 0, False) for b in (1, 4, 8)]}


def test_steps_are_priced_at_the_profile_launches_means_when_the_bundle_has_them() -> None:
    validate = _module("validate_simulate")
    bundle = _synthetic_bundle(validate)
    # The profile's launches ran each shape 10% slower on average than its (median) fit says: priced at the means,
    # the simulator matches the 'measured' runs as is; the stored fit alone (--fit-only) stays 10% fast.
    bundle["step_means"] = _means(StepCostModel({k: v * SLOWER for k, v in COST.coefficients.items()}))
    profile, note = validate.priced_profile(bundle)
    assert StepCostModel.from_dict(profile["cost_model"]).predict_tokens(2, 6, True, 2) == pytest.approx(
        SLOWER * COST.predict_tokens(2, 6, True, 2), rel=1e-6)
    assert "per-shape means" in note and bundle["profile"] is PROFILE  # the stored profile is left as it is
    _, rows = validate.compare(bundle, prefix_cache_block=None)  # the synthetic runs were measured without one
    assert all(abs(r["error_raw"]) < 0.005 for r in rows), rows
    _, fit_only = validate.compare(bundle, terms=False, prefix_cache_block=None)
    assert all(r["error_raw"] == pytest.approx(SLOWER - 1.0, abs=0.005) for r in fit_only)
    assert validate.priced_profile({"profile": PROFILE})[0] == PROFILE  # no means recorded: the fit as stored


def test_bundle_collects_the_profile_launches_per_shape_means(tmp_path: Path) -> None:
    import json

    validate = _module("validate_simulate")
    bench = {"date": "d", "load_before": "0", "load_after": "0", "concurrencies": [1], "max_k": 4, "c1_requests": 12,
             "workloads": {}, "configs": {"no speculation": {"kind": "none"}}}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "profile.json").write_text(json.dumps({**PROFILE, "phases": [{"name": "c1"}]}))
    (tmp_path / "rounds.json").write_text("{}")

    def launch(name: str, k: int, steps: list[tuple[str, int, float]]) -> None:
        """A profile launch's plugin-stats.json: per step (phase, verified depth, ms) of one request."""
        stats = PluginStats()
        stats.info = {"num_speculative_tokens": k, "drafter_width": {"skip_drafter": True}}
        for phase, d, ms in steps:
            stats.observe_step(step_ms=ms, prompt_tokens=0, drafting_depth=d, requests=[("a", phase, d, 0)])
        (tmp_path / "profile" / name).mkdir(parents=True)
        stats.save(tmp_path / "profile" / name / "plugin-stats.json")

    # 4 steps, 22 ms: mean 5.5 (median 5.25); the warm-up step is left out
    launch("run-a", 4, [("c1", 1, 5.0), ("c1", 1, 5.0), ("c1", 1, 5.5), ("c1", 1, 6.5), ("warmup", 1, 90.0)])
    launch("run-b", 0, [("c1", 0, 3.0)] * 5 + [("c1", 0, 3.6)] * 5)  # no speculation: 33 ms / 10 steps = 3.3 ms
    means = validate.bundle_from_runtime(tmp_path)["step_means"]
    assert [(x["depth"], x["n"], x["drafter_ran"]) for x in means["speculative"]] == [(1, 4, True)]
    assert means["speculative"][0]["step_ms"] == pytest.approx(5.5)
    assert [(x["step_ms"], x["drafter_ran"]) for x in means["baseline"]] == [(pytest.approx(3.3), False)]


def test_the_prefix_cache_holds_what_the_round_ran_before_in_either_order() -> None:
    validate = _module("validate_simulate")
    prompt = {n: [[{"prompt": f"{n}{p}{i}"} for i in range(3)] for p in range(2)] for n in ("shifting", "stationary")}
    bundle = {"concurrencies": [8, 1], "workloads": prompt, "c1_requests": 1}
    caches = validate.round_caches(bundle)
    key = validate._prompt_key

    def ran(name: str, c: int) -> set[str]:
        return {key(r["prompt"]) for phase in prompt[name] for r in phase[: 1 if c == 1 else None]}

    # Even rounds: c=8 shifting, c=8 stationary, c=1 shifting, c=1 stationary; odd rounds the reverse.
    assert caches[(8, "shifting")] == [set(), ran("stationary", 1) | ran("shifting", 1) | ran("stationary", 8)]
    assert caches[(1, "stationary")] == [ran("shifting", 8) | ran("stationary", 8) | ran("shifting", 1), set()]
    assert caches[(1, "shifting")][1] == ran("stationary", 1)
