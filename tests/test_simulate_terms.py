"""Step-cost terms beyond a profile's fit: the drafter's catch-up after off-steps, a skipped drafter's step, the
scheduler plugin's host time per step, and their derivation from a profile (plain numbers, derived by hand)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from autotune.errors import UsageError
from autotune.simulate import (
    AcceptanceModel,
    Adaptive,
    FittedStepCost,
    NoSpeculation,
    Phase,
    SimRequest,
    StaticDepth,
    StepShape,
    drafter_token_ms,
    drafter_token_ratio,
    idle_drafter_ms,
    params_per_token,
    profile_terms,
    simulate,
)
from policies import AcceptanceProfile, ClassPolicy, RequestPolicy, StepCostModel

ALWAYS = AcceptanceProfile.from_survival([1.0] * 4)
NEVER = AcceptanceProfile.from_survival([0.0] * 4)
BASE = StepCostModel({"base": 10.0, "drafter_fixed": 4.0})
"""10 ms per step, 4 ms more when the drafter runs."""


def one(output: int, cls: str = "a", prompt: int = 3) -> list[Phase]:
    return [Phase("p", (SimRequest(0, cls, prompt, output),))]


# ---------------------------------------------------------------------------------------------- the cost source
def test_catch_up_tokens_cost_exactly_their_drafter_time() -> None:
    cost = FittedStepCost(BASE, drafter_token_ms=0.25)
    plain = cost.step_ms(StepShape(2, 4, 1, 100.0))
    assert cost.step_ms(StepShape(2, 4, 1, 100.0, catch_up_tokens=12)) == pytest.approx(plain + 12 * 0.25)
    assert plain == pytest.approx(14.0)


def test_a_skipped_drafter_costs_its_measured_excess_and_a_plain_engine_does_not() -> None:
    cost = FittedStepCost(BASE, idle_drafter_ms=0.8)
    assert cost.step_ms(StepShape(3, 3, 0, 100.0, drafter_idle=True)) == pytest.approx(10.8)
    assert cost.step_ms(StepShape(3, 3, 0, 100.0)) == pytest.approx(10.0)  # no drafter in the engine
    assert cost.step_ms(StepShape(3, 6, 1, 100.0)) == pytest.approx(14.0)  # the drafter ran: not idle


def test_shapes_reject_a_replay_without_a_drafter_pass_and_an_idle_drafting_step() -> None:
    with pytest.raises(ValueError):
        StepShape(1, 1, 0, 10.0, catch_up_tokens=3)
    with pytest.raises(ValueError):
        StepShape(1, 2, 1, 10.0, drafter_idle=True)
    with pytest.raises(UsageError):
        FittedStepCost(BASE, idle_drafter_ms=-1.0)


# ----------------------------------------------------------------------------------------- the engine's bookkeeping
class _Recorder:
    """A cost source that records every shape and prices it with ``inner``."""

    def __init__(self, inner: FittedStepCost) -> None:
        self.inner = inner
        self.shapes: list[StepShape] = []

    @property
    def label(self) -> str:
        return "recorder"

    def step_ms(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return self.inner.step_ms(shape)


class _ScriptedRule:
    def __init__(self, depths: Sequence[int]) -> None:
        self.depths = list(depths)
        self.calls = 0

    def join(self, request_id: str, cls: str) -> None:
        pass

    def leave(self, request_id: str) -> None:
        pass

    def plan(self, request_ids: Sequence[str], scheduled: int) -> tuple[list[int], int]:
        d = self.depths[min(self.calls, len(self.depths) - 1)]
        self.calls += 1
        return [d] * len(request_ids), d

    def observe(self, results: Sequence[Any], step_ms: float | None) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class _Scripted:
    """An adaptive config (the plugin's rules apply) whose drafter depth per step follows ``depths``."""

    depths: tuple[int, ...]
    plugin_ms_per_step: float = 0.0
    label: str = "scripted"
    kind: str = "adaptive"
    speculative: bool = True

    def start(self) -> _ScriptedRule:
        return _ScriptedRule(self.depths)


def _resume_after(off: int, *, drafter_token: float = 0.0, cap: int = 512) -> tuple[float, list[StepShape]]:
    # Step 1 prefills (the drafter reads the prompt although depth 0 is planned), `off` steps skip the drafter (one
    # token each at depth 0), then the drafter runs at depth 1 for the rest of the request.
    rec = _Recorder(FittedStepCost(BASE, drafter_token_ms=drafter_token))
    acc = AcceptanceModel({"a": NEVER}, 4)
    run = simulate(one(off + 6), _Scripted((0,) * (off + 1) + (1,)), rec, acc, concurrency=1,
                   max_catch_up_tokens=cap)
    assert run.output_tokens == off + 6
    return run.duration_ms, rec.shapes


@pytest.mark.parametrize("off", [1, 4, 9])
def test_a_resume_after_n_off_steps_replays_n_tokens(off: int) -> None:
    _, shapes = _resume_after(off)
    assert shapes[0].prefill_tokens == 3 and shapes[0].drafting_depth == 1  # the drafter reads the prompt
    assert [s.drafter_idle for s in shapes[1:off + 1]] == [True] * off
    resume = shapes[off + 1]
    assert resume.drafting_depth == 1 and resume.catch_up_tokens == off
    assert sum(s.catch_up_tokens for s in shapes) == off  # once: the following steps draft, nothing is missed


def test_a_resume_costs_n_tokens_of_drafter_work_more_than_one_without() -> None:
    for off in (1, 4, 9):
        without, _ = _resume_after(off)
        priced, _ = _resume_after(off, drafter_token=0.5)
        assert priced - without == pytest.approx(off * 0.5)


def test_a_request_that_missed_more_than_the_cap_is_not_caught_up() -> None:
    _, shapes = _resume_after(5, cap=4)
    assert sum(s.catch_up_tokens for s in shapes) == 0


def test_plugin_time_adds_exactly_its_figure_per_step() -> None:
    acc = AcceptanceModel({"a": NEVER}, 4)
    cost = FittedStepCost(BASE)
    base = simulate(one(12), _Scripted((0, 0, 1)), cost, acc, concurrency=1)
    slow = simulate(one(12), _Scripted((0, 0, 1), plugin_ms_per_step=0.3), cost, acc, concurrency=1)
    assert slow.steps == base.steps
    assert slow.duration_ms - base.duration_ms == pytest.approx(0.3 * base.steps)
    assert slow.plugin_ms == pytest.approx(0.3 * base.steps)


def _adaptive(plugin_ms: float = 0.0) -> Adaptive:
    policy = RequestPolicy(static_k=2, max_k=4, default_class="a", classes={"b": ClassPolicy()})
    cost = StepCostModel({"base": 10.0, "per_verified_token": 0.5, "drafter_fixed": 4.0})
    return Adaptive(policy, cost, {"a": ALWAYS, "b": NEVER}, drafter_width=True, plugin_ms_per_step=plugin_ms)


def _mixed() -> list[Phase]:
    reqs = tuple(SimRequest(i, "a" if i % 3 == 0 else "b", 20, 30 + i) for i in range(12))
    return [Phase("p", reqs)]


def test_real_controller_plugin_time_conservation_and_determinism() -> None:
    acc = AcceptanceModel({"a": ALWAYS, "b": NEVER}, 4, seed=3)
    cost = FittedStepCost(StepCostModel({"base": 10.0, "per_verified_token": 0.5, "drafter_fixed": 4.0}),
                          drafter_token_ms=0.1, idle_drafter_ms=0.8)
    a = simulate(_mixed(), _adaptive(), cost, acc, concurrency=4, seed=3)
    b = simulate(_mixed(), _adaptive(), cost, acc, concurrency=4, seed=3)
    assert a.requests == b.requests and a.duration_ms == b.duration_ms  # deterministic
    assert a.output_tokens == sum(r.output_tokens for r in _mixed()[0].requests)  # conservation
    slow = simulate(_mixed(), _adaptive(0.25), cost, acc, concurrency=4, seed=3)
    assert slow.steps == a.steps and slow.depth_histogram == a.depth_histogram  # same decisions
    assert slow.duration_ms - a.duration_ms == pytest.approx(0.25 * a.steps)
    with pytest.raises(UsageError):
        _adaptive(-0.1)


def test_no_speculation_and_static_configs_pay_none_of_the_terms() -> None:
    acc = AcceptanceModel({"a": ALWAYS, "b": NEVER}, 4)
    plain = FittedStepCost(BASE)
    termed = FittedStepCost(BASE, drafter_token_ms=1.0, idle_drafter_ms=5.0)
    for config in (NoSpeculation(), StaticDepth(2)):
        x = simulate(_mixed(), config, plain, acc, concurrency=4)
        y = simulate(_mixed(), config, termed, acc, concurrency=4)
        assert x.duration_ms == y.duration_ms and y.catch_up_tokens == 0 and y.idle_drafter_steps == 0


# ---------------------------------------------------------------------------------------- derived from a profile
def test_idle_drafter_excess_is_the_weighted_difference_of_launches() -> None:
    spec = [
        {"batch_size": 1, "verified_tokens": 1, "drafter_ran": False, "step_ms": 6.0, "n": 3},  # +1.0 over 5.0
        {"batch_size": 2, "verified_tokens": 2, "drafter_ran": False, "step_ms": 8.0, "n": 1},  # +1.0 over 7.0
        {"batch_size": 4, "verified_tokens": 4, "drafter_ran": False, "step_ms": 99.0, "n": 9},  # no baseline at 4
        {"batch_size": 1, "verified_tokens": 2, "drafter_ran": False, "step_ms": 99.0, "n": 9},  # verifies drafts
        {"batch_size": 1, "verified_tokens": 1, "drafter_ran": True, "step_ms": 99.0, "n": 9},  # drafter ran
    ]
    base = [{"batch_size": 1, "step_ms": 4.0, "n": 1}, {"batch_size": 1, "step_ms": 5.25, "n": 4},
            {"batch_size": 2, "step_ms": 7.0, "n": 2}]
    assert idle_drafter_ms(spec, base) == (pytest.approx(1.0), 4)
    assert idle_drafter_ms(spec[2:], base) is None


TINY = {"num_hidden_layers": 1, "hidden_size": 2, "num_attention_heads": 1, "num_key_value_heads": 1,
        "intermediate_size": 3, "vocab_size": 5}


def test_drafter_token_cost_splits_the_fitted_token_cost_by_weights() -> None:
    # Per layer: q,o 2*2*2 + k,v 2*2*2 + MLP 3*2*3 = 34; LM head 2*5 = 10.
    assert params_per_token(TINY) == 44
    double = {**TINY, "num_hidden_layers": 3}  # 3*34 + 10 = 112
    assert drafter_token_ratio(double, TINY) == pytest.approx(44 / 112)
    fit = StepCostModel({"per_verified_token": 0.2})
    assert drafter_token_ms(fit, TINY, TINY) == pytest.approx(0.1)  # equal models: half of the token cost each
    terms = profile_terms({"step_samples": [], "baseline_samples": []}, fit, double, TINY)
    r = 44 / 112
    assert terms.drafter_token_ms == pytest.approx(0.2 * r / (1 + r)) and terms.idle_drafter_source is None
    with pytest.raises(UsageError):
        params_per_token({**TINY, "hidden_size": 0})
