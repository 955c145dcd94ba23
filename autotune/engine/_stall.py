"""A stall is a failure: an engine that makes no progress for too long during warm-up or a measured phase.

Progress is an engine step offline (each ``LLMEngine.step()`` that returns: ``LLM.generate`` loops on it,
vllm/entrypoints/common/offline.py:611, and it blocks in ``outputs_queue.get()`` while the engine core is stopped,
vllm/v1/engine/core_client.py:993) and a streamed chunk in serve mode. A launch idle for longer than the bound is
ended as ``stalled`` at once, instead of at the launch timeout; a measured class whose longest gap in progress
passed the bound (the watcher itself was stopped too) is not a measurement (`stall_in`).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

STALL_ENV = "PEAGLE_STALL_S"
"""Seconds without progress that make a stall (overrides the derived bound; tests set a few seconds)."""
STALL_MIN_S = 60.0
"""The bound is never below this: a loaded machine may pause one process for seconds (swap, CPU contention)."""
STALL_LOAD_FACTOR = 2.0
"""The derived bound is this many times the engine's load time (see `stall_bound`)."""
WATCHED_PHASES = ("warmup", "measure")
"""Phases whose progress is watched (loading has its own deadline: the launch timeout)."""
STALL_POLL_S = 0.5
"""How often the watcher looks at the time since the last progress."""


class EngineStalled(RuntimeError):
    """The engine made no progress (no step, no streamed chunk) for longer than the stall bound."""


STALLED = EngineStalled.__name__
"""The exception type name a launch reports when its engine stalled."""


def stall_bound(load_s: float, given: float | None = None, env: Mapping[str, str] = os.environ) -> float:
    """Seconds without progress that make a stall: `given` (the job's ``stall_s``), else ``PEAGLE_STALL_S``, else
    ``max(STALL_MIN_S, STALL_LOAD_FACTOR * load_s)``.

    Derivation: no step takes longer than one forward pass of the largest batch a step holds
    (``max_num_batched_tokens``), and loading the engine ran exactly that pass once (vLLM's ``profile_run`` with
    ``max_num_tokens``: vllm/v1/worker/gpu_worker.py:693, gpu_model_runner.py:6193; on CPU with compilation,
    cpu_model_runner.py:90), besides reading the weights. So a measured step longer than twice the load time is no
    step; the floor covers CPU eager engines, whose load runs no such pass. Example: a 40 s load gives 80 s.
    Raises ValueError naming the setting when it is not a positive number of seconds.
    """
    if given is None and env.get(STALL_ENV):
        try:
            given = float(env[STALL_ENV])
        except ValueError:
            raise ValueError(f"{STALL_ENV}={env[STALL_ENV]!r:.40} is not a number of seconds.") from None
    if given is not None:
        if not math.isfinite(given) or given <= 0:
            raise ValueError(f"The stall bound ({STALL_ENV}) must be a positive number of seconds, not {given!r}.")
        return float(given)
    return max(STALL_MIN_S, STALL_LOAD_FACTOR * float(load_s))


class Progress:
    """When a launch last made progress and its longest gap since `mark` (call `tick` from any thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last = clock()
        self.longest = 0.0
        self._paused = 0

    def mark(self) -> None:
        """Start a new stretch (a phase or a measured class): its gaps count from now."""
        self.last = self._clock()
        self.longest = 0.0

    def tick(self) -> None:
        """One unit of progress (an engine step, a streamed chunk)."""
        now = self._clock()
        self.longest = max(self.longest, now - self.last)
        self.last = now

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """A wait that is no stall (a profiling turn waiting for the other engine): not counted as idle."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self.last = self._clock()

    def idle_s(self) -> float:
        """Seconds since the last progress (or the last `mark`); 0 while `paused`."""
        return 0.0 if self._paused else self._clock() - self.last

    def gap_s(self) -> float:
        """The longest stretch without progress since `mark`, the one still open included."""
        return max(self.longest, self.idle_s())


def stall_message(phase: str, idle_s: float, bound_s: float, launch: str) -> str:
    """One line: how long the engine made no progress, in which phase of which launch, and the bound.

    Example: "no progress (no engine step, no token) for 12 s during measure (worker pid 4242); the stall bound is
    10 s (PEAGLE_STALL_S, else twice the engine's load time, at least 60 s)".
    """
    return (
        f"no progress (no engine step, no token) for {idle_s:.0f} s during {phase} ({launch}); the stall bound is "
        f"{bound_s:g} s ({STALL_ENV}, else twice the engine's load time, at least {STALL_MIN_S:g} s)"
    )


def stall_in(raw: Mapping[str, Any]) -> str | None:
    """Why a finished report ``raw`` (``{"stall_s", "classes": {class: {"max_gap_s", ...}}}``) is no measurement:
    a class whose longest gap in progress passed the bound (the watcher was stopped with the engine, or woke too
    late), or None. Example: ``{"stall_s": 60, "classes": {"a": {"max_gap_s": 180.2}}}`` -> "no progress ...
    for 180 s during measure (class 'a'); ..."."""
    bound = raw.get("stall_s")
    if not isinstance(bound, int | float):
        return None
    for name, entry in (raw.get("classes") or {}).items():
        gap = entry.get("max_gap_s") if isinstance(entry, Mapping) else None
        if isinstance(gap, int | float) and gap > bound:
            return stall_message("measure", gap, bound, f"class {name!r}")
    return None


def watch_engine_steps(llm: Any, progress: Progress) -> None:
    """Tick `progress` after every ``LLMEngine.step()`` of ``llm`` (a ``vllm.LLM``; wraps the instance's method)."""
    engine = getattr(llm, "llm_engine", None)
    step = getattr(engine, "step", None)
    if engine is None or step is None:
        return

    def counted_step(*args: Any, **kwargs: Any) -> Any:
        out = step(*args, **kwargs)
        progress.tick()
        return out

    engine.step = counted_step


def start_stall_watch(
    progress: Progress,
    bound_s: float,
    phase: Callable[[], str],
    on_stall: Callable[[str], None],
    launch: str,
    poll_s: float = STALL_POLL_S,
) -> threading.Thread:
    """Call ``on_stall(one line)`` once, from a daemon thread, when `progress` has been idle for more than
    `bound_s` in one of `WATCHED_PHASES` (time in another phase, and before the phase began, does not count)."""

    def watch() -> None:
        current, since = phase(), time.monotonic()
        while True:
            time.sleep(poll_s)
            now_phase = phase()
            if now_phase != current:
                current, since = now_phase, time.monotonic()
            if current not in WATCHED_PHASES:
                continue
            idle = min(progress.idle_s(), time.monotonic() - since)
            if idle > bound_s:
                on_stall(stall_message(current, idle, bound_s, launch))
                return

    thread = threading.Thread(target=watch, name="peagle-stall-watch", daemon=True)
    thread.start()
    return thread
