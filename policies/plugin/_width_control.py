"""The engine-core side of drafter-width control: the handshake with the workers at start-up, what each step tells
them (the drafting width's requests, off-steps), the draft fetch after a step (timed; skipped after an off-step),
and noticing that the workers stopped drafting the planned width (`check_drafts`).

See `policies.plugin.drafter_width` (the worker side) and `policies.plugin.drafting` (the pure helpers). vLLM objects
are read by duck typing; nothing here imports vLLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from policies.plugin.config import PluginConfig
from policies.plugin.drafting import (
    DraftFetchCost,
    HandshakeResult,
    drafting_requests,
    find_engine_executor,
    handshake,
    is_off_step,
    mark_drafting_requests,
    mark_off_step,
    wrap_draft_fetch,
)
from policies.plugin.prefix_guard import PrefixCacheGuard

__all__ = ["FETCH_CHECK_EVERY", "WidthControl"]

FETCH_CHECK_EVERY = 64
"""Off-steps between two draft fetches that check the workers still skip (`WidthControl.no_drafts_to_fetch`)."""


class WidthControl:
    """What the workers proved (`result`) and what the engine core does with it, per step."""

    def __init__(self) -> None:
        self.result = HandshakeResult.refused("not attempted")
        self.executor: Any = None  # vLLM's model executor (found for the handshake)
        self.guard: PrefixCacheGuard | None = None  # keeps blocks of prompts the drafter left out uncached
        self.skip = False  # off-steps skip the drafter (every worker proved it)
        self.off_step = False  # the step last scheduled skips the drafter (no drafts to fetch after it)
        self.fetch_skipped = False  # the executor's draft fetch returns None after an off-step
        self.fetch_cost = DraftFetchCost()  # what the fetch after a step adds to it (learnt by the controller)
        self.planned_width = 0  # drafting width sent with the last schedule() (drafts longer than it: fallback)
        self._off_steps_seen = 0
        self._drafting_for: Mapping[str, int] | None = None  # the depths `_drafting_set` was computed from
        self._drafting_set: frozenset[str] | None = None

    def handshake(self, config: PluginConfig, scheduler: Any, k: int) -> HandshakeResult:
        """Install the worker-side drafter-width patch in every worker (``collective_rpc``) and read what they
        prove; anything short of every worker answering gives trimming only."""
        if k == 0:
            result = HandshakeResult.refused("no speculative decoding configured", "no_speculation")
        elif not config.drafter_width_enabled:
            result = HandshakeResult.refused("drafter_width.enabled is false in the plugin config", "disabled")
        elif getattr(scheduler.vllm_config, "use_v2_model_runner", False):
            result = HandshakeResult.refused(
                "vLLM runs its V2 model runner, whose drafter the worker patch does not handle; start the engine "
                "with VLLM_USE_V2_MODEL_RUNNER=0 (policies.plugin.config.engine_env)", "v2_runner")
        else:
            self.executor = find_engine_executor()
            settings = config.drafter_width_settings()
            guard = PrefixCacheGuard.for_scheduler(scheduler) if settings.prefix_cache_guard else None
            if guard is None and settings.prefix_cache_guard:  # the workers read every prompt under prefix caching
                settings = dataclasses.replace(settings, prefix_cache_guard=False)
            result = handshake(self.executor, settings)
            # Only "catch_up" leaves prompts out of the drafter; with prefix caching off there is nothing to guard.
            self.guard = guard if result.off_steps == "catch_up" else None
        self.result = result
        return result

    def time_fetch(self, record: Callable[[float], None]) -> None:
        """Time the engine core's draft fetch after each step (``record(ms)``), skipped after an off-step when the
        workers skip the drafter (synchronous scheduling only)."""
        if self.executor is None:
            self.executor = find_engine_executor()
        timed = wrap_draft_fetch(self.executor, self.no_drafts_to_fetch if self.skip else None, record)
        self.fetch_skipped = self.skip and timed

    def no_drafts_to_fetch(self) -> bool:
        """The step just executed skipped the drafter, so there are no drafts to fetch from the workers. Every
        `FETCH_CHECK_EVERY`-th off-step fetches anyway: a worker whose patch failed drafts at full width, and the
        over-long drafts are what sends the plugin back to trimming (`check_drafts`)."""
        if not self.off_step:
            return False
        self._off_steps_seen += 1
        return self._off_steps_seen % FETCH_CHECK_EVERY != 0

    def mark(self, output: Any, requests: Mapping[str, Any], depths: Mapping[str, int], drafting: int) -> None:
        """Lower the step's drafting width to ``drafting`` and tell the workers which requests draft (and replay what
        they missed) in this step's drafter pass, or that the step skips the drafter."""
        output.num_spec_tokens_to_schedule = drafting
        # Sent to the workers when not all requests draft: the others leave their prompt tokens out of the pass.
        # None: every request.
        sent: frozenset[str] | None = None
        if self.skip:
            if drafting > 0 and depths is not self._drafting_for:
                self._drafting_for, self._drafting_set = depths, drafting_requests(depths)
            sent = self._drafting_set if drafting > 0 else frozenset()
            if self.guard is not None and sent is not None:
                # Blocks of prompts the drafter leaves out are evicted from the prefix cache, unless shared: the
                # drafter reads those, so the next request with the prefix finds them cached.
                shared = self.guard.settle(output, requests, sent)
                if shared:
                    sent = sent | shared
        self.off_step = self.skip and not sent and is_off_step(output, drafting, self.result)
        if self.off_step:
            mark_off_step(output, True)
        elif sent:
            mark_drafting_requests(output, sent)

    def check_drafts(self, drafts: list[list[int]], k: int) -> str | None:
        """Why the workers no longer draft the planned width (more drafts than planned), or None."""
        if self.planned_width < k:
            drafted = max(map(len, drafts), default=0)
            if drafted > self.planned_width:
                return f"the workers drafted {drafted} tokens per request where {self.planned_width} were planned"
        return None

    def info(self) -> dict[str, Any]:
        """The stats info's ``drafter_width`` section."""
        return {**self.result.info(), "skip_drafter": self.skip, "skip_fetch": self.fetch_skipped,
                "prefix_cache_guard": None if self.guard is None else self.guard.counters}
