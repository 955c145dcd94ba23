"""The scheduler plugin's depth rules on plain numbers: what each request verifies and drafts, what the plugin falls
back to, how a plan steps per batch size, and how one request's step outcome is counted (as vLLM counts it)."""

from __future__ import annotations

import pytest

from policies import DepthRules, PlanClock, request_outcome
from policies.plugin import DepthPlan


def test_static_mode_verifies_the_engine_k_unless_a_static_depth_is_set() -> None:
    assert DepthRules(engine_k=4).static_base == 4
    assert DepthRules(engine_k=4, static_depth=2).static_base == 2
    # A config may name a depth above the engine's K (it allows up to 64); the engine's K bounds it.
    rules = DepthRules(engine_k=4, static_depth=6)
    assert rules.apply_caps(rules.uniform(rules.static_base, {"a": False}), {}) == {"a": 4}


def test_opted_out_requests_verify_nothing_and_the_others_keep_the_base() -> None:
    rules = DepthRules(engine_k=4)
    assert rules.uniform(3, {"a": False, "b": True}) == {"a": 3, "b": 0}


def test_class_caps_lower_a_depth_but_never_raise_it() -> None:
    rules = DepthRules(engine_k=8, class_caps={"chat": 2, "code": 6})
    depths = rules.apply_caps({"a": 4, "b": 4, "c": 4}, {"a": "chat", "b": "code", "c": "math"})
    # chat: min(4, 2) = 2; code: the cap 6 is above 4, so 4 stays; math has no cap.
    assert depths == {"a": 2, "b": 4, "c": 4}


def test_without_caps_the_classes_are_not_needed() -> None:
    # The adapter only looks classes up when there are caps: an empty mapping must do.
    assert DepthRules(engine_k=3).apply_caps({"a": 5, "b": -1}, {}) == {"a": 3, "b": 0}


def test_drafting_depth_follows_the_deepest_request_only_when_lowering() -> None:
    depths = {"a": 1, "b": 3, "c": 0}
    assert DepthRules(engine_k=4, lower_drafting=True).drafting_depth(depths) == 3
    assert DepthRules(engine_k=4, lower_drafting=False).drafting_depth(depths) == 4
    # Every request opted out: a sequential drafter need not draft at all.
    assert DepthRules(engine_k=4, lower_drafting=True).drafting_depth({"a": 0}) == 0


@pytest.mark.parametrize(
    ("setting", "parallel", "engine_k", "expected"),
    [
        (None, False, 4, True),  # sequential drafter: skip passes whose drafts would be trimmed
        (None, True, 4, False),  # parallel drafting must draft at its configured K (vLLM #45695)
        (True, True, 4, True),  # an explicit setting wins
        (False, False, 4, False),
        (None, False, 0, False),  # no speculative decoding: nothing to lower
    ],
)
def test_drafting_depth_is_lowered_for_sequential_drafters_by_default(
    setting: bool | None, parallel: bool, engine_k: int, expected: bool
) -> None:
    assert DepthRules.lowers_drafting(setting, parallel, engine_k) is expected


@pytest.mark.parametrize(
    ("static_depth", "fallback", "reported"),
    [(None, None, 4), (2, 2, 2), (4, None, 4), (6, None, 4)],
)
def test_after_a_plugin_error_requests_are_trimmed_only_below_k(
    static_depth: int | None, fallback: int | None, reported: int
) -> None:
    # None: vLLM's own behaviour (depth K, no trimming); a static depth >= K trims nothing either.
    rules = DepthRules(engine_k=4, static_depth=static_depth)
    assert rules.fallback_depth == fallback
    assert rules.reported_static_depth == reported


def test_every_batch_size_walks_the_whole_plan() -> None:
    plan = DepthPlan.sweep(2, block_steps=1)  # depths 2, 0, 2, 1
    clock = PlanClock(plan.depth_at)
    # Batch size 4 runs three steps, then batch size 1 appears: it starts at the first block, not at the fourth.
    assert [clock.next_depth(4) for _ in range(3)] == [2, 0, 2]
    assert [clock.next_depth(1) for _ in range(4)] == [2, 0, 2, 1]
    assert clock.next_depth(4) == 1


@pytest.mark.parametrize(
    ("scheduled", "drafts", "sampled", "expected"),
    [
        (4, [7, 8, 9], 4, (3, 3, 0)),  # all 3 drafts accepted: 3 + the bonus token sampled
        (4, [7, 8, 9], 1, (3, 0, 0)),  # first draft rejected: only the target's own token
        (3, [7, -1], 2, (1, 1, 0)),  # a -1 placeholder is a slot, not a draft
        (4, [7, 8, 9], None, (3, 0, 0)),  # no sampler output for the request: nothing counted as accepted
        (1, [], 1, (0, 0, 0)),  # a decode step without speculation
        (33, [], 1, (0, 0, 32)),  # prefill: 32 tokens beyond the sampled position are prompt tokens
    ],
)
def test_request_outcome_counts_as_vllm_counts(
    scheduled: int, drafts: list[int], sampled: int | None, expected: tuple[int, int, int]
) -> None:
    assert request_outcome(scheduled, drafts, sampled, bonus=1) == expected
