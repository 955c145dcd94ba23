"""Progress of long work on stderr: one live line per engine launch (what, phase, elapsed, ETA).

Shown only in a terminal and never with ``--json``: piped or captured output stays free of progress lines (and of
the blank lines a live display leaves behind). The line comes from `autotune.engine.observe_launches`, so every
launch is covered wherever it happens (a trial, a profiling run, a model-guided profile).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Callable, Iterator

from rich.console import Console, RenderableType
from rich.progress import Progress
from rich.text import Text

from autotune.engine import LaunchEvent, observe_launches


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` past an hour)."""
    s = max(int(round(seconds)), 0)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class LaunchLine:
    """Turns launch events into one progress line, with an ETA from the launches of the same kind that finished
    before (their median duration; ``ETA ?`` for the first of its kind)."""

    def __init__(self) -> None:
        self.durations: dict[str, list[float]] = {}
        self.count = 0
        self._lock = threading.Lock()

    def update(self, event: LaunchEvent) -> str | None:
        """The line for `event`; None when the launch ended (the caller clears the line)."""
        with self._lock:
            if event.kind == "start":
                self.count += 1
            if event.kind == "end":
                self.durations.setdefault(event.what, []).append(event.elapsed_s)
                return None
            past = self.durations.get(event.what)
            if past:
                left = statistics.median(past) - event.elapsed_s
                eta = f"ETA ~{clock(left)}" if left >= 1 else "ETA any moment"
            else:
                eta = f"ETA ? (first {event.what}; gives up after {clock(event.timeout_s)})"
            return (f"engine launch {self.count} ({event.what}): {event.phase}, {clock(event.elapsed_s)} elapsed, "
                    f"{eta}")


class ProgressWithLaunch(Progress):
    """A rich progress display with the engine launch under way on its own line below the bars."""

    launch_line: str = ""

    def get_renderables(self) -> Iterator[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.launch_line:
            yield Text(f"  {self.launch_line}", no_wrap=True, overflow="ellipsis")


@contextlib.contextmanager
def launch_progress(console: Console, *, enabled: bool, show: Callable[[str | None], None] | None = None
                    ) -> Iterator[LaunchLine | None]:
    """Show each engine launch made inside the block as a live line on `console` (stderr).

    `show` receives each line (None when a launch ends) to place it in an existing live display (search's progress
    bar); without it the line is a rich status spinner. Nothing happens unless `enabled` and `console` is a
    terminal.
    """
    if not enabled or not console.is_terminal:
        yield None
        return
    line = LaunchLine()
    if show is not None:

        def observe(event: LaunchEvent) -> None:
            show(line.update(event))

        with observe_launches(observe):
            yield line
        return
    status = console.status("", spinner="dots")
    lock = threading.Lock()

    def observe_status(event: LaunchEvent) -> None:
        text = line.update(event)
        with lock:
            if text is None:
                status.stop()
            else:
                status.update(text)
                status.start()

    try:
        with observe_launches(observe_status):
            yield line
    finally:
        status.stop()
