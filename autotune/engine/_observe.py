"""Watching engine launches from the parent: who wants to hear about each launch (the CLI's progress line).

`run_worker` and `run_serve` wrap every launch in `watch_launch`: observers registered with `observe_launches` get
a `LaunchEvent` when it starts, about once a second while it runs (with the last phase the engine announced in its
log, e.g. ``load``, ``warmup``, ``measure``) and when it ends. With no observer nothing is read or started; an
observer that raises is dropped for the rest of the launch and never disturbs it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autotune.engine._failures import phase_marks

log = logging.getLogger(__name__)

#: Seconds between two "tick" events of a running launch.
TICK_S = 1.0


@dataclass(frozen=True)
class LaunchEvent:
    """One moment of an engine launch, as an observer sees it."""

    kind: Literal["start", "tick", "end"]
    what: str
    """What the launch is for: "measurement" (a trial), "serve measurement", "profiling run", ..."""
    phase: str
    """The last phase the engine announced ("start" until it announces one)."""
    elapsed_s: float
    timeout_s: float
    """The launch's deadline, seconds after its start."""
    ok: bool | None = None
    """Set on "end": the launch produced a result."""


LaunchObserver = Callable[[LaunchEvent], None]
_observers: list[LaunchObserver] = []
_lock = threading.Lock()


@contextlib.contextmanager
def observe_launches(observer: LaunchObserver) -> Iterator[None]:
    """Call `observer` with every `LaunchEvent` of the launches made inside the ``with`` block (any thread)."""
    with _lock:
        _observers.append(observer)
    try:
        yield
    finally:
        with _lock:
            _observers.remove(observer)


class _Phase:
    """The last phase mark (``[peagle-worker] phase=...``, ``[peagle-serve] phase=...``) of a growing log, read
    incrementally (never the whole log twice)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.phase = "start"
        self._rest = b""

    def read(self) -> str:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self.phase
        self.offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        marks = phase_marks(b"\n".join(lines).decode(errors="replace"))
        if marks:
            self.phase = marks[-1]
        return self.phase


@contextlib.contextmanager
def watch_launch(what: str, log_path: Path, timeout_s: float) -> Iterator[dict[str, bool]]:
    """Report the launch made inside the block to the observers; the block sets ``outcome["ok"]`` when it has a
    result. Does nothing when no observer is registered."""
    outcome = {"ok": False}
    with _lock:
        observers = list(_observers)
    if not observers:
        yield outcome
        return
    started = time.monotonic()
    phase = _Phase(log_path)
    stop = threading.Event()

    def emit(kind: Literal["start", "tick", "end"], ok: bool | None = None) -> None:
        event = LaunchEvent(kind, what, phase.read(), time.monotonic() - started, timeout_s, ok)
        for observer in list(observers):
            try:
                observer(event)
            except Exception as exc:  # a broken progress display must not break a measurement
                log.warning("launch observer %r failed (%s); it is dropped for this launch", observer, exc)
                observers.remove(observer)

    def ticker() -> None:
        while not stop.wait(TICK_S):
            emit("tick")

    emit("start")
    thread = threading.Thread(target=ticker, name="peagle-launch-watch", daemon=True)
    thread.start()
    try:
        yield outcome
    finally:
        stop.set()
        thread.join()
        emit("end", outcome["ok"])
