"""The drafter-width rules on plain values (no vLLM): slots per width, where a skipped step leaves the drafter's KV
unwritten, what the handshake answers combine to, and when a step may skip the drafter."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from policies.plugin.drafter_width import DrafterSync, DrafterWidthSettings, WorkerStatus, drafting_slots
from policies.plugin.drafting import (
    DraftFetchCost,
    HandshakeResult,
    assign_placeholders,
    combine,
    drafting_requests,
    handshake,
    is_off_step,
    plan_width,
    step_has_prompt_tokens,
    wrap_draft_fetch,
)


def test_slots_follow_the_width_and_depth_zero_keeps_one_sync_slot() -> None:
    assert [drafting_slots(k, 4, parallel=True) for k in range(5)] == [1, 1, 2, 3, 4]
    assert [drafting_slots(k, 4, parallel=False) for k in range(5)] == [1] * 5  # one slot per sequential pass
    with pytest.raises(ValueError, match="0 <= k <= k_max"):
        drafting_slots(5, 4, parallel=True)


def test_a_skipped_run_is_replayed_from_the_first_unwritten_position() -> None:
    sync = DrafterSync()
    # Query starts 40 and 41 skipped: 40 was the previous drafting step's bonus slot (written); 41.. are not.
    sync.mark_skipped("r", 40)
    sync.mark_skipped("r", 41)
    assert sync.take("r", 43) == 41 and not sync.pending("r")  # replay 41, 42 before the query at 43
    assert sync.take("r", 44) is None  # nothing missing any more
    sync.mark_skipped("p", 90)
    assert sync.take("p", 12) is None  # recomputed from an earlier position (preempted): nothing to replay
    sync.mark_skipped("gone", 5)
    sync.prune(["r"])
    assert not sync.pending("gone")


def test_a_skipped_prompt_is_replayed_from_its_first_position() -> None:
    sync = DrafterSync()
    # A new request's prompt step (query 0..29) skipped: no drafter pass wrote any position, position 0 included.
    assert sync.gap("p", 0, True, 30) == 30  # what a catch-up would replay if this step skipped too
    sync.mark_skipped("p", 0, fresh=True)
    sync.mark_skipped("p", 30)  # a decode step skipped after it: the hole still starts at 0
    assert sync.gap("p", 31, False, 32) == 32
    assert sync.take("p", 32) == 0  # the first drafting step replays the prompt and the output so far
    # A prompt served partly from the prefix cache starts at its first computed position.
    sync.mark_skipped("c", 16, fresh=True)
    assert sync.take("c", 40) == 16


def test_settings_reject_unknown_keys_and_modes() -> None:
    assert DrafterWidthSettings.from_dict(None) == DrafterWidthSettings()
    with pytest.raises(ValueError, match="unknown drafter-width settings"):
        DrafterWidthSettings.from_dict({"offsteps": "holes"})
    with pytest.raises(ValueError, match="off_steps must be one of"):
        DrafterWidthSettings(off_steps="never")


def _worker(rank: int = 0, **changes: Any) -> WorkerStatus:
    fields: dict[str, Any] = {"installed": True, "rank": rank, "k_max": 4, "method": "draft_model", "parallel": True,
                              "lower_width": True, "off_steps": "catch_up"}
    fields.update(changes)
    return WorkerStatus(**fields)


def test_every_worker_must_answer_for_the_width_to_be_lowered() -> None:
    both = combine([_worker(0), _worker(1)])
    assert both.lower_width and both.skip_drafter and both.off_steps == "catch_up"
    one_missing = combine([_worker(0), _worker(1, installed=False, reason="no drafter")])
    assert not one_missing.lower_width and not one_missing.skip_drafter and "worker 1: no drafter" in str(
        one_missing.reason)
    mixed = combine([_worker(0), _worker(1, off_steps="sync_pass", reason="async")])
    assert mixed.lower_width and not mixed.skip_drafter  # one worker cannot skip: nobody skips
    assert not combine([]).lower_width


def test_an_engine_without_the_extension_refuses_with_the_fix() -> None:
    class NoExtension:
        def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = ()) -> Any:
            raise NotImplementedError(f"Method {method!r} is not implemented.")

    result = handshake(NoExtension())
    assert not result.lower_width and "worker_extension_cls" in str(result.reason)
    assert "no model executor" in str(handshake(None).reason)


def _output(scheduled: dict[str, int], spec: dict[str, list[int]], new: bool = False) -> Any:
    return SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens=spec,
                           scheduled_new_reqs=[object()] if new else [], num_spec_tokens_to_schedule=4)


def test_a_step_skips_the_drafter_only_at_width_zero_and_prompts_only_when_caught_up() -> None:
    live = combine([_worker()])
    decode = _output({"a": 1, "b": 3}, {"b": [7, 8]})
    assert plan_width([0, 0], 4) == 0 and plan_width([0, 2, 9], 4) == 4 and plan_width([], 4) == 0
    assert not step_has_prompt_tokens(decode) and is_off_step(decode, 0, live)
    assert not is_off_step(decode, 1, live)  # something to draft
    assert not is_off_step(decode, 0, HandshakeResult.refused("no patch"))
    chunk = _output({"a": 1, "c": 40}, {})  # "c" computes prompt tokens
    assert step_has_prompt_tokens(chunk)
    # Workers that catch up replay a skipped prompt when the request first drafts; without catch-up the drafter
    # must see the prompt now.
    assert is_off_step(chunk, 0, live) and is_off_step(_output({"a": 1}, {}, new=True), 0, live)
    holes = combine([_worker(off_steps="holes")])
    assert holes.skip_drafter and is_off_step(decode, 0, holes)
    assert not is_off_step(chunk, 0, holes) and not is_off_step(_output({"a": 1}, {}, new=True), 0, holes)


def test_async_placeholders_follow_each_request_depth_within_the_width() -> None:
    requests = {r: SimpleNamespace(is_prefill_chunk=False, spec_token_ids=[-1] * 4) for r in ("a", "b", "c")}
    requests["p"] = SimpleNamespace(is_prefill_chunk=True, spec_token_ids=[])
    output = _output(dict.fromkeys(("a", "b", "c", "p"), 1), {})
    output.num_spec_tokens_to_schedule = 2
    changed = assign_placeholders(requests, output, {"a": 0, "b": 1, "c": 3, "p": 2})
    assert [requests[r].spec_token_ids for r in ("a", "b", "c", "p")] == [[], [-1], [-1, -1], []]
    assert changed == 3  # "c" is clamped to the drafted width 2; the prefill chunk keeps none


def test_only_requests_planned_above_zero_are_named_for_the_catch_up() -> None:
    # An exploration (one request at its cap, the rest at 0) must not replay every request's history.
    assert drafting_requests({"explorer": 4, "a": 0, "b": 0}) == frozenset({"explorer"})
    assert drafting_requests({"a": 1, "b": 4}) is None  # everyone drafts: nothing to tell the workers


def test_no_draft_fetch_from_the_workers_after_an_off_step_and_every_fetch_is_timed() -> None:
    class Executor:
        max_concurrent_batches = 1

        def __init__(self) -> None:
            self.fetches = 0

        def take_draft_token_ids(self) -> Any:
            self.fetches += 1
            return "drafts"

    executor, off, timed = Executor(), [True], []
    assert wrap_draft_fetch(executor, lambda: off[0], timed.append)
    assert executor.take_draft_token_ids() is None and executor.fetches == 0  # off-step: no round trip
    assert timed == []  # nothing fetched, nothing timed
    off[0] = False
    assert executor.take_draft_token_ids() == "drafts" and executor.fetches == 1
    assert len(timed) == 1 and timed[0] >= 0.0
    always = Executor()  # trimming or static depth: every step fetches, and is timed
    assert wrap_draft_fetch(always, None, timed.append)
    assert always.take_draft_token_ids() == "drafts" and len(timed) == 2

    def broken(ms: float) -> None:
        raise RuntimeError("stats")

    guarded = Executor()  # a failing record never costs the engine its drafts
    assert wrap_draft_fetch(guarded, None, broken)
    assert guarded.take_draft_token_ids() == "drafts"
    pipelined = Executor()
    pipelined.max_concurrent_batches = 2  # the step just executed is not the one last scheduled
    assert not wrap_draft_fetch(pipelined, lambda: True, timed.append)
    assert pipelined.take_draft_token_ids() == "drafts"
    assert not wrap_draft_fetch(None, lambda: True, timed.append)


def test_a_step_the_drafts_are_fetched_after_costs_the_smoothed_fetch_and_an_outlier_moves_it_little() -> None:
    cost = DraftFetchCost()
    assert cost.step_cost(10.0, fetched=True) == 10.0  # nothing timed yet: the step as measured
    cost.observe(0.7)
    assert cost.step_cost(10.0, fetched=True) == pytest.approx(10.7)
    assert cost.step_cost(5.0, fetched=False) == 5.0  # an off-step: no fetch follows it
    cost.observe(0.8)
    assert cost.ms == pytest.approx(0.7 + 0.1 * (0.8 - 0.7))  # smoothing 0.1
    before = cost.ms
    cost.observe(50.0)  # a preempted fetch counts as 4x the estimate: +0.3x, not +7 ms
    assert cost.ms == pytest.approx(before + 0.1 * (4 * before - before))
    for bad in (float("nan"), float("inf"), -1.0):
        cost.observe(bad)
    assert cost.ms == pytest.approx(before * 1.3)


def test_off_steps_replay_only_for_token_only_drafters_under_sync_scheduling() -> None:
    from policies import off_step_mode

    assert off_step_mode("catch_up", token_only=True, async_scheduling=False) == ("catch_up", None)
    mode, why = off_step_mode("catch_up", token_only=False, async_scheduling=False)  # an EAGLE head
    assert mode == "sync_pass" and "hidden states" in str(why)
    assert off_step_mode("holes", token_only=True, async_scheduling=True)[0] == "sync_pass"
    assert off_step_mode("holes", token_only=False, async_scheduling=False) == ("holes", None)
    with pytest.raises(ValueError, match="off_steps must be one of"):
        off_step_mode("never", token_only=True, async_scheduling=False)


def test_under_prefix_caching_no_prompt_is_left_to_a_replay() -> None:
    from policies import off_step_mode

    mode, why = off_step_mode("catch_up", token_only=True, async_scheduling=False, prefix_caching=True)
    assert mode == "catch_up_decode" and "prefix caching" in str(why)
    # What does not leave prompts unread stays as it is; async and EAGLE heads still run a sync pass.
    assert off_step_mode("holes", token_only=True, async_scheduling=False, prefix_caching=True)[0] == "holes"
    assert off_step_mode("catch_up", token_only=False, async_scheduling=False, prefix_caching=True)[0] == "sync_pass"
    assert off_step_mode("catch_up_decode", token_only=True, async_scheduling=True)[0] == "sync_pass"
    # The scheduler marks a step with prompt tokens as an off-step only when the workers leave prompts to a replay.
    prompt_step = SimpleNamespace(scheduled_new_reqs=[object()], num_scheduled_tokens={"a": 5},
                                  scheduled_spec_decode_tokens={})
    assert is_off_step(prompt_step, 0, HandshakeResult(True, True, "catch_up", None, ()))
    assert not is_off_step(prompt_step, 0, HandshakeResult(True, True, "catch_up_decode", None, ()))
