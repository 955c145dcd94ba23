"""The simulator on a GPU prices CUDA-graph modes and async scheduling as vLLM runs them: a static launch's uniform
decode steps replay FULL graphs, every other step (prompt tokens, a lower depth, a batch-size schedule's every step)
pays the PIECEWISE penalty, and the adaptive controller launches at the static K, async, one step late."""

from __future__ import annotations

import pytest

from autotune.search.schedule import ScheduleEntry
from autotune.simulate import (
    AcceptanceModel,
    Adaptive,
    BatchSizeSchedule,
    FittedStepCost,
    NoSpeculation,
    Phase,
    SimRequest,
    StaticDepth,
    StepShape,
    gpu_setup,
    simulate,
)
from autotune.simulate._setup import SYNC_HOST_SHARE
from policies import AcceptanceProfile, RequestPolicy, StepCostModel

ALWAYS = AcceptanceProfile.from_survival([1.0] * 8)
POOR = AcceptanceProfile.from_survival([0.1, 0.01, 0.001, 0.0001, 0.0, 0.0, 0.0, 0.0])


class Recording(FittedStepCost):
    """10 ms per step, 5 ms more when PIECEWISE; remembers every shape it priced."""

    def __init__(self, graphs: bool) -> None:
        super().__init__(StepCostModel({"base": 10.0, "piecewise": 5.0}, full_graph_depth=0 if graphs else None))
        self.shapes: list[StepShape] = []

    def step_ms(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return super().step_ms(shape)


def _run(config: object, graphs: bool, profile: AcceptanceProfile = ALWAYS) -> Recording:
    cost = Recording(graphs)
    phases = [Phase("p", tuple(SimRequest(i, "a", 3, 20) for i in range(4)))]
    simulate(phases, config, cost, AcceptanceModel({"a": profile}, 8), concurrency=2)  # type: ignore[arg-type]
    return cost


def test_a_static_launch_replays_full_graphs_only_for_its_uniform_decode_steps() -> None:
    cost = _run(StaticDepth(3), graphs=True)
    for s in cost.shapes:
        uniform = s.prefill_tokens == 0 and s.verified_tokens == s.batch_size * 4
        assert s.piecewise is not uniform, s
    assert any(not s.piecewise for s in cost.shapes) and any(s.piecewise for s in cost.shapes)
    plain = _run(NoSpeculation(), graphs=True)  # K=0: one-token decode steps are the uniform ones
    assert all(s.piecewise == (s.prefill_tokens > 0) for s in plain.shapes)


def test_a_batch_size_schedule_runs_every_step_piecewise_and_pays_for_it() -> None:
    schedule = BatchSizeSchedule((ScheduleEntry(1, 8, 3),))
    gpu = _run(schedule, graphs=True)
    assert gpu.shapes and all(s.piecewise for s in gpu.shapes)
    # The same steps as static K=3 (the schedule asks K=3 at every batch size): its uniform decode steps, FULL in
    # the static launch, cost 5 ms more each.
    static = _run(StaticDepth(3), graphs=True)
    assert [(s.batch_size, s.verified_tokens) for s in gpu.shapes] == [
        (s.batch_size, s.verified_tokens) for s in static.shapes]
    full = sum(not s.piecewise for s in static.shapes)
    assert full > 0
    def price(cost: Recording) -> float:  # priced without recording (the recorder appends what it prices)
        return sum(FittedStepCost.step_ms(cost, s) for s in cost.shapes)

    extra = price(gpu) - price(static)
    assert extra == pytest.approx(5.0 * full)


def test_the_cpu_build_has_no_graphs() -> None:
    for config in (StaticDepth(3), BatchSizeSchedule((ScheduleEntry(1, 8, 3),)), NoSpeculation()):
        assert not any(s.piecewise for s in _run(config, graphs=False).shapes)


def test_an_adaptive_launch_below_its_k_runs_piecewise() -> None:
    policy = RequestPolicy(static_k=2, max_k=4, default_class="a")
    cost = StepCostModel({"base": 10.0, "per_verified_token": 1.0})
    # B = 2, AL(4) = 1.111: K=4 (FULL) gives 2.22 / 20 ms; K=0 with the prior penalty 0.192 * 15 = 2.88 ms gives
    # 2 / 14.88 ms, more: the controller leaves K=4, and those steps are PIECEWISE.
    run = _run(Adaptive(policy, cost.with_graphs(4), {"a": POOR}), graphs=True, profile=POOR)
    decode = [s for s in run.shapes if s.prefill_tokens == 0]
    assert any(s.verified_tokens != s.batch_size * 5 for s in decode)
    for s in decode:
        assert s.piecewise is (s.verified_tokens != s.batch_size * 5)


def test_on_a_gpu_the_controller_launches_at_the_fastest_k_async_and_prices_sync() -> None:
    phases = [Phase("chat", tuple(SimRequest(i, "chat", 200, 64) for i in range(8)))]
    setup = gpu_setup("gpt-oss-120b", "h200", {"w": phases})
    assert setup.cost.full_graphs
    configs = setup.configs(8, {"chat": 1.0}, kinds=("adaptive",))
    adaptive = configs[0]
    assert isinstance(adaptive, Adaptive)
    # It launches at the fastest static K (the only depth whose steps replay FULL graphs) and falls back to the
    # search's pick (the smallest K within the spread).
    launch_k, static_k = setup.fastest_static(8, {"chat": 1.0}), setup.best_static(8, {"chat": 1.0})
    assert adaptive.policy.max_k == launch_k == adaptive.graph_depth and adaptive.policy.static_k == static_k
    assert launch_k >= static_k
    assert adaptive.cost_model.full_graph_depth == launch_k and adaptive.cost_model.coefficients["piecewise"] > 0
    assert adaptive.async_scheduling and adaptive.plugin_ms_per_step == 0.0
    setup.async_scheduling = False  # the plugin forced synchronous: it pays the host time async overlaps
    sync = setup.configs(8, {"chat": 1.0}, kinds=("adaptive",))[0]
    assert isinstance(sync, Adaptive) and not sync.async_scheduling
    assert sync.plugin_ms_per_step == pytest.approx(SYNC_HOST_SHARE * setup.uniform_step_ms(1, launch_k))


def test_async_decisions_learn_each_outcome_one_step_late() -> None:
    policy = RequestPolicy(static_k=2, max_k=4, default_class="a")
    cost = StepCostModel({"base": 10.0, "per_verified_token": 1.0})
    rule = Adaptive(policy, cost, async_scheduling=True).start()
    rule.join("r", "a")
    seen: list[object] = []
    rule.controller.observe_step = lambda results, step_ms, *a, **k: seen.append(results)  # type: ignore[attr-defined]
    rule.observe([("r", "a", 4, 4)], 10.0)
    assert seen == []  # the next step was planned before this outcome arrived
    rule.observe([("r", "a", 4, 1)], 10.0)
    assert seen == [[("r", "a", 4, 4)]]
