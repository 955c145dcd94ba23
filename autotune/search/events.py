"""Progress of a search, for progress bars: one event when a scenario's study starts, after each trial this worker
finishes, and at the end. Counts cover every worker of the study."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from autotune.spec import SpecConfig

EventKind = Literal["start", "trial", "end"]


@dataclass(frozen=True)
class SearchEvent:
    """Progress of one scenario's study. Counts cover every worker of the study."""

    kind: EventKind
    study: str
    target: int
    done: int
    """Finished trials counted against the target."""
    complete: int
    failed: int
    pruned: int
    running: int
    """Trials in flight on other workers."""
    trial_state: str | None = None
    """This worker's last trial: complete, failed or duplicate (a config already measured: not re-run)."""
    config: SpecConfig | None = None

    @classmethod
    def of(
        cls,
        kind: EventKind,
        study: str,
        target: int,
        counts: Mapping[str, int],
        done: int | None = None,
        trial_state: str | None = None,
        config: SpecConfig | None = None,
    ) -> SearchEvent:
        """An event from state counts (`trials.state_counts`); `done` defaults to every finished trial."""
        if done is None:
            done = counts["complete"] + counts["failed"] + counts["pruned"]
        return cls(kind, study, target, done, counts["complete"], counts["failed"], counts["pruned"],
                   counts["running"], trial_state, config)


EventCallback = Callable[[SearchEvent], None]
