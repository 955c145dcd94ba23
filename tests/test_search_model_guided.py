"""Model-guided search: predict every config from a profile, verify the best predictions, recalibrate, stop once the
best is confirmed; reuse of stored profiles; launches reported; CLI wiring. No engine: the "real" world here is the
model backend with a known step-cost model, and the predictor is the same backend with a deliberately wrong one
(what a profile taken at K_max with trimmed depth gets wrong: it misses how the drafter's cost grows with K)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from click.testing import CliRunner

from autotune.backends.base import Backend
from autotune.backends.model import ModelBackend
from autotune.cli import main
from autotune.errors import UsageError
from autotune.measurement import Measurement
from autotune.search import (
    DrafterChoice,
    DrafterProfile,
    ModelGuidedStrategy,
    Search,
    SearchSpace,
    StrategyContext,
    calibration_scales,
    make_strategy,
    resolve_strategy,
    store_or_profile,
)
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload
from store import Store

PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
SPACE = SearchSpace(drafters=(PEAGLE,), k_min=1, k_max=10, max_num_seqs=(32, 64), parallel_drafting="on")
SCENARIO = Scenario(concurrency=64)


class LinearCost:
    """T(B, K) = base + per_token * B * (K + 1) + per_draft * B * K, ms (a stand-in for `StepCostModel`)."""

    def __init__(self, base: float, per_token: float, per_draft: float) -> None:
        self.base, self.per_token, self.per_draft = base, per_token, per_draft

    def predict(self, batch_size: int, depth: int, drafter_ran: bool | None = None) -> float:
        return self.base + self.per_token * batch_size * (depth + 1) + self.per_draft * batch_size * depth


TRUE_COST = LinearCost(base=10.0, per_token=0.02, per_draft=0.03)
#: What the profile "measured": 30% slower steps and no drafter cost growing with K.
PROFILED_COST = LinearCost(base=13.0, per_token=0.026, per_draft=0.0)


class World(Backend):
    """The real world of these tests: published acceptance and TRUE_COST; counts the launches."""

    name = "vllm"

    def __init__(self) -> None:
        self.inner = ModelBackend("gpt-oss-120b", "h200", cost_model=TRUE_COST)
        self.calls: list[SpecConfig] = []

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        self.calls.append(config)
        return self.inner.measure(config, workload, scenario)


def provider(cost: Any, launches: int = 1) -> Any:
    def provide(ctx: StrategyContext, drafter: DrafterChoice) -> DrafterProfile:
        return DrafterProfile(drafter.name, {}, cost, "test profile", None, launches)

    return provide


def make(tmp_path: Path, backend: Backend, strategy: Any, cost: Any = None, launches: int = 1, **kw: Any) -> Search:
    """A search of SPACE on mt-bench; with `cost`, model-guided predicts from a profile with that step cost."""
    if cost is not None:
        kw["profiles"] = provider(cost, launches)
    return Search(
        store=Store(f"sqlite:///{tmp_path / 'peagle.db'}"), backend=backend, model="openai/gpt-oss-120b",
        device="NVIDIA H200", workload=load_workload("mt-bench"), space=kw.pop("space", SPACE), strategy=strategy,
        study_prefix="mg", **kw,
    )


def true_best(scenario: Scenario) -> tuple[SpecConfig, float]:
    world = World()
    values = {c: world.measure(c, load_workload("mt-bench"), scenario).output_tokens_per_s or 0.0 for c in SPACE.grid()}
    best = max(values, key=lambda c: values[c])
    return best, values[best]


def test_finds_the_true_best_with_fewer_launches_than_the_grid(tmp_path: Path) -> None:
    world = World()
    strategy = ModelGuidedStrategy()
    result = make(tmp_path, world, strategy, PROFILED_COST).run_scenario(SCENARIO)
    best, value = true_best(SCENARIO)
    # The uncalibrated prediction ranks K too high (no drafter cost per K); the search still lands on the true best.
    assert strategy._guides[result.study_name].predicted  # predicted every config
    assert result.best.config == best and result.best.output_tokens_per_s == pytest.approx(value)
    assert len(world.calls) < len(SPACE.grid())
    assert result.n_measurements == len(world.calls)
    assert result.strategy_report["stop_reason"].startswith("best confirmed")


def test_exact_predictions_stop_after_the_minimum_trials(tmp_path: Path) -> None:
    # With exact predictions the first trial is the true best and the leave-one-out error is 0, so after
    # min_trials=3 trials (best prediction, no-spec and published-K baselines or the next candidate) no unmeasured
    # config is predicted above 1.03x the best: the rule stops there.
    world = World()
    strategy = ModelGuidedStrategy()
    result = make(tmp_path, world, strategy, TRUE_COST).run_scenario(SCENARIO)
    best, _ = true_best(SCENARIO)
    assert world.calls[0] == best and result.best.config == best
    assert result.n_trials == 3
    assert result.strategy_report["prediction_error"] == pytest.approx(0.0, abs=1e-9)
    assert result.strategy_report["stop_reason"].startswith("best confirmed")


def test_baselines_are_verified_right_after_the_best_prediction(tmp_path: Path) -> None:
    world = World()
    result = make(tmp_path, world, ModelGuidedStrategy(), PROFILED_COST).run_scenario(SCENARIO)
    seqs = world.calls[0].max_num_seqs
    assert world.calls[1] == SpecConfig(max_num_seqs=seqs)  # no speculation
    assert world.calls[2] == world.calls[0].with_(num_speculative_tokens=5) or world.calls[0].k == 5  # published K
    assert result.baseline is not None
    assert result.baseline.config == SpecConfig(max_num_seqs=result.best.config.max_num_seqs)


def test_recalibration_moves_predictions_toward_measurements() -> None:
    k = {n: SpecConfig("eagle3", "d", n, True) for n in (2, 4, 6, 8)}
    # A uniform 0.8x: every config (measured or not, any drafter) is predicted at 0.8x; leave-one-out error 0.
    scale, error = calibration_scales({k[2]: math.log(0.8), k[4]: math.log(0.8)})
    assert math.exp(scale(k[8])) == pytest.approx(0.8) and error == pytest.approx(0.0, abs=1e-12)
    assert math.exp(scale(SpecConfig("eagle3", "other", 3, True))) == pytest.approx(0.8)
    # A trend: measured/predicted = 0.8 per 2 K (1.0 at K=2, 0.8 at K=4, 0.64 at K=6). Without a prior on the slope
    # the fit is exact, so K=8 is predicted at 0.8^3 = 0.512x; with the default prior it lies between that and 1.
    ratios = {k[2]: 0.0, k[4]: math.log(0.8), k[6]: math.log(0.64)}
    exact, _ = calibration_scales(ratios, slope_weight=0.0)
    assert math.exp(exact(k[8])) == pytest.approx(0.512)
    shrunk, _ = calibration_scales(ratios)
    assert 0.512 < math.exp(shrunk(k[8])) < 0.8


def test_calibrated_predictions_beat_the_raw_ones_on_the_measured_configs(tmp_path: Path) -> None:
    world = World()
    strategy = ModelGuidedStrategy()
    result = make(tmp_path, world, strategy, PROFILED_COST).run_scenario(SCENARIO)
    guide = strategy._guides[result.study_name]
    measured = {c: v for c, v in guide.measured.items() if v is not None and c.speculative}
    raw = max(abs(guide.predicted[c] / v - 1) for c, v in measured.items())
    # PROFILED_COST misses the drafter's 0.03 * 64 = 1.92 ms per K at B=64: at K=5 it predicts 13 + 0.026*64*6 =
    # 23.0 ms per step against 10 + 0.02*64*6 + 1.92*5 = 27.3 ms, i.e. tokens/s 19% too high (more at larger K).
    assert raw > 0.1
    calibrated, loo_error = guide.calibrated()
    assert max(abs(calibrated[c] / v - 1) for c, v in measured.items()) < raw
    assert loo_error < raw  # also for each config predicted from the others only


def test_profile_launches_are_counted_once_across_scenarios(tmp_path: Path) -> None:
    world = World()
    strategy = ModelGuidedStrategy()
    search = make(tmp_path, world, strategy, PROFILED_COST, launches=1)
    first, second = search.run([Scenario(concurrency=64), Scenario(concurrency=8)])
    assert (first.profile_launches, second.profile_launches) == (1, 0)
    assert first.engine_launches == first.n_measurements + 1
    assert first.n_measurements + second.n_measurements == len(world.calls)


def test_resumed_study_keeps_the_measured_trials(tmp_path: Path) -> None:
    world = World()
    make(tmp_path, world, ModelGuidedStrategy(), PROFILED_COST).run_scenario(SCENARIO)
    calls = len(world.calls)
    # A new process (new strategy) on the same study: the finished trials are taken in, nothing is re-measured.
    again = make(tmp_path, world, ModelGuidedStrategy(), PROFILED_COST).run_scenario(SCENARIO)
    assert len(world.calls) == calls and again.n_trials == calls


def test_without_a_stored_profile_the_model_backend_cannot_make_one(tmp_path: Path) -> None:
    search = make(tmp_path, ModelBackend("gpt-oss-120b", "h200"), ModelGuidedStrategy())
    with pytest.raises(UsageError, match="peagle-tune profile"):
        search.run_scenario(SCENARIO)


def _store_profile(store: Store, model: str, device: str, workload: Workload) -> int:
    env = store.environment_id({"device": device})
    wid = store.workload_id(workload.name, content_hash=workload.content_hash(), classes=workload.class_names)
    # Step times from TRUE_COST at B in {1, 64} and depths {0, 4, 8} (the drafter ran in every step).
    steps = [{"batch_size": b, "depth": k, "step_ms": TRUE_COST.predict(b, k), "n": 10} for b in (1, 64)
             for k in (0, 4, 8)]
    acceptance = {c: {"num_drafts": 1000, "accepted_per_position": [800, 600, 450, 330, 240, 170, 120, 80, 50, 30]}
                  for c in workload.class_names}
    return store.add_profile(model, method="eagle3", max_k=10, environment_id=env, acceptance=acceptance,
                             step_costs=steps, drafter=PEAGLE.name, drafter_layers=4, parallel_drafting=True,
                             workload_id=wid)


def test_a_stored_profile_is_reused_without_launches(tmp_path: Path) -> None:
    world = World()
    search = make(tmp_path, world, ModelGuidedStrategy())
    pid = _store_profile(search.store, search.model, search.device, search.workload)
    ctx = StrategyContext(optuna.create_study(), SCENARIO, 10, SPACE, search.objective, search.workload, search.model,
                          search.profiles)
    # The search's default profile source is `store_or_profile` bound to its store and backend.
    profile = ctx.profile(PEAGLE)
    assert (profile.label, profile.profile_id, profile.launches) == (f"stored profile #{pid}", pid, 0)
    again = store_or_profile(ctx, PEAGLE, store=search.store, backend=world, model=search.model, device=search.device)
    assert again.profile_id == pid and world.calls == []


def test_a_backend_without_an_engine_cannot_profile(tmp_path: Path) -> None:
    # World measures but declares no engine options (`Backend.options` is None): no profile can be made for it.
    search = make(tmp_path, World(), ModelGuidedStrategy())
    with pytest.raises(UsageError, match="the vllm backend cannot make one"):
        search.run_scenario(SCENARIO)


def test_auto_strategy_is_model_guided_with_the_vllm_backend() -> None:
    assert resolve_strategy("auto", "vllm") == "model-guided"
    assert resolve_strategy("auto", "model") == "blackbox"
    assert resolve_strategy("auto", "vllm", sampler="gp") == "blackbox"
    assert isinstance(make_strategy("model-guided"), ModelGuidedStrategy)


def test_cli_model_guided_reports_profiles_and_launches(tmp_path: Path) -> None:
    db = tmp_path / "peagle.db"
    store = Store(f"sqlite:///{db}")
    workload = load_workload("mt-bench")
    base = ["search", "--model", "gpt-oss-120b", "--backend", "model", "--gpu", "h200", "--db", str(db),
            "--drafter", PEAGLE.name, "--concurrency", "64", "--max-k", "10", "--strategy", "model-guided"]
    missing = CliRunner().invoke(main, base)
    assert missing.exit_code != 0 and "peagle-tune profile" in missing.output
    pid = _store_profile(store, "openai/gpt-oss-120b", "NVIDIA H200 SXM 141GB", workload)
    result = CliRunner().invoke(main, [*base, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    scenario = doc["scenarios"][0]
    assert doc["strategy"] == "model-guided"
    assert scenario["strategy_report"]["profiles"] == {PEAGLE.name: f"stored profile #{pid}"}
    # The model backend predicts: nothing is launched, and the stored profile was reused (no profiling launch).
    assert scenario["engine_launches"] == {"profiling": 0, "trials": 0, "total": 0}
    assert scenario["trials"]["finished"] < 2 * 10  # fewer than the grid (2 max_num_seqs x 10 K)
