"""Profile analysis without an engine: acceptance at full depth, phase totals, the vLLM cross-check, the predictor
from a stored profile, argument checks and the CLI's help."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli.profile import profile as profile_command
from autotune.engine import safe_draft_model_path
from autotune.engine._drafters import hijacking_substring
from autotune.errors import ConfigError
from autotune.profiling import (
    acceptance_per_class,
    metrics_check,
    phase_totals,
    predictor_from_profile,
    profile,
)
from autotune.workloads import Workload, WorkloadRequest
from policies import AcceptanceProfile, StepCostModel
from policies.plugin import PluginStats


def _stats() -> PluginStats:
    stats = PluginStats()
    # warm-up: must be ignored by everything measured
    stats.observe_step(step_ms=50.0, prompt_tokens=0, drafting_depth=3, requests=[("code", "warmup", 3, 3)])
    # measured, full depth 3: code accepts 3 and 1
    stats.observe_step(step_ms=6.0, prompt_tokens=0, drafting_depth=3,
                       requests=[("code", "c2", 3, 3), ("code", "c2", 3, 1)])
    # measured, trimmed to 1: code accepts 1, chat accepts 0
    stats.observe_step(step_ms=4.0, prompt_tokens=0, drafting_depth=3,
                       requests=[("code", "c2", 1, 1), ("chat", "c2", 1, 0)])
    return stats


def test_acceptance_uses_only_full_depth_steps_of_measured_phases() -> None:
    got = acceptance_per_class(_stats(), 3, ["c2"])
    # code at depth 3 in phase c2: drafts accepted 3 and 1 -> 2 drafts, positions [2, 1, 1].
    # chat never verified 3 drafts, so it has no full-depth profile.
    assert got == {"code": AcceptanceProfile(2, (2, 1, 1))}


def test_phase_totals_match_what_vllm_counts_over_the_same_phases() -> None:
    totals = phase_totals(_stats(), ["c2"])
    # 4 drafts: 3+3+1+1 = 8 draft tokens; accepted 3+1+1+0 = 5; per position [3, 1, 1].
    assert totals == {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 5,
                      "accepted_per_position": [3, 1, 1]}
    vllm_delta = {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 5, "accepted_per_position": [3, 1, 1]}
    assert metrics_check(totals, vllm_delta)["match"]
    # vLLM's vector may be longer (K_max positions) with zeros: still a match.
    assert metrics_check(totals, {**vllm_delta, "accepted_per_position": [3, 1, 1, 0]})["match"]
    assert not metrics_check(totals, {**vllm_delta, "num_drafts": 5})["match"]


def test_predictor_uses_the_stored_cost_model_or_refits_the_stored_samples() -> None:
    cost = StepCostModel({"base": 2.0, "per_verified_token": 0.5})
    record = {
        "id": 7,
        "acceptance": {"code": {"num_drafts": 10, "accepted_per_position": [8, 6]}},
        "cost_model": cost.to_dict(),
        "parallel_drafting": True,
        "step_costs": [],
    }
    acceptance, model = predictor_from_profile(record)
    assert acceptance == {"code": AcceptanceProfile(10, (8, 6))}
    # T(4, 2) = 2 + 0.5 * 4 * 3 = 8 ms with the drafter term at 0.
    assert model.predict(4, 2) == pytest.approx(8.0)
    # Without a stored fit: refit from samples that follow T = 1 + 0.25 V exactly.
    samples = [
        {"batch_size": b, "depth": k, "step_ms": 1.0 + 0.25 * b * (k + 1), "n": 3, "verified_tokens": b * (k + 1),
         "drafter_ran": True}
        for b in (1, 4, 16) for k in (0, 2, 4)
    ]
    _, refit = predictor_from_profile({**record, "cost_model": None, "step_costs": samples})
    assert refit.predict(8, 3, drafter_ran=True) == pytest.approx(1.0 + 0.25 * 32, rel=1e-6)


def test_predictor_errors_say_what_is_missing() -> None:
    with pytest.raises(ValueError, match="has no acceptance per class"):
        predictor_from_profile({"id": 3, "acceptance": {}})
    with pytest.raises(ValueError, match="needs at least 2"):
        predictor_from_profile({"id": 3, "acceptance": {"a": {"num_drafts": 1, "accepted_per_position": [1]}},
                                "step_costs": []})


def test_draft_model_paths_that_vllm_would_reinterpret_are_aliased(tmp_path: Path) -> None:
    # vLLM 0.32 turns method draft_model into "eagle" when the drafter path contains "eagle-" (as in a checkout
    # named peagle-tune); the engine gets a neutral symlink to the same directory instead.
    drafter = tmp_path / "peagle-tune" / "drafter"
    drafter.mkdir(parents=True)
    alias = safe_draft_model_path(str(drafter))
    assert hijacking_substring(alias) is None
    assert Path(alias).resolve() == drafter.resolve()
    plain = tmp_path / "models" / "drafter-1l"
    plain.mkdir(parents=True)
    assert safe_draft_model_path(str(plain)) == str(plain)


def test_invalid_arguments_fail_before_any_engine_starts(tmp_path: object) -> None:
    wl = Workload("w", {"a": (WorkloadRequest(prompt="x"),)})
    pytest.importorskip("vllm")
    with pytest.raises(ConfigError, match="max_k must be an integer in"):
        profile("m", ["d"], wl, max_k=0)
    with pytest.raises(ConfigError, match="concurrencies must be integers >= 1"):
        profile("m", ["d"], wl, concurrencies=[0, 4])
    with pytest.raises(ConfigError, match="at least one drafter"):
        profile("m", [], wl)
    with pytest.raises(ConfigError, match="has no requests"):
        profile("m", ["d"], Workload("empty", {}))


def test_cli_help_has_an_example() -> None:
    result = CliRunner().invoke(profile_command, ["--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output and "--drafter" in result.output and "--max-k" in result.output


def test_phases_alternate_concurrencies_and_keep_the_class_mix() -> None:
    from autotune.profiling._profile import _phase_requests

    wl = Workload("w", {"a": tuple(WorkloadRequest(prompt=f"a{i}") for i in range(3)),
                        "b": tuple(WorkloadRequest(prompt=f"b{i}") for i in range(3))})
    phases = _phase_requests(wl, [1, 4], num_prompts=6, rounds=2)
    # Two rounds of (c1, c4), each half of the 6 prompts per concurrency, so drifts of the machine hit both.
    assert [(p["name"], p["concurrency"], len(p["requests"])) for p in phases] == [
        ("c1", 1, 3), ("c4", 4, 3), ("c1", 1, 3), ("c4", 4, 3)
    ]
    # Classes interleaved as in Workload.requests(): a0 b0 a1 | b1 a2 b2.
    assert [r["prompt"] for p in phases[:3:2] for r in p["requests"]] == ["a0", "b0", "a1", "b1", "a2", "b2"]
    # Default size: the whole workload (6), but at least 8 requests per in-flight slot: max(6, 8) and max(6, 32).
    sizes = [len(p["requests"]) for p in _phase_requests(wl, [1, 4], num_prompts=None, rounds=1)]
    assert sizes == [8, 32]


def test_cli_prints_acceptance_step_costs_fit_and_launches_labelled_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.measurement import Provenance
    from autotune.profiling import ProfileResult
    from policies import StepSample

    samples = [StepSample(b, k, 2.0 + 0.5 * b * (k + 1), n=5, drafter_ran=True) for b in (1, 4) for k in range(3)]
    result = ProfileResult(
        model="m", drafter="/d", method="draft_model", parallel_drafting=True, max_k=2, concurrencies=(1, 4),
        provenance=Provenance(kind="measured", backend="vllm", device="cpu", vllm_version="0.32.0"),
        acceptance={"code": AcceptanceProfile(100, (80, 60))},
        step_samples=samples, cost_model=StepCostModel.fit(samples), metrics_check={"match": True},
        phases=[{"name": "c1", "concurrency": 1, "num_requests": 8, "output_tokens": 100, "wall_s": 1.0}],
        timings={"total_s": 30.0, "load_s": 12.0}, profile_id=3,
    )
    result.fit_error = result.cost_model.fit_error() if result.cost_model else None
    calls: list[dict[str, object]] = []

    def fake_profile(model: str, drafters: list[str], workload: Workload, **kwargs: object) -> list[ProfileResult]:
        calls.append({"drafters": drafters, **kwargs})
        return [result]

    monkeypatch.setattr("autotune.profiling.profile", fake_profile)
    monkeypatch.setattr("autotune.workloads.load_workload", lambda _w: Workload("w", {"code": ()}))
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps titles and cells at the terminal width
    out = CliRunner().invoke(
        profile_command,
        ["--model", "m", "--drafter", "/d", "--workload", "w.jsonl", "--concurrency", "1,4", "--max-k", "2",
         "--no-store"],
    )
    assert out.exit_code == 0, out.output
    assert calls[0]["concurrencies"] == [1, 4] and calls[0]["max_k"] == 2 and calls[0]["store"] is None
    text = out.stdout
    assert "Every figure below is measured on cpu (vLLM 0.32.0" in text
    # survival 80/100 and 60/100; AL(1) = 1.8, AL(2) = 2.4.
    assert "0.800 [" in text and "0.600 [" in text and "1.80" in text and "2.40" in text
    # T(4, 2) = 2 + 0.5 * 4 * 3 = 8 ms over 5 steps; the fit is exact on these samples.
    assert "8.00 (5)" in text and "median error 0.0%" in text
    assert "Engine launches: 1 for 1 drafter(s)." in text


def test_an_analysed_profile_carries_per_shape_means_stored_beside_its_median_fit(tmp_path: Path) -> None:
    from autotune.engine import empty_snapshot
    from autotune.measurement import Provenance
    from autotune.profiling import ProfileResult, fit_cost_model, store_profile
    from autotune.profiling._profile import _analyse
    from store import Store

    stats = PluginStats()
    stats.observe_step(step_ms=50.0, prompt_tokens=0, drafting_depth=2, requests=[("code", "warmup", 2, 2)] * 2)
    # B = 2 at depth 2: 5, 5, 5, 9 ms (median 5, mean 6); at depth 1: 4, 4, 4, 8 ms (median 4, mean 5).
    for d, times in ((2, (5.0, 5.0, 9.0, 5.0)), (1, (4.0, 8.0, 4.0, 4.0))):
        for ms in times:
            stats.observe_step(step_ms=ms, prompt_tokens=0, drafting_depth=2, requests=[("code", "c2", d, d)] * 2)
    result = ProfileResult(model="m", drafter="/d", method="draft_model", parallel_drafting=True, max_k=2,
                           concurrencies=(2,), provenance=Provenance(kind="measured", backend="vllm", device="cpu"))
    raw = {"phases": [{"name": "c2", "concurrency": 2, "num_requests": 2, "output_tokens": 30, "wall_s": 0.1}],
           "spec_before": empty_snapshot(), "spec_after": empty_snapshot()}
    _analyse(result, stats, raw, sequential=False)
    assert [(s.depth, s.step_ms, s.n) for s in result.step_samples] == [(1, 4.0, 4), (2, 5.0, 4)]
    assert [(s.depth, s.step_ms, s.n) for s in result.step_means] == [(1, 5.0, 4), (2, 6.0, 4)]
    # The stored fit (search, export and the controller use it) stays the fit on the medians.
    medians_fit = fit_cost_model(result.step_samples, sequential=False)
    assert result.cost_model is not None and medians_fit is not None
    assert result.cost_model.to_dict() == medians_fit.to_dict()
    means = result.to_dict()["step_means"]
    assert [(e["depth"], e["step_ms"], e["n"]) for e in means["speculative"]] == [(1, 5.0, 4), (2, 6.0, 4)]
    assert means["baseline"] == []  # no baseline launch

    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    env = {"device": "cpu", "gpu_count": 0, "driver": None, "vllm_version": "0.32.0", "torch_version": "2.13.0"}
    pid = store_profile(store, result, Workload("w", {"code": (WorkloadRequest(prompt="x"),)}), env)
    record = store.get_profile(pid)
    assert record.notes["step_means"] == means  # in the notes (JSON), beside the step costs of the medians
    assert [e["step_ms"] for e in record.step_costs] == [4.0, 5.0]
    store.close()


def test_a_launch_whose_plugin_counts_miss_vllms_is_reported_and_not_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin's statistics lost steps (what a delayed statistics write did to the profiling job on 2026-12-06):
    acceptance and step costs fitted on them would misstate the drafter, so the profile fails and nothing is
    stored. The engine launch is replaced by its result (such a loss cannot be provoked in a real engine on
    demand); everything after it (analysis, the check, the store) is the real code."""
    from autotune.engine import empty_snapshot
    from autotune.profiling import _profile as profiling
    from autotune.profiling._plugin_run import EngineRun
    from store import Store

    def launch(model: str, kwargs: object, phases: list[dict[str, object]], plugin: object,
               **_: object) -> EngineRun:
        stats = PluginStats()
        names = sorted({str(p["name"]) for p in phases})
        for name in names:  # the plugin saw 2 drafts per phase, 3 accepted tokens of 4
            stats.observe_step(step_ms=5.0, prompt_tokens=0, drafting_depth=2, requests=[("code", name, 2, 2)])
            stats.observe_step(step_ms=5.0, prompt_tokens=0, drafting_depth=2, requests=[("code", name, 2, 1)])
        n = len(names)
        seen = {"num_drafts": 2 * n, "num_draft_tokens": 4 * n, "num_accepted_tokens": 3 * n,
                "accepted_per_position": [2 * n, n]}
        vllm = {**seen, "num_drafts": 3 * n, "num_draft_tokens": 6 * n}  # vLLM counted one more draft per phase
        raw = {"phases": [{"name": p["name"], "concurrency": p["concurrency"], "num_requests": 1,
                           "output_tokens": 10, "wall_s": 0.1} for p in phases],
               "spec_before": empty_snapshot(), "spec_after": vllm}
        return EngineRun(True, raw, stats, log_tail="(engine log)", total_s=1.0)

    monkeypatch.setattr(profiling, "run_plugin_job", launch)
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    workload = Workload("w", {"code": tuple(WorkloadRequest(prompt=f"p{i}") for i in range(4))})
    drafter = str(Path(__file__).parent / "fixtures" / "models" / "drafter-1l")
    (result,) = profile(str(Path(__file__).parent / "fixtures" / "models" / "target"), [drafter], workload,
                        concurrencies=[1], max_k=2, store=store)
    assert not result.ok and result.failure_kind == "counts_mismatch"
    reason = result.failure_reason or ""
    # Both sides' counts (one phase: the plugin 2 drafts, 3 accepted; vLLM 3 drafts), what it means, what to do.
    assert "counted 2 drafts and 3 accepted tokens where vLLM's spec-decode counters counted 3 and 3" in reason
    assert "not stored" in reason and "run the profile again" in reason
    assert result.profile_id is None and store.list_profiles() == []
    store.close()
