"""Study summaries: counts and best values per study, computed from the trials table with the caller's directions.

The store does not know which way an objective is better (that is `autotune.search.Objective.directions`), so
callers say it: ``store.list_studies(directions={"output_tokens_per_s": "maximize", "tpot_ms_p99": "minimize"})``.
An objective without a direction gets no best value rather than a guessed one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from store import _validate as v
from store._models import TRIAL_STATUSES
from store._records import StudySummary
from store._rows import utc

Direction = Literal["maximize", "minimize"]
DIRECTIONS: tuple[Direction, ...] = ("maximize", "minimize")


def checked_directions(directions: Mapping[str, Direction] | None) -> dict[str, Direction]:
    """`directions` as a dict, each value checked to be "maximize" or "minimize" (`InvalidRecordError` otherwise)."""
    out = dict(directions or {})
    for objective, direction in out.items():
        v.choice(f"directions[{objective!r}]", direction, DIRECTIONS)
    return out


def study_summaries(rows: Sequence[Any], directions: Mapping[str, Direction]) -> list[StudySummary]:
    """One summary per study of `rows` (trials ordered by study, then number), most recently active first."""
    grouped: dict[str, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.study, []).append(row)
    summaries = [study_summary(study, trials, directions) for study, trials in grouped.items()]
    summaries.sort(key=lambda s: (s.last_created_at, s.study), reverse=True)
    return summaries


def study_summary(study: str, trials: Sequence[Any], directions: Mapping[str, Direction]) -> StudySummary:
    """The summary of one study's trials, given in trial-number order (rows with number, model, status, values and
    created_at).

    Best values count complete trials only; on a tie the earliest trial number keeps the best.
    """
    counts = {status: 0 for status in TRIAL_STATUSES}
    best_values: dict[str, float] = {}
    best_numbers: dict[str, int] = {}
    for trial in trials:
        counts[trial.status] += 1
        if trial.status != "complete":
            continue
        for objective, value in trial.values.items():
            if objective not in directions:
                continue
            sign = -1.0 if directions[objective] == "minimize" else 1.0
            if objective not in best_values or sign * value > sign * best_values[objective]:
                best_values[objective] = float(value)
                best_numbers[objective] = trial.number
    created = [utc(t.created_at) for t in trials]
    return StudySummary(
        study=study,
        models=tuple(sorted({t.model for t in trials})),
        n_trials=len(trials),
        n_complete=counts["complete"],
        n_failed=counts["failed"],
        n_pruned=counts["pruned"],
        n_running=counts["running"],
        best_values=best_values,
        best_trial_numbers=best_numbers,
        first_created_at=min(created),
        last_created_at=max(created),
    )
