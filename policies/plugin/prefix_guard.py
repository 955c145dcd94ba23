"""Engine-core guard that lets the drafter leave prompts unread under vLLM's prefix caching.

The workers' off-steps and prompt deferral (`policies.plugin.drafter_width`) leave the drafter KV of some prompt
tokens unwritten until the request drafts (a request that never drafts never pays for its prompt in the drafter).
vLLM caches a prompt's full blocks when it allocates them, before the step runs, and a cached block carries the
drafter's KV too: a later request with the same prefix would read drafter KV nobody wrote (its drafts, not its
outputs, change). So, after each ``schedule()``, for every request whose prompt tokens the drafter may leave out in
this step (`cut_candidates`), this guard either

- evicts the blocks those tokens fill from the prefix cache (vLLM's ``KVCacheManager.evict_blocks``: the request
  keeps them, nobody else finds them), remembering their hashes (bounded), or
- asks the drafter to read the prompt (returned to the scheduler, which adds the request to the step's drafting
  set), when the prompt is shared: another request of the same step already holds one of those blocks (a prefix hit
  in the same ``schedule()``; ref count above 1), or a block's hash is one this guard evicted before (the same
  prefix came back, so reading it once keeps it cached for the next ones).

Outputs never depend on any of this; acceptance of requests that reuse a prefix does. Without the guard the workers
read every prompt under prefix caching (``catch_up_decode`` in `policies._off_steps`). Blocks of generated tokens a
skipped decode step left unwritten are not guarded (only a request repeating prompt and output exactly reuses them).

Duck-typed on vLLM 0.32's scheduler objects; nothing here imports vLLM.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["PrefixCacheGuard", "cut_candidates"]


def cut_candidates(output: Any, reads: frozenset[str] | None) -> list[str]:
    """Requests of the step whose query computes prompt tokens (more than one token beyond their verified drafts)
    and that are not in `reads` (the requests the drafter reads in full; None: all of them).

    Example: with ``num_scheduled_tokens={"a": 40, "b": 3}``, ``scheduled_spec_decode_tokens={"b": [7, 8]}`` (and
    ``total_num_scheduled_tokens=43``):
    ``cut_candidates(output, frozenset()) == ["a"]``; ``cut_candidates(output, None) == []``.
    """
    if reads is None:
        return []
    spec = output.scheduled_spec_decode_tokens
    scheduled = output.num_scheduled_tokens
    if not spec and output.total_num_scheduled_tokens == len(scheduled):  # one token each: O(1), the off-step case
        return []
    return [r for r, n in scheduled.items() if r not in reads and n > 1 + len(spec.get(r, ()))]


class PrefixCacheGuard:
    """See the module docstring. `settle` runs once per step; the counters go to the plugin's stats."""

    MAX_REMEMBERED = 1 << 16
    """Evicted block hashes remembered (oldest forgotten first): ~5 MB at most."""

    def __init__(self, kv_cache_manager: Any, max_remembered: int = MAX_REMEMBERED) -> None:
        self._manager = kv_cache_manager
        groups = kv_cache_manager.kv_cache_config.kv_cache_groups
        self._block_sizes = tuple(int(g.kv_cache_spec.block_size) for g in groups)
        self._blocks_of = kv_cache_manager.coordinator.get_blocks  # per KV cache group, the request's blocks
        self._evicted: OrderedDict[Any, None] = OrderedDict()
        self._max = max(1, int(max_remembered))
        self.counters: dict[str, int] = {"cut_prompts": 0, "evicted_blocks": 0, "read_prompts": 0}

    @classmethod
    def for_scheduler(cls, scheduler: Any) -> PrefixCacheGuard | None:
        """The guard for a vLLM scheduler with prefix caching on, or None (caching off, or a KV cache manager
        without what the guard uses)."""
        manager = getattr(scheduler, "kv_cache_manager", None)
        if not getattr(manager, "enable_caching", False) or not callable(getattr(manager, "evict_blocks", None)):
            return None
        try:
            return cls(manager)
        except (AttributeError, TypeError, ValueError):
            return None

    def settle(self, output: Any, requests: Mapping[str, Any], reads: frozenset[str] | None) -> frozenset[str]:
        """After ``schedule()`` (whose ``_update_after_schedule`` already counted this step's tokens as computed):
        evict the blocks each cut candidate fills in this step, or return the candidates whose prompt is shared
        (the drafter must read them)."""
        shared: list[str] = []
        evict: list[Any] = []
        scheduled = output.num_scheduled_tokens
        for req_id in cut_candidates(output, reads):
            request = requests.get(req_id)
            if request is None:
                continue
            end = int(request.num_computed_tokens)
            blocks = list(self._blocks_filled(req_id, end - int(scheduled[req_id]), end))
            if any(b.ref_cnt > 1 or (b.block_hash is not None and b.block_hash in self._evicted) for b in blocks):
                shared.append(req_id)
            else:
                evict.extend(b for b in blocks if b.block_hash is not None)
                self.counters["cut_prompts"] += 1
        if evict:
            remembered = self._evicted
            for block in evict:
                remembered[block.block_hash] = None
                remembered.move_to_end(block.block_hash)
            while len(remembered) > self._max:
                remembered.popitem(last=False)
            self._manager.evict_blocks({b.block_id for b in evict})
            self.counters["evicted_blocks"] += len(evict)
        self.counters["read_prompts"] += len(shared)
        return frozenset(shared)

    def _blocks_filled(self, req_id: str, start: int, end: int) -> Iterable[Any]:
        """The request's blocks, in every KV cache group, that hold any of positions start .. end - 1."""
        for size, blocks in zip(self._block_sizes, self._blocks_of(req_id), strict=False):
            for block in blocks[start // size: -(-end // size)]:
                if not block.is_null:
                    yield block
