"""Step-cost terms beyond a profile's fit: the drafter's catch-up after off-steps, a skipped drafter's step (and
its prompt, left to the replay under ``catch_up``), the plugin's off-step modes, the scheduler plugin's host time per
step, and their derivation from a profile (plain numbers, derived by hand)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
    SimRequest,
    StaticDepth,
    StepShape,
    drafter_token_ms,
    drafter_token_ratio,
    idle_drafter_ms,
    mean_cost_model,
    off_step_mode,
    params_per_token,
    profile_setup,
    profile_step_means,
    profile_terms,
    prompt_token_costs,
    simulate,
)
from policies import AcceptanceProfile, ClassPolicy, RequestPolicy, StepCostModel, StepSample

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
    """An adaptive config with drafter-width control (the plugin's rules apply) whose drafter depth per step follows
    ``depths`` (every request is planned at that depth)."""

    depths: tuple[int, ...]
    plugin_ms_per_step: float = 0.0
    off_steps: str = "catch_up"
    label: str = "scripted"
    kind: str = "adaptive"
    speculative: bool = True
    drafter_width: bool = True

    def start(self) -> _ScriptedRule:
        return _ScriptedRule(self.depths)


# Plain numbers for the off-step tests: a step costs 10 ms + 1 ms per token the target computes (verified or prompt),
# 4 ms more when the drafter runs; the drafter's share of a token is 0.25 ms (inside the 1 ms, as in a profile's
# fit), a replayed token costs that 0.25 ms, a skipped drafter's step 0.5 ms more than a plain engine's.
FIT = StepCostModel({"base": 10.0, "per_verified_token": 1.0, "drafter_fixed": 4.0})
PROMPT = 20


def _termed() -> FittedStepCost:
    return FittedStepCost(FIT, drafter_token_ms=0.25, idle_drafter_ms=0.5)


SKIPPED_PROMPT_MS = 10.0 + PROMPT * 1.0 + 0.5 - PROMPT * 0.25  # 25.5: the target alone, plus the idle step's 0.5
READ_PROMPT_MS = 10.0 + PROMPT * 1.0 + 4.0  # 34: the drafter reads the prompt in its one-slot pass
IDLE_DECODE_MS = 10.0 + 1.0 + 0.5  # 11.5
DRAFT_DECODE_MS = 10.0 + 1.0 + 4.0  # 15: verifies nothing, drafts one
VERIFY_ONE_MS = 10.0 + 2.0 + 4.0  # 16: verifies one draft (never accepted), drafts one


def _run(config: Any, output: int, *, cap: int = 512, prompt: int = PROMPT) -> tuple[Any, list[StepShape]]:
    rec = _Recorder(_termed())
    run = simulate(one(output, prompt=prompt), config, rec, AcceptanceModel({"a": NEVER}, 4), concurrency=1,
                   max_catch_up_tokens=cap)
    assert run.output_tokens == output  # conservation
    return run, rec.shapes


def test_a_request_that_never_drafts_pays_no_drafter_work_for_its_prompt() -> None:
    # catch_up: the prompt step skips the drafter (every planned depth is 0), so do the 4 decode steps; nothing is
    # ever replayed. Under `holes` the drafter reads the prompt (34 ms instead of 25.5).
    run, shapes = _run(_Scripted((0,)), 5)
    assert shapes[0].prefill_tokens == PROMPT and shapes[0].drafter_idle and shapes[0].drafter_skips_prompt
    assert run.drafter_steps == 0 and run.catch_up_tokens == 0 and run.idle_drafter_steps == 5
    assert run.skipped_prompt_steps == 1
    assert run.duration_ms == pytest.approx(SKIPPED_PROMPT_MS + 4 * IDLE_DECODE_MS)  # 71.5
    holes, shapes = _run(_Scripted((0,), off_steps="holes"), 5)
    assert shapes[0].drafting_depth == 1 and not shapes[0].drafter_idle
    assert holes.duration_ms == pytest.approx(READ_PROMPT_MS + 4 * IDLE_DECODE_MS)  # 80
    assert holes.catch_up_tokens == 0


@pytest.mark.parametrize("off", [0, 2, 5])
def test_a_request_that_drafts_later_replays_its_prompt_and_output_so_far(off: int) -> None:
    # Prompt step skipped, `off` decode steps skipped (one token each: nothing accepted at depth 0), then the drafter
    # runs: it replays the prompt and the `off` tokens (the worker's replay of positions 0 .. P + off - 1).
    run, shapes = _run(_Scripted((0,) * (off + 1) + (1,)), 10)
    resume = shapes[off + 1]
    assert resume.drafting_depth == 1 and resume.catch_up_tokens == PROMPT + off
    assert run.catch_up_tokens == PROMPT + off  # once: every later step drafts
    # 10 tokens: the first from the prompt step, then off idle steps, the resume step and 8 - off steps verifying 1.
    expected = SKIPPED_PROMPT_MS + off * IDLE_DECODE_MS + DRAFT_DECODE_MS + 0.25 * (PROMPT + off) \
        + (8 - off) * VERIFY_ONE_MS
    assert run.duration_ms == pytest.approx(expected)


@pytest.mark.parametrize(("cap", "skipped"), [(PROMPT, True), (PROMPT - 1, False)])
def test_a_prompt_longer_than_the_catch_up_cap_runs_the_drafter(cap: int, skipped: bool) -> None:
    # The worker skips a prompt step only when every replay stays within max_catch_up_tokens; otherwise the drafter
    # reads the prompt now (at one slot) and the first drafting step has nothing to replay.
    _, shapes = _run(_Scripted((0, 1)), 8, cap=cap)
    assert shapes[0].drafter_idle is skipped and shapes[0].drafting_depth == (0 if skipped else 1)
    assert shapes[1].drafting_depth == 1 and shapes[1].catch_up_tokens == (PROMPT if skipped else 0)


def test_a_decoding_request_past_the_cap_makes_a_prompt_step_run_the_drafter_and_is_abandoned() -> None:
    # Concurrency 2, every depth 0, cap 5. A (output 12) decodes beside B, then C, then D (output 2 each, prompts of
    # 3): each skipped step adds one token to A's count, which starts at its 3 prompt tokens. A prompt step is
    # skipped while A's count + 1 (the token it computes) stays <= 5; C's prompt comes at A's count 4 (skipped, A ->
    # 5), D's at A's count 6: the drafter runs, A's 6 missed tokens exceed the cap and are dropped, not replayed.
    reqs = (SimRequest(0, "a", 3, 12), SimRequest(1, "a", 3, 2), SimRequest(2, "a", 3, 2), SimRequest(3, "a", 3, 2))
    rec = _Recorder(_termed())
    run = simulate([Phase("p", reqs)], _Scripted((0,)), rec, AcceptanceModel({"a": NEVER}, 4), concurrency=2,
                   max_catch_up_tokens=5)
    prompts = [s for s in rec.shapes if s.prefill_tokens]
    assert [s.drafter_idle for s in prompts] == [True, True, False]
    assert prompts[2].drafting_depth == 1 and prompts[2].catch_up_tokens == 0
    assert run.catch_up_tokens == 0 and run.drafter_steps == 1
    assert run.output_tokens == 18


class _ByClassRule(_ScriptedRule):
    """Every request at its class's depth."""

    def __init__(self, depth_of: dict[str, int]) -> None:
        super().__init__([0])
        self.depth_of = depth_of
        self.cls: dict[str, str] = {}

    def join(self, request_id: str, cls: str) -> None:
        self.cls[request_id] = cls

    def plan(self, request_ids: Sequence[str], scheduled: int) -> tuple[list[int], int]:
        depths = [self.depth_of[self.cls[r]] for r in request_ids]
        return depths, max(depths, default=0)


@dataclass(frozen=True)
class _ByClass(_Scripted):
    depth_of: tuple[tuple[str, int], ...] = ()

    def start(self) -> _ByClassRule:
        return _ByClassRule(dict(self.depth_of))


@pytest.mark.parametrize(("cap", "deferred"), [(PROMPT, True), (PROMPT - 1, False)])
def test_a_prompt_at_depth_zero_in_a_drafting_step_is_left_to_a_replay(cap: int, deferred: bool) -> None:
    # A (class a, depth 1, prompt 3) and B (class b, depth 0, prompt 20) start together: the drafter runs for A and
    # reads only B's last prompt token (the plugin's workers, `defer_idle_prompts`), when B's replay would stay
    # within the cap. B never drafts, so its prompt never costs the drafter anything.
    reqs = (SimRequest(0, "a", 3, 6), SimRequest(1, "b", PROMPT, 3))
    rec = _Recorder(_termed())
    run = simulate([Phase("p", reqs)], _ByClass((), depth_of=(("a", 1), ("b", 0))), rec,
                   AcceptanceModel({"a": NEVER, "b": NEVER}, 4), concurrency=2, max_catch_up_tokens=cap)
    first = rec.shapes[0]
    assert first.prefill_tokens == 3 + PROMPT and first.drafting_depth == 1
    assert first.deferred_prompt_tokens == (PROMPT - 1 if deferred else 0)
    # 10 + 23 tokens + 4 for the drafter, less the drafter's 0.25 ms on each of the 19 tokens it leaves out.
    assert _termed().step_ms(first) == pytest.approx(37.0 - (0.25 * (PROMPT - 1) if deferred else 0.0))
    assert run.catch_up_tokens == 0 and run.output_tokens == 9


def test_a_sync_pass_runs_the_drafter_over_one_slot_in_every_off_step() -> None:
    # EAGLE heads (and async scheduling): off-steps keep the drafter's KV with a one-slot pass; nothing is skipped
    # or replayed, the prompt step included.
    run, shapes = _run(_Scripted((0, 0, 0, 1), off_steps="sync_pass"), 8)
    assert all(s.drafting_depth == 1 and not s.drafter_idle for s in shapes)
    assert run.catch_up_tokens == 0 and run.idle_drafter_steps == 0
    assert run.duration_ms == pytest.approx(READ_PROMPT_MS + 3 * DRAFT_DECODE_MS + 4 * VERIFY_ONE_MS)


def test_holes_skip_decode_only_off_steps_without_replay() -> None:
    run, shapes = _run(_Scripted((0, 0, 0, 1), off_steps="holes"), 8)
    assert shapes[0].drafting_depth == 1  # prompt steps run the drafter
    assert [s.drafter_idle for s in shapes[1:3]] == [True, True]
    assert run.catch_up_tokens == 0


def test_a_schedule_at_k0_runs_the_drafter_and_trimming_drafts_every_step() -> None:
    # vLLM calls the drafter in every step: a schedule's K = 0 step runs its K-slot pass (the schedule's top K, 2 here;
    # 1 for a sequential drafter), prompt steps included, nothing skipped or replayed; trimming drafts in every step.
    rec = _Recorder(_termed())
    schedule = BatchSizeSchedule((ScheduleEntry(2, 8, 2),))  # K = 0 at one request
    run = simulate(one(5, prompt=PROMPT), schedule, rec, AcceptanceModel({"a": NEVER}, 4), concurrency=1)
    assert [s.drafting_depth for s in rec.shapes] == [2] * 5 and run.idle_drafter_steps == 0
    assert run.duration_ms == pytest.approx(READ_PROMPT_MS + 4 * DRAFT_DECODE_MS)
    rec = _Recorder(_termed())
    sequential = BatchSizeSchedule((ScheduleEntry(2, 8, 2),), zero_depth_drafting=1)
    simulate(one(5, prompt=PROMPT), sequential, rec, AcceptanceModel({"a": NEVER}, 4), concurrency=1)
    assert [s.drafting_depth for s in rec.shapes] == [1] * 5
    with pytest.raises(UsageError):
        BatchSizeSchedule((ScheduleEntry(1, 8, 2),), zero_depth_drafting=0)
    policy = RequestPolicy(static_k=2, max_k=4, default_class="a")
    trim = simulate(one(5, prompt=PROMPT), Adaptive(policy, FIT, {"a": NEVER}), _termed(),
                    AcceptanceModel({"a": NEVER}, 4), concurrency=1)
    assert trim.drafter_steps == trim.steps and trim.catch_up_tokens == 0


def test_off_step_modes_follow_the_plugins_workers() -> None:
    assert off_step_mode("draft_model") == "catch_up"  # token-only: replays
    assert off_step_mode("eagle3") == "sync_pass" and off_step_mode("eagle") == "sync_pass"  # needs hidden states
    assert off_step_mode("draft_model", async_scheduling=True) == "sync_pass"
    assert off_step_mode("eagle3", "holes") == "holes"
    with pytest.raises(UsageError):
        off_step_mode("draft_model", "skip")
    policy = RequestPolicy(static_k=2, max_k=4, default_class="a")
    assert Adaptive(policy, FIT, drafter_width=True).skips_drafter
    assert not Adaptive(policy, FIT, drafter_width=True, off_steps="sync_pass").skips_drafter
    assert not Adaptive(policy, FIT).skips_drafter  # trimming
    with pytest.raises(UsageError):
        Adaptive(policy, FIT, drafter_width=True, off_steps="later")


def _resume_after(off: int, *, drafter_token: float = 0.0, cap: int = 512) -> tuple[float, list[StepShape]]:
    # Step 1 prefills (skipped: every planned depth is 0; the 3 prompt tokens are replayed later), `off` steps skip
    # the drafter (one token each at depth 0), then the drafter runs at depth 1 for the rest of the request.
    rec = _Recorder(FittedStepCost(BASE, drafter_token_ms=drafter_token))
    acc = AcceptanceModel({"a": NEVER}, 4)
    run = simulate(one(off + 6), _Scripted((0,) * (off + 1) + (1,)), rec, acc, concurrency=1,
                   max_catch_up_tokens=cap)
    assert run.output_tokens == off + 6
    return run.duration_ms, rec.shapes


@pytest.mark.parametrize("off", [1, 4, 9])
def test_a_resume_after_n_off_steps_replays_n_tokens_and_the_prompt(off: int) -> None:
    _, shapes = _resume_after(off)
    assert shapes[0].prefill_tokens == 3 and shapes[0].drafter_idle  # the prompt step skips the drafter
    assert [s.drafter_idle for s in shapes[1:off + 1]] == [True] * off
    resume = shapes[off + 1]
    assert resume.drafting_depth == 1 and resume.catch_up_tokens == 3 + off
    assert sum(s.catch_up_tokens for s in shapes) == 3 + off  # once: the following steps draft, nothing is missed


def test_a_resume_costs_its_replay_of_drafter_work_more_than_one_without() -> None:
    # BASE has no per-token cost, so the skipped prompt saves nothing here: the difference is the replay alone.
    for off in (1, 4, 9):
        without, _ = _resume_after(off)
        priced, _ = _resume_after(off, drafter_token=0.5)
        assert priced - without == pytest.approx((3 + off) * 0.5)


def test_a_request_that_missed_more_than_the_cap_is_not_caught_up() -> None:
    _, shapes = _resume_after(5, cap=4)  # 3 prompt tokens (within the cap: skipped) + 5 off-step tokens > 4
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


class _ExploreRule(_ScriptedRule):
    """Every request at depth 0, except at step ``at``: the first request explores at depth 1 (the others stay 0)."""

    def __init__(self, at: int) -> None:
        super().__init__([0])
        self.at = at

    def plan(self, request_ids: Sequence[str], scheduled: int) -> tuple[list[int], int]:
        step, self.calls = self.calls, self.calls + 1
        if step == self.at:
            return [1 if i == 0 else 0 for i in range(len(request_ids))], 1
        if step > self.at:
            return [1] * len(request_ids), 1
        return [0] * len(request_ids), 0


@dataclass(frozen=True)
class _Explore(_Scripted):
    def start(self) -> _ScriptedRule:
        return _ExploreRule(3)


def test_an_exploration_replays_only_the_explorers_missed_tokens() -> None:
    # Two requests, both prompts (3 tokens) and two decode steps skipped: 5 missed tokens each. At step 3 one request
    # explores: only it replays (5); the other keeps its 5 and misses this step's token too, and replays 6 when it
    # drafts at step 4 (the plugin names the drafting requests, `DRAFTING_ATTR`).
    rec = _Recorder(_termed())
    reqs = (SimRequest(0, "a", 3, 8), SimRequest(1, "a", 3, 8))
    run = simulate([Phase("p", reqs)], _Explore(()), rec, AcceptanceModel({"a": NEVER}, 4), concurrency=2)
    assert run.output_tokens == 16
    assert [s.drafter_idle for s in rec.shapes[:3]] == [True] * 3
    assert rec.shapes[3].catch_up_tokens == 5 and rec.shapes[4].catch_up_tokens == 6
    assert run.catch_up_tokens == 11


# ------------------------------------------------------------------------------------ per-shape means, refitted
def test_mean_cost_model_refits_the_same_form_and_prices_the_means() -> None:
    truth = StepCostModel({"base": 3.0, "per_request": 0.5, "per_verified_token": 0.25, "drafter_fixed": 2.0,
                           "drafter_per_request": 0.4}, forgetting=0.9)
    spec = [StepSample(b, k, truth.predict_tokens(b, b * (k + 1), True, k), n=10, verified_tokens=b * (k + 1),
                       drafter_ran=True) for b in (1, 2, 4) for k in range(4)]
    base = [StepSample(b, 0, truth.predict_tokens(b, b, False), n=50, verified_tokens=b, drafter_ran=False)
            for b in (1, 2, 4)]
    model = mean_cost_model(truth, spec, base)
    assert (model.sequential, model.forgetting) == (False, 0.9)
    # Exact samples of a linear model: the refit gives it back, e.g. B = 1, depth 1: 3 + 0.5 + 2 x 0.25 + 2 + 0.4.
    assert model.predict_tokens(1, 2, True, 1) == pytest.approx(6.4, rel=1e-6)
    assert model.predict_tokens(4, 4, False) == pytest.approx(3.0 + 2.0 + 1.0, rel=1e-6)


TRUTH = StepCostModel({"base": 3.0, "per_request": 0.5, "per_verified_token": 0.25, "drafter_fixed": 2.0,
                       "drafter_per_request": 0.4})
"""What the profile's launches paid per step on average (the per-shape means follow it exactly)."""
TAIL = 1.1
"""The stored fit (on medians) is 10% below the means: ``TRUTH / TAIL``."""


def _means_record(with_means: bool = True) -> dict[str, Any]:
    """A profile as `ProfileResult.to_dict` gives it: the fit on medians, and (``with_means``) per-shape means."""
    spec = [{"batch_size": b, "depth": k, "step_ms": TRUTH.predict_tokens(b, b * (k + 1), True, k), "n": 10,
             "verified_tokens": b * (k + 1), "drafter_ran": True} for b in (1, 2, 4) for k in range(4)]
    base = [{"batch_size": b, "depth": 0, "step_ms": TRUTH.predict_tokens(b, b, False), "n": 50,
             "verified_tokens": b, "drafter_ran": False} for b in (1, 2, 4)]
    medians = StepCostModel({k: v / TAIL for k, v in TRUTH.coefficients.items()}, forgetting=0.9)
    return {"profile_id": 5, "model": "target", "drafter": "drafter-2l", "method": "eagle3", "max_k": 3,
            "parallel_drafting": True, "acceptance": {"a": {"num_drafts": 100, "accepted_per_position": [50, 25, 12]}},
            "cost_model": medians.to_dict(),
            "step_means": {"speculative": spec, "baseline": base} if with_means else None}


def test_a_profile_with_per_shape_means_prices_steps_with_their_refit() -> None:
    record = _means_record()
    setup = profile_setup(record, {"w": one(8)})
    assert "fit on per-shape means" in setup.cost.label
    spec, base = profile_step_means(record) or ([], [])
    refit = mean_cost_model(StepCostModel.from_dict(record["cost_model"]), spec, base)
    # B = 2 verifying depth 2 with the drafter: 3 + 2 x 0.5 + 6 x 0.25 + 2 + 2 x 0.4 = 8.3 ms (TRUTH, not / 1.1).
    shape = StepShape(2, 6, 2, 100.0)
    assert setup.cost.step_ms(shape) == pytest.approx(refit.predict_tokens(2, 6, True, 2), rel=1e-9)
    assert setup.cost.step_ms(shape) == pytest.approx(8.3, rel=1e-6)
    assert setup.cost.step_ms(StepShape(4, 4, 0, 100.0)) == pytest.approx(3.0 + 2.0 + 1.0, rel=1e-6)
    # The controller starts from the stored fit, as it does in production.
    assert setup.controller_cost[True].coefficients == StepCostModel.from_dict(record["cost_model"]).coefficients


def test_a_profile_without_means_or_told_not_to_use_them_prices_with_its_stored_fit() -> None:
    for setup in (profile_setup(_means_record(with_means=False), {"w": one(8)}),
                  profile_setup(_means_record(), {"w": one(8)}, step_means=False)):
        assert "fit on per-shape medians" in setup.cost.label
        assert setup.cost.step_ms(StepShape(2, 6, 2, 100.0)) == pytest.approx(8.3 / TAIL, rel=1e-9)
    assert profile_step_means(_means_record(with_means=False)) is None


def test_the_draft_fetch_is_paid_after_a_drafting_step_only() -> None:
    # 10 ms step, 4 ms drafter, 0.16 ms fetch: a drafting step 14.16, a skipped drafter's step (the plugin skips the
    # fetch after an off-step) and a plain engine's step 10.
    cost = FittedStepCost(BASE, draft_fetch_ms=0.16)
    assert cost.step_ms(StepShape(1, 2, 1, 50.0)) == pytest.approx(14.16)
    assert cost.step_ms(StepShape(1, 1, 0, 50.0, drafter_idle=True)) == pytest.approx(10.0)
    assert cost.step_ms(StepShape(1, 1, 0, 50.0)) == pytest.approx(10.0)
    assert "draft fetch" in cost.label
    with pytest.raises(UsageError, match="draft_fetch_ms"):
        FittedStepCost(BASE, draft_fetch_ms=-0.1)


def test_under_prefix_caching_the_prompt_is_read_and_only_decode_steps_are_replayed() -> None:
    # catch_up_decode: the prompt step runs the drafter at one slot (reads the prompt: 34 ms, not 25.5); the 2 decode
    # off-steps still skip it, and the step that drafts again replays their 2 tokens only.
    run, shapes = _run(_Scripted((0, 0, 0, 1), off_steps="catch_up_decode"), 10)
    assert shapes[0].drafting_depth == 1 and not shapes[0].drafter_idle and shapes[0].prefill_tokens == PROMPT
    assert [s.drafter_idle for s in shapes[1:3]] == [True, True]
    assert shapes[3].drafting_depth == 1 and shapes[3].catch_up_tokens == 2
    assert run.catch_up_tokens == 2 and run.skipped_prompt_steps == 0
    assert run.duration_ms == pytest.approx(READ_PROMPT_MS + 2 * IDLE_DECODE_MS + DRAFT_DECODE_MS + 0.25 * 2
                                           + 6 * VERIFY_ONE_MS)


def test_the_prompt_price_is_the_no_speculation_prompt_steps_time_beyond_their_decode_step() -> None:
    fit = StepCostModel({"base": 2.0, "per_request": 0.5, "per_verified_token": 0.1})
    steps = {"baseline": [
        # 4 steps of one request with 100 prompt tokens: 4 * 12.6 = 50.4 ms; the decode step of batch 1 is 2.6 ms.
        {"phase": "c1", "drafter_ran": False, "n": 4, "sum_ms": 50.4, "prompt_tokens": 400, "requests": 4},
        # 2 steps of 3 requests (a prompt of 150 tokens each): decode step of batch 3: 3.8 ms; 2 * (3.8 + 12.0).
        {"phase": "c4", "drafter_ran": False, "n": 2, "sum_ms": 31.6, "prompt_tokens": 300, "requests": 6},
        {"phase": "warmup", "drafter_ran": False, "n": 9, "sum_ms": 999.0, "prompt_tokens": 9, "requests": 9},
    ], "speculative": [
        {"phase": "c1", "drafter_ran": True, "n": 4, "sum_ms": 999.0, "prompt_tokens": 400, "requests": 4},
    ]}
    # (4 * 10.0 + 2 * 12.0) ms over 700 prompt tokens.
    assert prompt_token_costs(steps, fit) == (pytest.approx(64.0 / 700), 700)
    assert prompt_token_costs({"speculative": steps["speculative"]}, fit) is None
    assert prompt_token_costs({"baseline": steps["baseline"][2:]}, fit) is None  # the warm-up alone


def test_a_stored_profile_with_prompt_steps_prices_a_prompt_token_at_what_its_baseline_measured() -> None:
    # The no-speculation launch's prompt steps at batch 1: 6.4 ms over the refit's decode step of batch 1
    # (TRUTH: 3 + 0.5 + 0.25 = 3.75 ms) for 80 prompt tokens: 0.08 ms a prompt token.
    steps = {"baseline": [{"phase": "c1", "drafter_ran": False, "n": 2, "sum_ms": 2 * (3.75 + 6.4),
                           "prompt_tokens": 160, "requests": 2}]}
    stored = {**_means_record(), "notes": {"prompt_steps": steps}}  # as `store_profile` keeps it
    for record in (stored, {**_means_record(), "prompt_steps": steps}):  # and as `ProfileResult.to_dict` gives it
        setup = profile_setup(record, {"w": one(8)})
        assert "0.08 ms per prompt token" in setup.cost.label
        # A lone prompt of 100 tokens without speculation: the decode step of batch 1 plus 100 x 0.08 ms.
        assert setup.cost.step_ms(StepShape(0, 0, 0, 100.0, 100, 1)) == pytest.approx(3.5 + 8.0, rel=1e-6)
    assert "per prompt token" not in profile_setup(_means_record(), {"w": one(8)}).cost.label


def test_malformed_prompt_steps_in_a_stored_profile_are_skipped_not_raised() -> None:
    fit = StepCostModel({"base": 2.0, "per_request": 0.5, "per_verified_token": 0.1})
    good = {"phase": "c1", "drafter_ran": False, "n": 4, "sum_ms": 50.4, "prompt_tokens": 400, "requests": 4}
    junk: list[Any] = ["x", None, {"n": "many"}, {**good, "sum_ms": float("nan")}, {**good, "sum_ms": None}]
    assert prompt_token_costs({"baseline": [*junk, good]}, fit) == (pytest.approx(0.1), 400)
    assert prompt_token_costs({"baseline": junk}, fit) is None
