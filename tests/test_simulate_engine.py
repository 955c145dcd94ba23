"""The simulated engine: conservation, determinism, and step counts derived by hand with a constant step cost."""

from __future__ import annotations

import math

import pytest

from autotune.errors import UsageError
from autotune.search.schedule import ScheduleEntry
from autotune.simulate import (
    AcceptanceModel,
    Adaptive,
    BatchSizeSchedule,
    FittedStepCost,
    NoSpeculation,
    Phase,
    PrefixCache,
    SimRequest,
    StaticDepth,
    StepShape,
    run_configs,
    simulate,
)
from policies import AcceptanceProfile, RequestPolicy, StepCostModel

CONSTANT = FittedStepCost(StepCostModel({"base": 10.0}), label="10 ms per step")
"""Every step takes 10 ms, whatever its shape."""
ALWAYS = AcceptanceProfile.from_survival([1.0] * 8)
"""Every draft is accepted."""
NEVER = AcceptanceProfile.from_survival([0.0] * 8)


def phase(n: int, *, cls: str = "a", prompt: int = 3, output: int = 5, start: int = 0, name: str = "p") -> Phase:
    return Phase(name, tuple(SimRequest(start + i, cls, prompt, output) for i in range(n)))


def test_constant_cost_no_speculation_matches_hand_count() -> None:
    # c=2, 4 requests of 5 tokens: step 1 prefills two requests (first token each), steps 2-5 give one token each,
    # so the first pair finishes at 50 ms; the second pair arrives then and finishes at 100 ms. 20 tokens / 0.1 s.
    acc = AcceptanceModel({"a": ALWAYS}, 8)
    run = simulate([phase(4)], NoSpeculation(), CONSTANT, acc, concurrency=2, max_num_seqs=2)
    assert run.steps == 10
    assert run.duration_ms == pytest.approx(100.0)
    assert run.tokens_per_s == pytest.approx(200.0)
    assert sorted(r.finish_ms for r in run.requests) == pytest.approx([50.0, 50.0, 100.0, 100.0])
    first = [r for r in run.requests if r.arrival_ms == 0.0]
    assert all(r.ttft_ms == pytest.approx(10.0) and r.tpot_ms == pytest.approx(10.0) for r in first)


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_static_depth_with_full_acceptance_gains_k_plus_one_per_step(k: int) -> None:
    # One request of L tokens: 1 prefill step (first token), then ceil((L - 1) / (K + 1)) decode steps.
    out = 20
    acc = AcceptanceModel({"a": ALWAYS}, 8)
    run = simulate([phase(1, output=out)], StaticDepth(k), CONSTANT, acc, concurrency=1)
    assert run.steps == 1 + math.ceil((out - 1) / (k + 1))
    assert run.output_tokens == out


def test_zero_acceptance_speculation_is_one_token_per_step() -> None:
    acc = AcceptanceModel({"a": NEVER}, 8)
    run = simulate([phase(1, output=12)], StaticDepth(4), CONSTANT, acc, concurrency=1)
    assert run.steps == 12
    assert run.depth_histogram == {4: 11}


def _mixed_phases() -> list[Phase]:
    return [phase(12, cls="good", output=40, name="good"),
            phase(12, cls="bad", output=33, start=12, name="bad"),
            Phase("mixed", tuple(SimRequest(24 + i, ("good", "bad")[i % 2], 7 + i, 10 + 3 * i) for i in range(12)))]


def _acceptance(seed: int = 0, rho: float = 0.0) -> AcceptanceModel:
    good = AcceptanceProfile.from_survival([0.9, 0.8, 0.7, 0.6])
    bad = AcceptanceProfile.from_survival([0.3, 0.1, 0.02, 0.0])
    return AcceptanceModel({"good": good, "bad": bad}, 4, autocorrelation=rho, seed=seed)


LINEAR = StepCostModel({"base": 5.0, "per_request": 0.3, "per_verified_token": 0.2, "drafter_fixed": 1.5,
                        "drafter_per_request": 0.05})


def _configs() -> list:
    policy = RequestPolicy(static_k=2, max_k=4, default_class="good")
    return [
        NoSpeculation(),
        StaticDepth(1),
        StaticDepth(4),
        BatchSizeSchedule((ScheduleEntry(1, 3, 4), ScheduleEntry(4, 8, 1))),
        Adaptive(policy, LINEAR, {"good": AcceptanceProfile.from_survival([0.9, 0.8, 0.7, 0.6])}),
        Adaptive(policy, LINEAR, drafter_width=True),
    ]


@pytest.mark.parametrize("load", [{"concurrency": 1}, {"concurrency": 5}, {"request_rate": 40.0}])
def test_conservation_every_request_finishes_with_its_tokens(load: dict) -> None:
    phases = _mixed_phases()
    wanted = {r.request_id: r.output_tokens for p in phases for r in p.requests}
    for config in _configs():
        run = simulate(phases, config, FittedStepCost(LINEAR), _acceptance(), max_num_seqs=4, **load)
        got = {r.request_id: r.output_tokens for r in run.requests}
        assert got == wanted, config.label
        assert run.output_tokens == sum(wanted.values())
        assert all(r.finish_ms >= r.first_token_ms >= r.arrival_ms for r in run.requests)
        assert sum(tok for _, _, tok in run.phase_spans) == run.output_tokens


def test_same_seed_same_result_and_other_seed_differs() -> None:
    def once(seed: int) -> list:
        rows = run_configs({"w": _mixed_phases()}, lambda s: _configs(), FittedStepCost(LINEAR), _acceptance(seed),
                           concurrencies=[3], seed=seed)
        return [r.to_dict() for r in rows]

    assert once(7) == once(7)
    assert once(7) != once(8)


def test_k0_schedule_equals_no_speculation_but_for_the_drafter_pass() -> None:
    # A speculative engine whose depth is 0 at every batch size verifies nothing: the same requests, steps and batches
    # as no speculation. vLLM still runs the drafter in each of its steps (a parallel drafter's K-slot pass), so each
    # step costs the drafter's fixed and per-request time more (1.5 + 0.05 per request in LINEAR).
    phases = _mixed_phases()
    zero = BatchSizeSchedule((ScheduleEntry(1, 64, 0),))
    a = simulate(phases, NoSpeculation(), FittedStepCost(LINEAR), _acceptance(), concurrency=4)
    b = simulate(phases, zero, FittedStepCost(LINEAR), _acceptance(), concurrency=4)
    assert [(r.request_id, r.output_tokens, r.decode_steps, r.drafted) for r in a.requests] == \
        [(r.request_id, r.output_tokens, r.decode_steps, r.drafted) for r in b.requests]
    assert (a.steps, a.batch_sum) == (b.steps, b.batch_sum) and b.drafter_steps == b.steps
    requests = a.batch_sum + sum(r.prompt_tokens > 0 for p in phases for r in p.requests)  # prefill steps' requests
    assert b.duration_ms - a.duration_ms == pytest.approx(1.5 * a.steps + 0.05 * requests)
    free = StepCostModel({k: v for k, v in LINEAR.coefficients.items() if not k.startswith("drafter")})
    c = simulate(phases, zero, FittedStepCost(free), _acceptance(), concurrency=4)
    d = simulate(phases, NoSpeculation(), FittedStepCost(free), _acceptance(), concurrency=4)
    assert c.requests == d.requests and c.duration_ms == d.duration_ms  # a free drafter: exactly no speculation


def test_no_speculation_throughput_is_batch_over_step_time() -> None:
    # Long outputs, equal lengths, c = B: almost every step decodes B requests, so tok/s -> 1000 * B / T(B, 0).
    cost = FittedStepCost(LINEAR)
    b = 4
    run = simulate([phase(b, output=2000, prompt=1)], NoSpeculation(), cost, _acceptance_one(), concurrency=b)
    expected = 1000.0 * b / cost.step_ms(StepShape(b, b, 0, 1.0))
    assert run.tokens_per_s == pytest.approx(expected, rel=2e-3)


def test_max_num_seqs_caps_the_batch_and_chunked_prefill_respects_the_budget() -> None:
    seen: list[StepShape] = []

    class Recording(FittedStepCost):
        def step_ms(self, shape: StepShape) -> float:
            seen.append(shape)
            return super().step_ms(shape)

    phases = [phase(6, prompt=50, output=8)]
    simulate(phases, StaticDepth(2), Recording(LINEAR), _acceptance_one(), concurrency=6, max_num_seqs=3,
             max_num_batched_tokens=32)
    assert max(s.batch_size + s.prefill_requests for s in seen) <= 3
    assert all(s.verified_tokens + s.prefill_tokens <= 32 for s in seen)
    assert sum(s.prefill_tokens for s in seen) == 6 * 50


def _acceptance_one() -> AcceptanceModel:
    return AcceptanceModel({"a": AcceptanceProfile.from_survival([0.5, 0.25])}, 4)


def test_open_loop_below_capacity_serves_the_offered_load() -> None:
    # 2 req/s of 10 tokens with 10 ms steps is far below capacity: a request waits at most for the step in flight
    # when it arrives (< 10 ms), then takes 10 steps; the run ends 100-110 ms after the last arrival.
    reqs = phase(200, output=10)
    run = simulate([reqs], NoSpeculation(), CONSTANT, AcceptanceModel({"a": ALWAYS}, 2), request_rate=2.0, seed=3)
    arrivals = [r.arrival_ms for r in run.requests]
    span = max(arrivals) - min(arrivals)
    assert span + 100.0 <= run.duration_ms < span + 110.0
    assert all(10.0 - 1e-9 <= r.ttft_ms < 20.0 for r in run.requests)
    # Offered load: 2 req/s x 10 tokens = 20 tokens/s (200 Poisson arrivals span 100 s +- ~7 s).
    assert run.tokens_per_s == pytest.approx(20.0, rel=0.15)


def test_bad_loads_are_usage_errors() -> None:
    acc = AcceptanceModel({"a": ALWAYS}, 2)
    with pytest.raises(UsageError, match="exactly one"):
        simulate([phase(1)], NoSpeculation(), CONSTANT, acc)
    with pytest.raises(UsageError, match="no acceptance profile"):
        simulate([phase(1, cls="zzz")], NoSpeculation(), CONSTANT, acc, concurrency=1)


def test_a_repeated_prompt_computes_only_what_the_prefix_cache_lacks() -> None:
    cache = PrefixCache(16)
    first, again, other = (SimRequest(0, "a", 40, 2, prompt_key="p"), SimRequest(1, "a", 40, 2, prompt_key="p"),
                           SimRequest(2, "a", 40, 2))
    assert cache.cached_tokens(again) == 0
    cache.add(first)
    assert cache.cached_tokens(again) == 32  # two full blocks; the third holds the last token, always computed
    assert cache.cached_tokens(other) == 0  # no key: never cached
    assert PrefixCache(16, {"p"}).cached_tokens(SimRequest(3, "a", 32, 2, prompt_key="p")) == 16
    with pytest.raises(UsageError):
        PrefixCache(0)
    # Served one after the other without speculation: the repeat's prompt step prices 8 tokens, not 40.
    cost = FittedStepCost(StepCostModel({"base": 1.0, "per_verified_token": 0.5}))
    acc = AcceptanceModel({"a": AcceptanceProfile.from_survival([0.0])}, 1)
    phases = [Phase("p", (SimRequest(0, "a", 40, 2, prompt_key="p"), SimRequest(1, "a", 40, 2, prompt_key="p")))]
    cold = simulate(phases, NoSpeculation(), cost, acc, concurrency=1)
    warm = simulate(phases, NoSpeculation(), cost, acc, concurrency=1, prefix_cache=PrefixCache(16))
    assert cold.output_tokens == warm.output_tokens == 4
    assert cold.duration_ms - warm.duration_ms == pytest.approx(0.5 * 32)
    cache = PrefixCache(16)
    simulate(phases, NoSpeculation(), cost, acc, concurrency=1, prefix_cache=cache)
    assert cache.keys == {"p"}  # the caller's cache holds what the run computed
