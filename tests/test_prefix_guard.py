"""The prefix-cache guard's decisions (`policies.plugin.prefix_guard`) on vLLM-shaped objects: which blocks it
evicts, which prompts it asks the drafter to read. The real engine runs it in tests/test_drafter_width_vllm.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from policies.plugin.prefix_guard import PrefixCacheGuard, cut_candidates

BLOCK = 16


@dataclass
class Block:
    block_id: int
    block_hash: Any = None
    ref_cnt: int = 1
    is_null: bool = False


@dataclass
class Manager:
    """What the guard reads of vLLM's KVCacheManager, with its eviction: the hash is dropped, the block kept."""

    blocks: dict[str, list[Block]] = field(default_factory=dict)
    enable_caching: bool = True
    evicted: list[set[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec = SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=BLOCK))
        self.kv_cache_config = SimpleNamespace(kv_cache_groups=[spec])
        self.coordinator = SimpleNamespace(get_blocks=lambda req_id: (self.blocks.get(req_id, []),))

    def evict_blocks(self, ids: set[int]) -> None:
        self.evicted.append(set(ids))
        for blocks in self.blocks.values():
            for b in blocks:
                if b.block_id in ids:
                    b.block_hash = None


def prompt_blocks(first_id: int, tokens: int, hashes: list[str]) -> list[Block]:
    """Blocks of a request that computed `tokens` prompt tokens: full blocks carry a hash (vLLM caches them at
    allocation), the last partial one none."""
    full = tokens // BLOCK
    out = [Block(first_id + i, hashes[i]) for i in range(full)]
    if tokens % BLOCK:
        out.append(Block(first_id + full))
    return out


def step(scheduled: dict[str, int], spec: dict[str, list[int]] | None = None) -> Any:
    return SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens=spec or {},
                           total_num_scheduled_tokens=sum(scheduled.values()))


def reqs(**computed: int) -> dict[str, Any]:
    """Requests after ``schedule()``: num_computed_tokens already counts the step's tokens."""
    return {r: SimpleNamespace(num_computed_tokens=n) for r, n in computed.items()}


def test_candidates_are_the_prompt_queries_outside_the_drafting_set() -> None:
    out = step({"new": 40, "decode": 3, "drafts": 40, "one": 1}, {"decode": [7, 8]})
    assert cut_candidates(out, frozenset({"drafts"})) == ["new"]
    assert cut_candidates(out, None) == []  # every request drafts: no prompt is left out
    assert cut_candidates(step({"a": 1, "b": 1}), frozenset()) == []  # a decode-only step


def test_a_prompt_left_out_has_its_full_blocks_evicted_and_remembered() -> None:
    manager = Manager({"a": prompt_blocks(0, 40, ["h0", "h1"])})  # 40 tokens: 2 full blocks + 8 in a third
    guard = PrefixCacheGuard(manager)
    assert guard.settle(step({"a": 40}), reqs(a=40), frozenset()) == frozenset()
    assert manager.evicted == [{0, 1}]  # the partial block has no hash yet: nothing to evict
    assert guard.counters == {"cut_prompts": 1, "evicted_blocks": 2, "read_prompts": 0}
    # The same prompt again, in another request: its blocks carry the evicted hashes, so the prompt is shared and
    # the drafter must read it (then it stays cached for the next one).
    manager.blocks["b"] = prompt_blocks(10, 40, ["h0", "h1"])
    assert guard.settle(step({"b": 40}), reqs(b=40), frozenset()) == {"b"}
    assert manager.evicted == [{0, 1}] and guard.counters["read_prompts"] == 1


def test_a_block_another_request_of_the_step_holds_makes_the_prompt_shared() -> None:
    # "b" was admitted after "a" in the same schedule() and hit a's freshly cached first block (ref count 2): a's
    # drafter pass must write it.
    blocks = prompt_blocks(0, 32, ["h0", "h1"])
    blocks[0].ref_cnt = 2
    manager = Manager({"a": blocks, "b": [blocks[0], Block(5)]})
    guard = PrefixCacheGuard(manager)
    assert guard.settle(step({"a": 32, "b": 4}), reqs(a=32, b=20), frozenset()) == {"a"}
    # b computed 4 tokens (16..19) of its own, all in its partial block: a candidate with nothing to evict.
    assert manager.evicted == []


def test_only_the_blocks_the_step_fills_are_evicted() -> None:
    # A second prompt chunk, positions 20..51: blocks 1, 2 and 3 (block 0 was computed by the first chunk).
    manager = Manager({"a": prompt_blocks(0, 52, ["h0", "h1", "h2"])})
    guard = PrefixCacheGuard(manager)
    guard.settle(step({"a": 32}), reqs(a=52), frozenset())
    assert manager.evicted == [{1, 2}]  # block 3 is partial (48..51)
    assert manager.blocks["a"][0].block_hash == "h0"  # an earlier block stays cached


def test_requests_the_drafter_reads_are_left_alone() -> None:
    manager = Manager({"a": prompt_blocks(0, 32, ["h0", "h1"])})
    guard = PrefixCacheGuard(manager)
    assert guard.settle(step({"a": 32}), reqs(a=32), frozenset({"a"})) == frozenset()
    assert guard.settle(step({"a": 32}), reqs(a=32), None) == frozenset()
    assert manager.evicted == [] and guard.counters["cut_prompts"] == 0


def test_remembered_hashes_are_bounded_oldest_first() -> None:
    manager = Manager({"a": prompt_blocks(0, 48, ["h0", "h1", "h2"])})
    guard = PrefixCacheGuard(manager, max_remembered=2)
    guard.settle(step({"a": 48}), reqs(a=48), frozenset())
    manager.blocks["b"] = prompt_blocks(10, 16, ["h0"])  # forgotten: treated as new
    manager.blocks["c"] = prompt_blocks(20, 16, ["h2"])  # remembered: shared
    assert guard.settle(step({"b": 16, "c": 16}), reqs(b=16, c=16), frozenset()) == {"c"}


def test_no_guard_without_prefix_caching() -> None:
    assert PrefixCacheGuard.for_scheduler(SimpleNamespace(kv_cache_manager=Manager(enable_caching=False))) is None
    assert PrefixCacheGuard.for_scheduler(SimpleNamespace(kv_cache_manager=Manager())) is not None
