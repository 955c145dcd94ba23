"""Per-request traces: recorded (bounded) by the scheduler plugin's stats, read back and replayed by the simulator."""

from __future__ import annotations

from pathlib import Path

from autotune.simulate import (
    AcceptanceModel,
    FittedStepCost,
    Phase,
    SimRequest,
    StaticDepth,
    load_traces,
    simulate,
)
from policies import AcceptanceProfile, StepCostModel
from policies.plugin import PluginStats


def _step(stats: PluginStats, rows: list[tuple[str, str, int, int]], prompt: int = 0) -> None:
    stats.observe_step(step_ms=5.0, prompt_tokens=prompt, drafting_depth=4,
                       requests=[(c, "p0", d, a) for _, c, d, a in rows], request_ids=[r for r, *_ in rows])


def test_stats_record_per_request_traces_and_round_trip(tmp_path: Path) -> None:
    stats = PluginStats()
    _step(stats, [("a", "code", 0, 0)], prompt=12)  # prefill of a
    _step(stats, [("a", "code", 4, 3), ("b", "chat", 0, 0)], prompt=9)  # b prefills
    _step(stats, [("a", "code", 4, 4), ("b", "chat", 4, 1)])
    _step(stats, [("b", "chat", 2, 0)])
    path = tmp_path / "stats.json"
    stats.save(path)
    again = PluginStats.load(path)
    assert again.traces() == stats.traces()
    traces = {t.cls: t.steps for t in load_traces(path)}
    assert traces == {"code": ((4, 3), (4, 4)), "chat": ((4, 1), (2, 0))}
    # The aggregated counts are unchanged by the recording.
    code = stats.acceptance("code", 4)
    assert code is not None and code.num_drafts == 2


def test_trace_recording_is_bounded() -> None:
    stats = PluginStats(max_traces=5, max_trace_steps=7)
    for wave in range(10):
        ids = [f"w{wave}r{i}" for i in range(3)]
        for _ in range(20):
            _step(stats, [(r, "code", 2, 1) for r in ids])
        for _ in range(70):  # the wave's requests are gone: an idle gap closes their traces
            _step(stats, [(f"filler{wave}", "chat", 0, 0)])
    traces = stats.traces()
    finished = [t for t in traces if t["class"] == "code"]
    assert len(finished) == 5
    assert all(len(t["steps"]) <= 7 for t in traces)
    assert len(stats._open_traces) <= 2


def test_kept_traces_are_a_uniform_sample_of_the_requests_in_arrival_order() -> None:
    # 200 requests one after another, each verifying drafts for 2 steps; 10 traces kept. The class names the quarter of
    # the arrival order a request came in. A uniform sample puts 25% of the kept traces in each quarter: over 200
    # seeds (2000 kept traces) a quarter's share has a standard deviation of sqrt(0.25 * 0.75 / 2000) = 0.0097.
    kept = dict.fromkeys(("q0", "q1", "q2", "q3"), 0)
    for seed in range(200):
        stats = PluginStats(max_traces=10, seed=seed)
        for i in range(200):
            for _ in range(2):
                _step(stats, [(f"r{i}", f"q{i // 50}", 2, 1)])
        for _ in range(130):  # one request that never drafts: the last ones close, it is dropped
            _step(stats, [("idle", "chat", 0, 0)])
        traces = stats.traces()
        assert len(traces) == 10
        for t in traces:
            kept[t["class"]] += 1
    shares = [n / 2000 for n in kept.values()]
    assert all(abs(x - 0.25) < 4 * 0.0097 for x in shares), shares


def test_recorded_traces_drive_the_simulation(tmp_path: Path) -> None:
    stats = PluginStats()
    for _ in range(30):
        _step(stats, [("a", "code", 4, 4)])
    path = tmp_path / "stats.json"
    stats.save(path)
    # The trace says every draft is accepted although the profile says none are: the trace wins while it lasts.
    never = AcceptanceProfile.from_survival([0.0] * 4)
    acc = AcceptanceModel({"code": never}, 4, traces=load_traces(path))
    cost = FittedStepCost(StepCostModel({"base": 1.0}))
    run = simulate([Phase("p", (SimRequest(0, "code", 5, 51),))], StaticDepth(4), cost, acc, concurrency=1)
    assert run.requests[0].decode_steps == 10  # 50 tokens after the first, 5 per step
    assert "1 recorded traces" in acc.describe()
