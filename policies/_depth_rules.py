"""The scheduler plugin's depth rules, on plain numbers: which depth each request verifies and drafts in a step, what
the plugin falls back to, and how one request's step outcome is counted.

The vLLM adapter (`policies.plugin.scheduler`) only gathers the inputs (request ids, classes, opt-outs, the engine's
K) and applies the outputs (trimming ``spec_token_ids``, setting ``num_spec_tokens_to_schedule``); every rule in
between lives here, so it is tested without an engine.

One step, for the requests that will verify drafts in the next step:

1. base depth per request: the controller's choice (adaptive mode), the `DepthPlan` depth of the step (plan mode,
   `PlanClock`), or ``static_depth`` (static mode; None: the engine's K); 0 for a request that opted out
   (`DepthRules.uniform`);
2. class caps (``class_depths``), then the engine's K bound every depth (`DepthRules.apply_caps`);
3. drafting depth: the deepest verified depth when the plugin lowers vLLM's drafting depth (sequential drafters),
   else K (`DepthRules.drafting_depth`).

Worked example: engine K=4, static depth 3, chat capped at 1, request "c" opted out; sequential drafting::

    >>> rules = DepthRules(engine_k=4, static_depth=3, class_caps={"chat": 1}, lower_drafting=True)
    >>> base = rules.uniform(rules.static_base, {"a": False, "b": False, "c": True})
    >>> base
    {'a': 3, 'b': 3, 'c': 0}
    >>> depths = rules.apply_caps(base, {"a": "code", "b": "chat", "c": "code"})
    >>> depths, rules.drafting_depth(depths)
    ({'a': 3, 'b': 1, 'c': 0}, 3)
    >>> rules.fallback_depth  # after a plugin error: every request trimmed to 3
    3
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["DepthRules", "PlanClock", "request_outcome"]


@dataclass(frozen=True)
class DepthRules:
    """Depth rules for one engine (see the module docstring for the order they apply in)."""

    engine_k: int
    """The drafter's K configured in the engine (0: no speculative decoding, nothing to decide)."""
    static_depth: int | None = None
    """Static mode's verified depth and the fallback depth after a plugin error; None: the engine's K."""
    class_caps: Mapping[str, int] = field(default_factory=dict)
    """Cap on the verified depth per request class, applied in every mode."""
    lower_drafting: bool = False
    """Lower vLLM's drafting depth to the deepest verified depth (see `lowers_drafting`)."""

    @staticmethod
    def lowers_drafting(setting: bool | None, parallel_drafting: bool, engine_k: int) -> bool:
        """Whether to lower the drafting depth: ``setting`` when given, else only for sequential drafters (parallel
        drafting must draft at its configured K, vLLM issue #45695); never without speculative decoding.

        Example: ``lowers_drafting(None, parallel_drafting=True, engine_k=4)`` -> False.
        """
        lower = (not parallel_drafting) if setting is None else setting
        return bool(lower) and engine_k > 0

    @property
    def static_base(self) -> int:
        """Static mode's base depth (before caps and the K bound)."""
        return self.engine_k if self.static_depth is None else self.static_depth

    @property
    def reported_static_depth(self) -> int:
        """The static depth as the engine can verify it (``static_depth`` bounded by K), e.g. for a gauge."""
        return self.engine_k if self.static_depth is None else min(self.static_depth, self.engine_k)

    @property
    def fallback_depth(self) -> int | None:
        """Depth every request is trimmed to after the plugin turned itself off; None: no trimming (vLLM's own K),
        also when ``static_depth`` is not below K."""
        static = self.static_depth
        return static if static is not None and static < self.engine_k else None

    def uniform(self, base: int, opted_out: Mapping[str, bool]) -> dict[str, int]:
        """``base`` for every request id in ``opted_out`` (request id -> opted out?), 0 for those that opted out."""
        return {r: 0 if out else base for r, out in opted_out.items()}

    def apply_caps(self, depths: Mapping[str, int], class_of: Mapping[str, str]) -> dict[str, int]:
        """Each request's depth capped by its class's cap (``class_of``: request id -> class, read only when there
        are caps) and bounded to [0, K] (`capped`)."""
        capped = self.capped
        if self.class_caps:
            return {r: capped(d, class_of[r]) for r, d in depths.items()}
        return {r: capped(d, None) for r, d in depths.items()}

    def capped(self, depth: int, cls: str | None) -> int:
        """One depth capped by the cap of class ``cls`` (None: no class cap) and bounded to [0, K]."""
        cap = self.class_caps.get(cls) if cls is not None and self.class_caps else None
        if cap is not None and cap < depth:
            depth = cap
        return min(max(depth, 0), self.engine_k)

    def drafting_depth(self, depths: Mapping[str, int]) -> int:
        """Drafts per request the drafter proposes in the step: the deepest verified depth when lowering, else K."""
        if self.lower_drafting and depths:
            return max(depths.values())
        return self.engine_k


class PlanClock:
    """Steps a depth schedule ``depth_at(step)`` (e.g. `DepthPlan.depth_at`) with one step counter per batch size, so
    every batch size a workload produces walks through the whole schedule.

    Example: a schedule that alternates 4 and 0 gives batch size 2 the depths 4, 0, 4 while batch size 3, seen in
    between, starts at 4 on its own::

        >>> clock = PlanClock(lambda step: (4, 0)[step % 2])
        >>> [clock.next_depth(b) for b in (2, 2, 3, 2)]
        [4, 0, 4, 4]
    """

    def __init__(self, depth_at: Callable[[int], int]) -> None:
        self._depth_at = depth_at
        self._steps: dict[int, int] = {}

    def next_depth(self, batch_size: int) -> int:
        """The depth of the next step at this batch size (advances that batch size's counter)."""
        step = self._steps.get(batch_size, 0)
        self._steps[batch_size] = step + 1
        return self._depth_at(step)


def request_outcome(
    num_scheduled: int, scheduled_drafts: Sequence[int], num_sampled: int | None, bonus: int = 1
) -> tuple[int, int, int]:
    """(drafted, accepted, prompt tokens) of one request in one step, counted as vLLM counts ``spec_decode_*``.

    ``num_scheduled``: tokens scheduled for the request; ``scheduled_drafts``: its draft token ids scheduled for
    verification (placeholders -1 are not drafts); ``num_sampled``: tokens it sampled (None: no sampler output for
    it); ``bonus``: tokens sampled per step without speculation (1). Accepted = sampled minus the bonus token, at most
    the drafts; prompt tokens = what was scheduled beyond the bonus token and the draft slots (prefill).

    Example: 4 tokens scheduled for 3 drafts, 3 sampled -> 3 drafted, 2 accepted, no prompt token::

        >>> request_outcome(4, [11, 12, 13], 3)
        (3, 2, 0)
        >>> request_outcome(40, [], None)  # prefill: all beyond the one sampled position counts as prompt
        (0, 0, 39)
    """
    drafted = sum(1 for t in scheduled_drafts if t >= 0)
    prompt_tokens = max(num_scheduled - bonus - len(scheduled_drafts), 0)
    accepted = 0
    if drafted and num_sampled is not None:
        accepted = min(max(num_sampled - bonus, 0), drafted)
    return drafted, accepted, prompt_tokens
