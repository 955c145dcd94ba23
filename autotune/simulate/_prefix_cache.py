"""vLLM's automatic prefix caching for repeated prompts, as the simulator applies it (pure logic).

vLLM (prefix caching on, its default) keeps the KV of every *full* block a prompt computed, keyed by the tokens up to
it; a later request whose prompt starts with the same blocks reuses them and computes only the rest, always at least
its last token. The simulator knows a prompt by `SimRequest.prompt_key` (equal keys: equal prompts), so it matches
exact repeats only, not prompts that merely share a prefix; the cache is unbounded (no eviction), and blocks the
scheduler plugin's prefix-cache guard evicts (prompts the drafter left out) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.errors import UsageError
from autotune.simulate._requests import SimRequest

__all__ = ["PrefixCache"]


@dataclass
class PrefixCache:
    """The prompts whose full blocks are cached (by key). ``block_size``: vLLM's (16 on GPUs by default, 128 for the
    CPU backend).

    Example: ``PrefixCache(128, {"p"}).cached_tokens(SimRequest(0, "c", 150, 8, prompt_key="p")) == 128``; a prompt of
    128 tokens gets 0 (its one block holds its last token, which is always computed).
    """

    block_size: int
    keys: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise UsageError(f"block_size must be an integer >= 1, but got {self.block_size!r}.")

    def cached_tokens(self, request: SimRequest) -> int:
        """Prompt tokens of ``request`` found in the cache."""
        if request.prompt_key is None or request.prompt_key not in self.keys:
            return 0
        return (request.prompt_tokens - 1) // self.block_size * self.block_size

    def add(self, request: SimRequest) -> None:
        """``request``'s prompt was computed: its full blocks are cached from now on."""
        if request.prompt_key is not None:
            self.keys.add(request.prompt_key)
