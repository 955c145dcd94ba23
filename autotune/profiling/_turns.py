"""Two profile launches side by side, taking turns phase by phase (files in a private directory).

Why: the cost model compares steps of the no-speculation launch with steps of the speculative one (the baseline,
and what a skipped drafter costs). Launched one after the other, the two are minutes apart, and a shared machine's
speed drifts over minutes: on a shared 2-core machine the drafter-off steps of a speculative launch took 6.13 ms at
batch 1 against 4.52 ms in the no-speculation launch minutes before it, while with both engines resident and
interleaved the difference was at most ~0.4 ms. Taking turns puts both launches' phase n seconds apart. It needs both
engines in memory at once: fine for a small model on a CPU, not for a large model on one GPU.

The parent (`take_turns`) and the workers (`Turns`) talk through empty files in a directory only the user can
read (``tempfile.mkdtemp``): ``<name>-ready`` (warm-up done), ``<name>-go-<n>`` (run phase n), ``<name>-done-<n>``
and ``abort`` (the other launch failed: stop).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_S = 0.02
SETTLE_S = 1.5
"""Seconds between one launch's phase and the other's: vLLM's shared-memory readers busy-poll for 1 s after their
last read (``SpinCondition.busy_loop_s``), so the engine that just ran still takes a core that long."""
ABORT = "abort"


class TurnAborted(RuntimeError):
    """The launch this one takes turns with failed."""


def turn_order(names: Sequence[str], phases: int) -> list[tuple[int, str]]:
    """(phase, launch) in the order the launches take turns: phase by phase, the first launch first in even phases and
    last in odd ones (A B B A A B ...), so a drift that is linear over the run falls on both alike.

    Example: ``turn_order(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]``.
    """
    order: list[tuple[int, str]] = []
    for n in range(phases):
        order += [(n, name) for name in (names if n % 2 == 0 else list(reversed(names)))]
    return order


@dataclass(frozen=True)
class Turns:
    """The worker's side: one launch's name in the shared turns directory."""

    dir: Path
    name: str
    parent: int | None = None
    """The process that started this launch: gone (this process re-parented), the launch stops waiting."""

    @classmethod
    def from_job(cls, raw: Mapping[str, Any] | None) -> Turns | None:
        if not raw:
            return None
        return cls(Path(str(raw["dir"])), str(raw["name"]), os.getppid())

    def to_job(self) -> dict[str, str]:
        return {"dir": str(self.dir), "name": self.name}

    def _path(self, what: str) -> Path:
        return self.dir / f"{self.name}-{what}"

    def ready(self) -> None:
        self._path("ready").touch()

    def wait_go(self, phase: int) -> None:
        """Block until the parent says phase ``phase`` may run; TurnAborted if the other launch failed."""
        go = self._path(f"go-{phase}")
        while not go.exists():
            if (self.dir / ABORT).exists():
                raise TurnAborted("the launch this one takes turns with failed; stopping (see the other's log)")
            if self.parent is not None and os.getppid() != self.parent:
                raise TurnAborted("the profile that started this launch is gone; stopping")
            time.sleep(POLL_S)

    def done(self, phase: int) -> None:
        self._path(f"done-{phase}").touch()


def take_turns(
    turns_dir: Path, names: Sequence[str], phases: int, alive: Callable[[str], bool], settle_s: float = SETTLE_S
) -> str | None:
    """The parent's side: let the launches ``names`` run their phases in `turn_order`, one at a time. ``alive(name)``
    says whether that launch still runs (its process has not ended). Returns None when every turn was taken, else the
    name of the launch that ended before its turn was done, after writing ``abort`` so the others stop instead of
    waiting forever (also when this function is interrupted)."""

    def ended(path: Path, name: str) -> bool:
        while not path.exists():
            if not alive(name):
                return not path.exists()
            time.sleep(POLL_S)
        return False

    finished = False
    try:
        for name in names:
            if ended(turns_dir / f"{name}-ready", name):
                return name
        for phase, name in turn_order(names, phases):
            time.sleep(settle_s)
            (turns_dir / f"{name}-go-{phase}").touch()
            if ended(turns_dir / f"{name}-done-{phase}", name):
                return name
        finished = True
        return None
    finally:
        if not finished:
            (turns_dir / ABORT).touch()
