"""The worker patch's drafter input in a drafting step that admits a request planned at depth 0: its prompt is cut to
its last token and replayed, whole, in the first step that drafts for it. A fake model runner and drafter with vLLM's
attribute names (the real engine runs in tests/test_drafter_width_vllm.py); torch tensors as the runner passes them."""

from __future__ import annotations

import dataclasses
import importlib.util
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

K = 4
PROMPT_P, PROMPT_E = 10, 6  # prompt lengths of the drafting request "p" and the joining request "e"


@dataclasses.dataclass(frozen=True)
class Cad:
    """The fields of vLLM's ``CommonAttentionMetadata`` the patch reads or replaces."""

    query_start_loc: Any
    query_start_loc_cpu: Any
    num_actual_tokens: int
    max_query_len: int
    _num_computed_tokens_cache: Any = None
    _token_to_req_indices_cache: Any = None

    def replace(self, **changes: Any) -> Cad:
        return dataclasses.replace(self, **changes)


class DraftModelProposer:
    """Records what each ``propose`` call received (the patch keys on this class name)."""

    pass_hidden_states_to_model = False
    max_num_tokens = 4096

    def __init__(self) -> None:
        self.extra_slots_per_request = K
        self.net_num_new_slots_per_request = K
        self.needs_extra_input_slots = True
        self.calls: list[dict[str, Any]] = []

    def propose(self, k: int, ids: Any, positions: Any, hidden: Any, next_ids: Any, sample_at: Any, cad: Cad,
                sampling: Any, **_: Any) -> Any:
        self.calls.append({"k": k, "ids": ids.tolist(), "positions": positions.tolist(),
                           "qsl": cad.query_start_loc_cpu.tolist(), "max_query_len": cad.max_query_len,
                           "slots": self.extra_slots_per_request})
        return [[0] * k for _ in range(len(cad.query_start_loc_cpu) - 1)]


class Runner:
    """A synchronous V1 model runner with two requests; ``step`` runs one step's drafting as vLLM's runner does."""

    def __init__(self, prefix_caching: bool = False) -> None:
        self.cache_config = SimpleNamespace(enable_prefix_caching=prefix_caching)
        self.drafter = DraftModelProposer()
        self.speculative_config = SimpleNamespace(num_speculative_tokens=K, method="draft_model",
                                                  parallel_drafting=True, disable_padded_drafter_batch=False)
        self.use_async_scheduling = False
        self.sampler = None
        self.requests: dict[str, Any] = {}
        tokens = np.zeros((2, 64), dtype=np.int64)
        tokens[0] = np.arange(100, 164)
        tokens[1] = np.arange(200, 264)
        self.input_batch = SimpleNamespace(num_reqs=2, req_ids=["p", "e"], token_ids_cpu=tokens,
                                           num_computed_tokens_cpu=np.zeros(2, dtype=np.int32),
                                           num_prompt_tokens=np.array([PROMPT_P, PROMPT_E], dtype=np.int32))

    def _sample(self, logits: Any, metadata: Any) -> Any:
        raise AssertionError("not called here")

    def propose_draft_token_ids(self, scheduler_output: Any, sampled: Any) -> Any:
        """vLLM's runner: the drafter reads every scheduled token of the step, request by request."""
        import torch

        batch = self.input_batch
        ids: list[int] = []
        positions: list[int] = []
        qsl = [0]
        for i, req_id in enumerate(batch.req_ids):
            start = int(batch.num_computed_tokens_cpu[i])
            n = scheduler_output.num_scheduled_tokens[req_id]
            ids.extend(batch.token_ids_cpu[i, start:start + n].tolist())
            positions.extend(range(start, start + n))
            qsl.append(qsl[-1] + n)
        loc = torch.tensor(qsl, dtype=torch.int32)
        cad = Cad(loc, loc, qsl[-1], max(b - a for a, b in zip(qsl, qsl[1:], strict=False)))
        return self.drafter.propose(scheduler_output.num_spec_tokens_to_schedule, torch.tensor(ids),
                                    torch.tensor(positions), None, None, None, cad, None)

    def step(self, computed: tuple[int, int], scheduled: dict[str, int], new: tuple[str, ...] = (),
             drafting: frozenset[str] | None = None, width: int = K) -> dict[str, Any]:
        self.input_batch.num_computed_tokens_cpu[:] = computed
        output = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new], scheduled_spec_decode_tokens={},
            scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=()), num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()), num_spec_tokens_to_schedule=width)
        if drafting is not None:
            output.peagle_drafting_reqs = drafting
        self.propose_draft_token_ids(output, None)
        return self.drafter.calls[-1]


def _patched(prefix_caching: bool = False, **settings: Any) -> tuple[Runner, Any]:
    from policies.plugin.drafter_width import DrafterWidthSettings, install

    runner = Runner(prefix_caching)
    status = install(runner, DrafterWidthSettings(**settings))
    # Without the engine core's prefix-cache guard, the workers read every prompt under prefix caching.
    unguarded = prefix_caching and not settings.get("prefix_cache_guard", True)
    assert status.installed and status.off_steps == ("catch_up_decode" if unguarded else "catch_up"), status
    return runner, runner._peagle_drafter_width  # type: ignore[attr-defined]


def test_a_joining_prompt_at_depth_zero_is_cut_to_its_last_token_and_replayed_when_it_drafts() -> None:
    runner, patch = _patched()
    # Step 1: "p" decodes (query start 20) and drafts; "e" joins with its 6-token prompt, planned at depth 0.
    first = runner.step((20, 0), {"p": 1, "e": PROMPT_E}, new=("e",), drafting=frozenset({"p"}))
    assert first["ids"] == [120, 205] and first["positions"] == [20, 5] and first["qsl"] == [0, 1, 2]
    assert first["max_query_len"] == 1 and first["slots"] == K
    assert patch.counters["deferred_prompts"] == 1 and patch.counters["deferred_prompt_tokens"] == PROMPT_E - 1
    # Step 2: both draft (no partial set). "e" decodes its first output (query start 6, after its 6 prompt tokens)
    # and replays positions 0..5 before it, so the drafter has its whole prompt.
    second = runner.step((21, PROMPT_E), {"p": 1, "e": 1})
    assert second["ids"] == [121, *range(200, 207)] and second["positions"] == [21, *range(0, 7)]
    assert second["qsl"] == [0, 1, 8]
    assert patch.counters["caught_up_requests"] == 1 and patch.counters["caught_up_tokens"] == PROMPT_E
    assert patch.counters["abandoned_holes"] == 0
    # Step 3: nothing left to replay.
    assert runner.step((22, PROMPT_E + 1), {"p": 1, "e": 1})["qsl"] == [0, 1, 2]


def test_a_drafting_request_and_a_prompt_too_long_to_replay_are_read_whole() -> None:
    # max_catch_up_tokens 4: a later replay of e's 6 prompt tokens would be abandoned, so the drafter reads them now.
    runner, patch = _patched(max_catch_up_tokens=4)
    step = runner.step((20, 0), {"p": 1, "e": PROMPT_E}, new=("e",), drafting=frozenset({"p"}))
    assert step["qsl"] == [0, 1, 1 + PROMPT_E] and patch.counters["deferred_prompts"] == 0
    # A joining request that drafts itself reads its prompt whole.
    runner, patch = _patched()
    step = runner.step((20, 0), {"p": 1, "e": PROMPT_E}, new=("e",), drafting=frozenset({"p", "e"}))
    assert step["ids"] == [120, *range(200, 206)] and patch.counters["deferred_prompts"] == 0


def test_with_deferral_off_the_drafter_reads_every_prompt() -> None:
    runner, patch = _patched(defer_idle_prompts=False)
    step = runner.step((20, 0), {"p": 1, "e": PROMPT_E}, new=("e",), drafting=frozenset({"p"}))
    assert step["ids"] == [120, *range(200, 206)] and step["qsl"] == [0, 1, 7]
    assert patch.counters["deferred_prompts"] == 0


def test_under_prefix_caching_without_the_guard_every_prompt_is_read_and_a_width_zero_pass_replays_nothing() -> None:
    runner, patch = _patched(prefix_caching=True, prefix_cache_guard=False)
    step = runner.step((20, 0), {"p": 1, "e": PROMPT_E}, new=("e",), drafting=frozenset({"p"}))
    assert step["ids"] == [120, *range(200, 206)] and patch.counters["deferred_prompts"] == 0
    # "p" missed positions 21.. in skipped decode steps; a step with a new prompt runs the drafter at width 0 (one
    # slot, nothing verified): it reads the prompt, and "p" keeps its hole for its next drafting step.
    patch.sync.mark_skipped("p", 20)
    width0 = runner.step((23, 0), {"p": 1, "e": PROMPT_E}, new=("e",), width=0)
    assert width0["ids"] == [123, *range(200, 206)] and width0["k"] == 0 and width0["slots"] == 1
    assert patch.sync.pending("p") and patch.counters["caught_up_requests"] == 0
    drafting = runner.step((24, PROMPT_E), {"p": 1, "e": 1})
    assert drafting["ids"][:4] == [121, 122, 123, 124]  # positions 21-23 replayed before p's query at 24


def test_with_the_guard_a_width_zero_pass_reads_only_the_prompts_the_scheduler_names() -> None:
    # Under prefix caching with the guard (the scheduler keeps blocks of unread prompts out of the cache), a step
    # whose depths are all 0 skips "e"'s prompt, unless the scheduler names "e" (its prompt shares cached blocks):
    # then the drafter runs at width 0 and reads it, while "p", not named, keeps its hole.
    runner, patch = _patched(prefix_caching=True)
    step = runner.step((20, 0), {"p": 1, "e": PROMPT_E}, new=("e",), drafting=frozenset({"p"}))
    assert step["ids"] == [120, 205] and patch.counters["deferred_prompts"] == 1
    runner, patch = _patched(prefix_caching=True)
    patch.sync.mark_skipped("p", 20)
    width0 = runner.step((23, 0), {"p": 1, "e": PROMPT_E}, new=("e",), width=0, drafting=frozenset({"e"}))
    assert width0["ids"] == [123, *range(200, 206)] and width0["k"] == 0 and width0["slots"] == 1
    assert patch.sync.pending("p") and patch.counters["caught_up_requests"] == 0
